"""Builds one Responses API response from chat completion deltas: the events a streaming client is owed for each
delta (`response.created`, `response.output_item.added`, `response.output_text.delta`, ...,
`response.completed`), each with its `sequence_number`, and the whole `Response` they add up to. A whole
(non-streamed) answer goes through the same builder as one delta, so both views always agree.

Output items, in the order the model produced them: `reasoning` (vLLM's `reasoning_content`), `message` (its
text, one `output_text` part), and one `function_call` (or `custom_tool_call`, for a freeform tool) per tool call.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import orjson

from agl_lite.store.records import RESPONSE_ID_PREFIX
from agl_lite.translate import new_id
from agl_lite.translate.responses.request import CUSTOM_INPUT, Translated

__all__ = ["ResponseBuilder", "new_response_id", "usage_of"]


Event = dict[str, Any]


def new_response_id() -> str:
    return new_id(RESPONSE_ID_PREFIX)


def usage_of(chat_usage: Any) -> dict[str, Any] | None:
    """A chat `usage` as the Responses API counts it."""
    if not isinstance(chat_usage, dict):
        return None
    prompt = chat_usage.get("prompt_tokens") or 0
    completion = chat_usage.get("completion_tokens") or 0
    cached = (chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    reasoning = (chat_usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": chat_usage.get("total_tokens") or prompt + completion,
    }


class _Item:
    __slots__ = ("call_id", "id", "index", "kind", "name", "namespace", "pieces")

    def __init__(
        self, kind: str, index: int, name: str = "", call_id: str = "", namespace: str | None = None
    ) -> None:
        self.kind = kind
        self.index = index
        self.id = new_id({"message": "msg_", "reasoning": "rs_"}.get(kind, "fc_"))
        self.name = name
        self.call_id = call_id
        self.namespace = namespace
        self.pieces: list[str] = []

    def whole(self, status: str) -> dict[str, Any]:
        text = "".join(self.pieces)
        if self.kind == "message":
            part = {"type": "output_text", "text": text, "annotations": []}
            return {
                "type": "message",
                "id": self.id,
                "role": "assistant",
                "status": status,
                "content": [part],
            }
        if self.kind == "reasoning":
            return {"type": "reasoning", "id": self.id, "summary": [], "content": [_reasoning_part(text)]}
        call = {"id": self.id, "call_id": self.call_id, "name": self.name, "status": status}
        if self.namespace is not None:
            call["namespace"] = self.namespace
        if self.kind == "custom_tool_call":
            return {"type": "custom_tool_call", **call, "input": _custom_input(text)}
        return {"type": "function_call", **call, "arguments": text}


def _reasoning_part(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


def _custom_input(arguments: str) -> str:
    """A freeform tool's input out of the chat function's arguments (`{"input": "..."}`); arguments that are not
    that object are given as they are (the record keeps the upstream's raw arguments)."""
    try:
        obj = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments
    value = obj.get(CUSTOM_INPUT) if isinstance(obj, dict) else None
    return value if isinstance(value, str) else arguments


class ResponseBuilder:
    """One response: feed it deltas in order, take the events each returns, then `finish` (or `fail`)."""

    def __init__(self, request: Translated, model: str, response_id: str | None = None) -> None:
        self.request = request
        self.model = model
        self.id = response_id or new_response_id()
        self.created_at = int(time.time())
        self.items: list[_Item] = []
        self._open: _Item | None = None  # the message or reasoning item deltas go to
        self._calls: dict[int, _Item] = {}  # tool calls by their chat index
        self._seq = itertools.count()
        self.status = "in_progress"
        self.usage: dict[str, Any] | None = None
        self.error: dict[str, Any] | None = None
        self.incomplete: dict[str, Any] | None = None

    # --- the whole response ----------------------------------------------------------------------------------

    def response(self) -> dict[str, Any]:
        """The Response as it stands (`status` says whether it is done)."""
        done = self.status != "in_progress"
        item_status = "incomplete" if self.status == "incomplete" else "completed"
        echo = self.request.echo
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": self.status,
            "model": self.model,
            "output": [item.whole(item_status) for item in self.items] if done else [],
            "usage": self.usage,
            "error": self.error,
            "incomplete_details": self.incomplete,
            "instructions": echo.get("instructions"),
            "tools": echo.get("tools", []),
            "tool_choice": echo.get("tool_choice") or "auto",
            "parallel_tool_calls": echo.get("parallel_tool_calls", True),
            "temperature": echo.get("temperature"),
            "top_p": echo.get("top_p"),
            "max_output_tokens": echo.get("max_output_tokens"),
            "metadata": echo.get("metadata"),
            "previous_response_id": echo.get("previous_response_id"),
            **{k: echo[k] for k in ("store", "text", "reasoning") if k in echo},
        }

    # --- deltas ------------------------------------------------------------------------------------------------

    def start(self) -> list[Event]:
        response = self.response()  # (the same one, twice: built once)
        return [
            self._event("response.created", response=response),
            self._event("response.in_progress", response=response),
        ]

    def text(self, piece: str, logprobs: list[dict[str, Any]] | None = None) -> list[Event]:
        wanted = (logprobs or []) if self.request.logprobs else []
        return self._piece("message", "response.output_text.delta", piece, logprobs=wanted)

    def reasoning(self, piece: str) -> list[Event]:
        return self._piece("reasoning", "response.reasoning_text.delta", piece)

    def _piece(self, kind: str, event: str, piece: str, **extra: Any) -> list[Event]:
        """A piece of the open message (or reasoning) item, opened first (and the other one closed) if need be."""
        events = self._switch(kind)
        item = self._open
        assert item is not None
        item.pieces.append(piece)
        at = {"item_id": item.id, "output_index": item.index, "content_index": 0}
        events.append(self._event(event, **at, delta=piece, **extra))
        return events

    def tool_call(self, index: int, call_id: str | None, name: str | None, arguments: str) -> list[Event]:
        """A tool call's delta (chat `tool_calls[i]`): its first names it, the rest add to its arguments."""
        events: list[Event] = []
        item = self._calls.get(index)
        if item is None:
            events += self._close_open()
            name = name or ""
            kind = "custom_tool_call" if name in self.request.custom_tools else "function_call"
            space, own = self.request.namespaced.get(name, (None, name))
            item = _Item(kind, len(self.items), own, call_id or new_id("call_"), space)
            self._calls[index] = item
            self.items.append(item)
            added = item.whole("in_progress")
            added["input" if kind == "custom_tool_call" else "arguments"] = ""
            events.append(self._event("response.output_item.added", output_index=item.index, item=added))
        if arguments:
            item.pieces.append(arguments)
            if item.kind == "function_call":
                events.append(
                    self._event(
                        "response.function_call_arguments.delta",
                        item_id=item.id,
                        output_index=item.index,
                        delta=arguments,
                    )
                )
            # a freeform tool's input is known once its JSON wrapper is whole: given at its end
        return events

    # --- the end -------------------------------------------------------------------------------------------------

    def finish(self, finish_reason: str | None, chat_usage: Any) -> list[Event]:
        """The end of the answer: every item closed, then `response.completed` (or `.incomplete` when the answer
        was cut at `max_output_tokens`)."""
        self.usage = usage_of(chat_usage)
        cut = finish_reason == "length"
        status = "incomplete" if cut else "completed"
        events = self._close_open(status)
        for item in self._calls.values():
            events += self._close_call(item, status)
        self.status = status
        if cut:
            self.incomplete = {"reason": "max_output_tokens"}
        events.append(self._event(f"response.{status}", response=self.response()))
        return events

    def whole(self, chat: dict[str, Any]) -> dict[str, Any]:
        """A whole chat completion (choice 0) as the Response, built as its stream would be."""
        choice: dict[str, Any] = next(
            (c for c in chat.get("choices") or () if isinstance(c, dict) and c.get("index", 0) == 0), {}
        )
        message, logprobs = choice.get("message"), choice.get("logprobs")
        self.delta(
            message if isinstance(message, dict) else {},
            logprobs.get("content") if isinstance(logprobs, dict) else None,
        )
        self.finish(choice.get("finish_reason"), chat.get("usage"))
        return self.response()

    def delta(self, delta: dict[str, Any], logprobs: Any = None) -> list[Event]:
        """The events of one chat delta (or whole message): reasoning, then text, then tool calls."""
        events: list[Event] = []
        reasoning = delta.get("reasoning") or delta.get("reasoning_content")  # vLLM's new name, then its old
        if isinstance(reasoning, str) and reasoning:
            events += self.reasoning(reasoning)
        content = delta.get("content")
        if isinstance(content, str) and content:
            events += self.text(content, logprobs if isinstance(logprobs, list) else None)
        for i, call in enumerate(delta.get("tool_calls") or ()):
            if not isinstance(call, dict):
                continue
            fn: dict[str, Any] = call["function"] if isinstance(call.get("function"), dict) else {}
            index = call.get("index", i)
            arguments = fn.get("arguments")
            events += self.tool_call(
                index if isinstance(index, int) else i,
                call.get("id") if isinstance(call.get("id"), str) else None,
                fn.get("name") if isinstance(fn.get("name"), str) else None,
                arguments if isinstance(arguments, str) else "",
            )
        return events

    def fail(self, message: str, code: str = "server_error") -> list[Event]:
        """The answer cannot be finished (the upstream failed mid-stream): `response.failed`."""
        self.status, self.error = "failed", {"code": code, "message": message}
        return [self._event("response.failed", response=self.response())]

    # --- internals -------------------------------------------------------------------------------------------

    def _event(self, kind: str, **fields: Any) -> Event:
        return {"type": kind, "sequence_number": next(self._seq), **fields}

    def _switch(self, kind: str) -> list[Event]:
        """Open an item of `kind` for the next delta unless one is open, closing the other one first."""
        if self._open is not None and self._open.kind == kind:
            return []
        events = self._close_open()
        item = _Item(kind, len(self.items))
        self.items.append(item)
        self._open = item
        added = item.whole("in_progress")
        if kind == "message":
            added["content"] = []
            part = {"type": "output_text", "text": "", "annotations": []}
        else:
            added["content"] = []
            part = _reasoning_part("")
        events.append(self._event("response.output_item.added", output_index=item.index, item=added))
        events.append(
            self._event(
                "response.content_part.added",
                item_id=item.id,
                output_index=item.index,
                content_index=0,
                part=part,
            )
        )
        return events

    def _close_open(self, status: str = "completed") -> list[Event]:
        item, self._open = self._open, None
        if item is None:
            return []
        text = "".join(item.pieces)
        at = {"item_id": item.id, "output_index": item.index, "content_index": 0}
        if item.kind == "message":
            part = {"type": "output_text", "text": text, "annotations": []}
            done = [self._event("response.output_text.done", **at, text=text, logprobs=[])]
        else:
            part = _reasoning_part(text)
            done = [self._event("response.reasoning_text.done", **at, text=text)]
        done.append(self._event("response.content_part.done", **at, part=part))
        done.append(
            self._event("response.output_item.done", output_index=item.index, item=item.whole(status))
        )
        return done

    def _close_call(self, item: _Item, status: str) -> list[Event]:
        whole = item.whole(status)
        at = {"item_id": item.id, "output_index": item.index}
        if item.kind == "custom_tool_call":
            events = [
                self._event("response.custom_tool_call_input.delta", **at, delta=whole["input"]),
                self._event("response.custom_tool_call_input.done", **at, input=whole["input"]),
            ]
        else:
            events = [
                self._event("response.function_call_arguments.done", **at, arguments=whole["arguments"])
            ]
        events.append(self._event("response.output_item.done", output_index=item.index, item=whole))
        return events
