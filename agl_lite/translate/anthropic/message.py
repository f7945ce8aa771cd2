"""Builds one Anthropic message from chat completion deltas: the event stream a client is owed for each delta
(`message_start`, `ping`, `content_block_start/delta/stop`, `message_delta`, `message_stop`) and the whole message
they add up to. Whole (non-streamed) responses go through the same builder, so both views always agree.
"""

from __future__ import annotations

from typing import Any

import orjson

from agl_lite.translate import new_id
from agl_lite.translate.anthropic.errors import error_event

__all__ = ["MessageBuilder", "new_message_id", "stop_reason"]

_FINISH = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use"}


def new_message_id() -> str:
    return new_id("msg_")


def stop_reason(finish: str | None, matched: Any, tool_use: bool) -> tuple[str, str | None]:
    """Anthropic's (stop_reason, stop_sequence) for a chat finish_reason and vLLM's `stop_reason` (the stop string
    that matched, or a stop token id)."""
    if finish == "stop" and isinstance(matched, str):
        return "stop_sequence", matched
    if tool_use and finish in ("stop", "tool_calls", None):
        return "tool_use", None
    # the upstream's finish_reason is data too: only a string can be looked up
    return _FINISH.get(finish if isinstance(finish, str) and finish else "stop", "end_turn"), None


class _Block:
    __slots__ = ("id", "input", "kind", "name", "pieces")

    def __init__(self, kind: str, block_id: str = "", name: str = "") -> None:
        self.kind = kind
        self.id = block_id
        self.name = name
        self.pieces: list[str] = []
        self.input: dict[str, Any] | None = None
        """A tool call's input as its client was given it, once its block closed."""

    def start(self) -> dict[str, Any]:
        if self.kind == "text":
            return {"type": "text", "text": ""}
        if self.kind == "thinking":
            return {"type": "thinking", "thinking": "", "signature": ""}
        return {"type": "tool_use", "id": self.id, "name": self.name, "input": {}}

    def delta(self, piece: str) -> dict[str, Any]:
        if self.kind == "text":
            return {"type": "text_delta", "text": piece}
        if self.kind == "thinking":
            return {"type": "thinking_delta", "thinking": piece}
        return {"type": "input_json_delta", "partial_json": piece}

    def whole(self) -> dict[str, Any]:
        joined = "".join(self.pieces)
        if self.kind == "text":
            return {"type": "text", "text": joined}
        if self.kind == "thinking":
            return {"type": "thinking", "thinking": joined, "signature": ""}
        tool_input = self.input if self.input is not None else _tool_input(joined)
        return {"type": "tool_use", "id": self.id, "name": self.name, "input": tool_input}


def _tool_input(arguments: str) -> dict[str, Any]:
    """A tool call's arguments as the object Anthropic promises; arguments that are no JSON object become {}
    (the record keeps the upstream's raw arguments)."""
    if not arguments.strip():
        return {}
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


class MessageBuilder:
    """Feed it one choice's deltas in order; `take()` returns the encoded events owed so far (with `emit=False`,
    none are encoded: the whole-body path wants only `message()`)."""

    def __init__(self, message_id: str, model: str, *, emit: bool = True) -> None:
        self.id = message_id
        self.model = model
        self.emit = emit
        self.started = False
        self.ended = False
        self.failed = False
        self.input_tokens = 0
        self.output_tokens = 0
        self.finish: str | None = None
        self.matched: Any = None
        self._blocks: list[_Block] = []
        self._open: _Block | None = None
        self._tools: dict[int, _Block] = {}
        self._out: list[bytes] = []

    def take(self) -> bytes:
        out = b"".join(self._out)
        self._out.clear()
        return out

    def _event(self, name: str, data: dict[str, Any]) -> None:
        if self.emit:
            self._out.append(b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n")

    # --- deltas ------------------------------------------------------------------------------------------------

    def start(self, model: str | None = None, input_tokens: int | None = None) -> None:
        """`message_start` (then a `ping`, as Anthropic's own streams begin); later calls change nothing."""
        if self.started:
            return
        self.started = True
        if model:
            self.model = model
        if input_tokens is not None:
            self.input_tokens = input_tokens
        self._event("message_start", {"type": "message_start", "message": self._envelope([], None, None)})
        self._event("ping", {"type": "ping"})

    def text(self, piece: str) -> None:
        self._piece("text", piece)

    def thinking(self, piece: str) -> None:
        self._piece("thinking", piece)

    def tool(self, index: int, call_id: Any, name: Any, arguments: Any) -> None:
        """One streamed tool-call delta (chat's `tool_calls[i]`): a new index opens a `tool_use` block.

        Its arguments are held until the block closes and then go out as one `input_json_delta` holding the JSON
        object they parse to (`{}` when they are not one): a model may write a string, an array or broken JSON,
        which Anthropic's SDKs cannot take as a tool's input, and the whole message must say the same. Arguments
        that come after the block closed (parallel calls interleaved) change neither."""
        self.start()
        block = self._tools.get(index)
        if block is None:
            block_id = call_id if isinstance(call_id, str) and call_id else new_id("toolu_")
            block = self._tools[index] = _Block("tool", block_id, name if isinstance(name, str) else "")
            self._open_block(block)
        if isinstance(arguments, str) and arguments and block.input is None:
            block.pieces.append(arguments)

    def finished(self, finish: str | None, matched: Any = None) -> None:
        """The choice's finish_reason: its last block is complete (`content_block_stop` goes out now)."""
        self.finish, self.matched = finish, matched
        self._close()

    def usage(self, prompt: Any, completion: Any) -> None:
        if isinstance(prompt, int):
            self.input_tokens = prompt
        if isinstance(completion, int):
            self.output_tokens = completion

    def end(self) -> None:
        """`message_delta` with the stop reason and the cumulative usage, then `message_stop`."""
        if self.ended or self.failed:
            return
        self.start()
        self._close()
        self.ended = True
        reason, sequence = self._stop()
        delta = {"stop_reason": reason, "stop_sequence": sequence}
        self._event("message_delta", {"type": "message_delta", "delta": delta, "usage": self._usage()})
        self._event("message_stop", {"type": "message_stop"})

    def fail(self, status: int, message: str) -> None:
        """An `event: error`; the stream owes nothing after it."""
        if self.ended or self.failed:
            return
        self.failed = True
        if self.emit:
            self._out.append(error_event(status, message))

    # --- the whole message -------------------------------------------------------------------------------------

    def message(self) -> dict[str, Any]:
        """The message the events so far add up to (stop_reason None until the end)."""
        reason, sequence = self._stop() if self.ended else (None, None)
        return self._envelope([b.whole() for b in self._blocks], reason, sequence)

    def _envelope(self, content: list[Any], reason: str | None, sequence: str | None) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": self._usage(),
        }

    def _usage(self) -> dict[str, int]:
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}

    def _stop(self) -> tuple[str, str | None]:
        return stop_reason(self.finish, self.matched, bool(self._tools))

    # --- blocks ------------------------------------------------------------------------------------------------

    def _piece(self, kind: str, piece: str) -> None:
        if not piece:
            return
        self.start()
        block = self._open
        if block is None or block.kind != kind:
            block = _Block(kind)
            self._open_block(block)
        block.pieces.append(piece)
        self._event("content_block_delta", self._delta(block, piece))

    def _open_block(self, block: _Block) -> None:
        self._close()
        self._blocks.append(block)
        self._open = block
        start = {
            "type": "content_block_start",
            "index": len(self._blocks) - 1,
            "content_block": block.start(),
        }
        self._event("content_block_start", start)

    def _delta(self, block: _Block, piece: str) -> dict[str, Any]:
        # An index, not "the open block": a tool call's late argument delta still names its own block.
        index = self._blocks.index(block) if block is not self._open else len(self._blocks) - 1
        return {"type": "content_block_delta", "index": index, "delta": block.delta(piece)}

    def _close(self) -> None:
        block = self._open
        if block is not None:
            index = len(self._blocks) - 1
            if block.kind == "tool":
                block.input = _tool_input("".join(block.pieces))
                if block.input:
                    delta = {"type": "input_json_delta", "partial_json": orjson.dumps(block.input).decode()}
                    self._event(
                        "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
                    )
            self._event("content_block_stop", {"type": "content_block_stop", "index": index})
            self._open = None
