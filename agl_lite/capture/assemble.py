"""Turns the upstream bytes of one LLM call into choices, token ids, logprobs, usage and how the response ended.

`Collector.feed` is the tap: it only keeps the chunks. Decoding happens in big batches, one `orjson.loads` over a
JSON array of the batch's data payloads: at the end, or each time a long stream has buffered `COMPACT_BYTES`, so
memory stays bounded while ids are held packed (`array`). It must not touch the flow or decide the outcome.
"""

from __future__ import annotations

import math
import re
from array import array
from typing import Any

import orjson

from agl_lite.capture.native import text_runs
from agl_lite.core.sse import BOM, SSEParser
from agl_lite.store.records import ChoiceRecord

__all__ = ["COMPACT_BYTES", "Assembly", "Collector", "error_message"]

COMPACT_BYTES = 256 * 1024
"""A stream's buffered bytes that trigger a batch decode of its complete events (long generations only)."""

_DATA = re.compile(rb"^data: ?(.*)", re.M)
_DONE = re.compile(rb"^data: ?\[DONE\]", re.M)
_DELTA_TEXT = b'{"index":0,"delta":{"content":"'
"""After `"choices":[`: a text delta of the one choice."""
_HEAD_KEYS = {"id", "object", "created", "model"}


def error_message(err: Any) -> str:
    """The human message of an OpenAI-style `error` member (an object or a bare string)."""
    if isinstance(err, dict):
        msg = err.get("message")
        kind = err.get("type")
        text = msg if isinstance(msg, str) else orjson.dumps(err).decode()
        return f"{kind}: {text}" if isinstance(kind, str) and kind else text
    return str(err)


class _Choice:
    __slots__ = ("finish_reason", "ids", "index", "logprobs", "prompt_ids", "text", "tool_calls", "tools")

    def __init__(self, index: int) -> None:
        self.index = index
        self.text: list[str] = []
        self.tools: dict[int, list[Any]] = {}
        """Streamed tool calls by tool index: [id, type, name pieces, argument pieces]."""
        self.tool_calls: list[dict[str, Any]] | None = None
        """Whole tool calls of a non-streamed message."""
        self.finish_reason: str | None = None
        self.ids = array("I")
        self.logprobs: array[float] | None = None
        self.prompt_ids: array[int] | None = None

    def add_logprobs(self, lp: Any, chat: bool) -> None:
        values = lp.get("content") if chat else lp.get("token_logprobs")
        if not values:
            return
        if self.logprobs is None:
            self.logprobs = array("f")
        if chat:
            self.logprobs.extend(e.get("logprob", math.nan) for e in values)
        else:
            self.logprobs.extend(math.nan if v is None else v for v in values)

    def record(self) -> ChoiceRecord:
        if self.tool_calls is not None:
            tools = self.tool_calls
        else:
            tools = [
                {
                    "id": t[0],
                    "type": t[1] or "function",
                    "function": {"name": "".join(t[2]), "arguments": "".join(t[3])},
                }
                for _, t in sorted(self.tools.items())
            ]
        text: str | None = "".join(self.text) or None
        if not text and tools:
            text = None  # a tool-call answer has no content (the role chunk's "" is not content)
        return ChoiceRecord(self.index, text, tools, self.finish_reason, self.ids, self.logprobs)


class Assembly:
    """What one response said, assembled from its JSON (a whole body, or a stream's events in order)."""

    def __init__(self, *, chat: bool) -> None:
        self.chat = chat
        self.response_id: str | None = None
        self.served_model: str | None = None
        self.prompt_ids: array[int] | None = None
        self.usage: dict[str, Any] | None = None
        self.error: str | None = None
        """An in-band error event, an error body, or a body that is not the JSON expected."""
        self.done = False
        """The stream's `[DONE]` was seen, or the whole body was decoded."""
        self._choices: dict[int, _Choice] = {}

    def choices(self) -> list[ChoiceRecord]:
        return [self._choices[i].record() for i in sorted(self._choices)]

    def prompt_token_ids(self) -> array[int] | None:
        """Chat: top-level; completions: per choice (the first choice's; one prompt per call is what we record)."""
        if self.prompt_ids is not None or self.chat:
            return self.prompt_ids
        for i in sorted(self._choices):
            if (p := self._choices[i].prompt_ids) is not None:
                return p
        return None

    def several_prompts(self) -> bool:
        """Completions asked for several prompts at once (`prompt` a list): its choices come from different prompt
        ids, and a record holds one prompt's."""
        prompts = [c.prompt_ids for c in self._choices.values() if c.prompt_ids is not None]
        return any(p != prompts[0] for p in prompts[1:])

    def completion_ids_count(self) -> int:
        return sum(len(c.ids) for c in self._choices.values())

    def _choice(self, index: int) -> _Choice:
        c = self._choices.get(index)
        if c is None:
            c = self._choices[index] = _Choice(index)
        return c

    def _head(self, obj: dict[str, Any]) -> bool:
        """Top-level fields shared by bodies and stream events; False for an error object."""
        err = obj.get("error")
        if err is not None:
            self.error = error_message(err)
            return False
        if self.response_id is None:
            rid, model = obj.get("id"), obj.get("model")
            self.response_id = rid if isinstance(rid, str) else None
            self.served_model = model if isinstance(model, str) else None
        prompt = obj.get("prompt_token_ids")
        if prompt and self.prompt_ids is None:
            self.prompt_ids = array("I", prompt)
        usage = obj.get("usage")
        if usage is not None:
            self.usage = usage
        return True

    # --- streams -----------------------------------------------------------------------------------------------

    def add_events(self, data: bytes) -> None:
        """Fold whole SSE events (bytes that end at an event boundary) in order."""
        if self.chat and self._add_chat_events(data):
            return
        self.add_events_general(data)

    def add_events_general(self, data: bytes) -> None:
        """`add_events` for any stream: every event decoded in one batch, then folded one by one."""
        payloads = _DATA.findall(data)
        if not payloads:
            return
        if payloads[-1] == b"[DONE]":
            payloads.pop()
            self.done = True
        try:
            events = orjson.loads(b"[" + b",".join(payloads) + b"]")
        except orjson.JSONDecodeError:
            # Multi-line data, CR line ends, a stray non-JSON event: parse event by event, exactly.
            events = self._events_one_by_one(data)
        self._fold(events)

    def _add_chat_events(self, data: bytes) -> bool:
        """The fast path of a chat stream as vLLM writes it; False, having changed nothing, for anything else.

        Most events of a chat stream are one choice's text delta with its token ids, the same bytes around the
        text and ids every time. Those are cut out by position and their texts and ids decoded in one batch each,
        which costs a fraction of decoding and folding each event; every other event (the role, tool calls, the
        finish, usage, errors, a text with quotes in it) is decoded on its own and goes through the general fold,
        in order. Equal to `add_events_general` on any stream it accepts: tests/capture/test_assemble.py checks
        that on generated streams and on hand-made malformed ones.
        """
        if not data.startswith(b'data: {"id":') or not data.endswith(b"\n\n"):
            return False
        end = data.find(b"\n\ndata: ", 6, len(data) - 2)
        first = data[6 : end if end >= 0 else -2]  # the first event's payload
        k = first.find(b',"choices":[')
        if k < 0 or first.find(b"\n", 0, k) >= 0:
            return False
        lead = first[: k + 12] + _DELTA_TEXT  # every text delta of this response starts with these bytes
        runs = text_runs(data, lead)
        if runs is None:
            return False
        steps, others, parts = runs
        """The steps in order: an event's payload (then, decoded, a list of that one event), None for `[DONE]`, or a
        run of text deltas (their texts and ids as JSON arrays; then, decoded, the texts and an id array)."""
        if others * 2 > parts:
            return False  # mostly other events (tool calls, n > 1...): one batch decode is the cheaper way
        # Decode everything before changing anything: what does not decode (or ids that are not all token ids)
        # leaves the stream to the general path, which reads it exactly.
        try:
            head = orjson.loads(first[:k] + b"}")
            for i, step in enumerate(steps):
                if type(step) is bytes:
                    steps[i] = [orjson.loads(step)]  # one by one: a batch may pair up broken halves
                elif step is not None:
                    run_texts, ids_json = orjson.loads(step[0]), step[1]
                    if ids_json.find(b"\n") >= 0:  # a line break is JSON whitespace, but ends an SSE line
                        return False
                    steps[i] = (run_texts, array("I", orjson.loads(ids_json)))
        except (orjson.JSONDecodeError, TypeError, OverflowError):
            return False
        if type(head) is not dict or head.keys() != _HEAD_KEYS:
            return False
        choices = self._choices
        for step in steps:
            if type(step) is list:
                self._fold(step)
            elif step is None:
                self.done = True
            else:
                if self.response_id is None:
                    self._head(head)
                c = choices.get(0)
                if c is None:
                    c = choices[0] = _Choice(0)
                c.text += step[0]
                c.ids.extend(step[1])
        return True

    def add_events_exact(self, data: bytes) -> None:
        """Like `add_events` through the exact SSE parser, event by event (CR line ends, multi-line data)."""
        self._fold(self._events_one_by_one(data))

    def _fold(self, events: list[Any]) -> None:
        # The hot loop of a record (once per event, at the end): locals and few lookups on purpose.
        chat = self.chat
        choices = self._choices
        for ev in events:
            if type(ev) is not dict:
                continue
            # A plain chunk holds id, object, created, model and choices; prompt ids, usage, fingerprint or an
            # error come on a few events only, so the head is looked at only when there is more.
            if (len(ev) != 5 or self.response_id is None) and not self._head(ev):
                continue
            chs = ev.get("choices")
            if type(chs) is not list:  # (the upstream's bytes: anything at all, a number, a string)
                continue
            for ch in chs:
                if type(ch) is not dict:
                    continue
                index = ch.get("index", 0)
                c = choices.get(index)
                if c is None:
                    c = choices[index] = _Choice(index)
                ids = ch.get("token_ids")
                if ids:
                    c.ids.fromlist(ids)
                if chat:
                    delta = ch.get("delta")
                    if delta:
                        text = delta.get("content")
                        if text:
                            c.text.append(text)
                        if text is None or len(delta) > 1:
                            calls = delta.get("tool_calls")
                            if calls and type(calls) is list:
                                _merge_tool_deltas(c.tools, calls)
                else:
                    text = ch.get("text")
                    if text:
                        c.text.append(text)
                    if c.prompt_ids is None and (prompt := ch.get("prompt_token_ids")):
                        c.prompt_ids = array("I", prompt)
                finish = ch.get("finish_reason")
                if finish is not None:
                    c.finish_reason = finish
                lp = ch.get("logprobs")
                if lp:
                    c.add_logprobs(lp, chat)

    def _events_one_by_one(self, data: bytes) -> list[Any]:
        events: list[Any] = []
        for event in SSEParser().feed(data):
            if event.data == b"[DONE]":
                self.done = True
                continue
            try:
                events.append(orjson.loads(event.data))
            except orjson.JSONDecodeError:
                continue
        return events

    # --- whole bodies ------------------------------------------------------------------------------------------

    def add_body(self, body: bytes) -> None:
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError:
            self.error = "the upstream body is not valid JSON"
            return
        if type(obj) is not dict:
            self.error = "the upstream body is not a JSON object"
            return
        if not self._head(obj):
            return
        chat = self.chat
        chs = obj.get("choices")
        for ch in chs if type(chs) is list else ():
            if type(ch) is not dict:
                continue
            c = self._choice(ch.get("index", 0))
            ids = ch.get("token_ids")
            if ids:
                c.ids.fromlist(ids)
            if chat:
                msg = ch.get("message") or {}
                text = msg.get("content")
                if text:
                    c.text.append(text)
                calls = msg.get("tool_calls")
                if calls:
                    c.tool_calls = [_whole_tool_call(t) for t in calls]
            else:
                text = ch.get("text")
                if text:
                    c.text.append(text)
                prompt = ch.get("prompt_token_ids")
                if prompt:
                    c.prompt_ids = array("I", prompt)
            c.finish_reason = ch.get("finish_reason")
            lp = ch.get("logprobs")
            if lp:
                c.add_logprobs(lp, chat)
        self.done = True


def _merge_tool_deltas(tools: dict[int, list[Any]], calls: list[Any]) -> None:
    for call in calls:
        if type(call) is not dict:
            continue
        index = call.get("index", 0)
        fn = call.get("function")
        if type(fn) is not dict:
            fn = {}
        # Only strings are taken: a malformed delta (an index that is no number, arguments that are no string)
        # costs itself, not the record, and makes up no call.
        fields = [v if type(v) is str and v else None for v in (call.get("id"), call.get("type"))]
        name, arguments = (v if type(v) is str and v else None for v in (fn.get("name"), fn.get("arguments")))
        if type(index) is not int or not (any(fields) or name or arguments):
            continue
        slot = tools.get(index)
        if slot is None:
            slot = tools[index] = [None, None, [], []]
        if fields[0]:
            slot[0] = fields[0]
        if fields[1]:
            slot[1] = fields[1]
        if name:
            slot[2].append(name)
        if arguments:
            slot[3].append(arguments)


def _whole_tool_call(call: Any) -> dict[str, Any]:
    fn = call.get("function") or {}
    return {
        "id": call.get("id"),
        "type": call.get("type") or "function",
        "function": {"name": fn.get("name") or "", "arguments": fn.get("arguments") or ""},
    }


class Collector:
    """The tap of one upstream response: keeps chunks as they arrive; `finish()` decodes what is left."""

    __slots__ = ("_chunks", "_failed", "_fresh", "_limit", "_size", "assembly", "stream")

    def __init__(self, *, stream: bool, chat: bool) -> None:
        self.stream = stream
        self.assembly = Assembly(chat=chat)
        self._chunks: list[bytes] = []
        self._size = 0
        self._limit = COMPACT_BYTES if stream else math.inf
        self._fresh = True
        """Nothing decoded yet: a stream's leading byte-order mark is still there to drop (as SSE says)."""
        self._failed: Exception | None = None
        """What a batch decode on the way raised; from then on nothing is kept, and `finish` raises it."""

    def feed(self, chunk: bytes) -> None:
        """The tap, on the relay's path: whatever the upstream's bytes, it raises nothing into the relay."""
        if self._failed is not None:
            return
        self._chunks.append(chunk)
        self._size += len(chunk)
        if self._size >= self._limit:
            try:
                self._compact()
            except Exception as exc:
                # The upstream's bytes (ids that are no token ids, say) fail the record, not the client's stream:
                # `finish` raises it where the record is built, as a decode at the end would.
                self._failed = exc
                self._chunks = []
                self._size = 0

    def _compact(self) -> None:
        buf = self._joined()
        end = buf.rfind(b"\n\n") + 2
        if end > 1 and buf.find(b"\r") < 0:
            self.assembly.add_events(buf[:end])
            buf = buf[end:]
        self._chunks = [buf] if buf else []
        self._size = len(buf)
        # Geometric, so that one huge event (a 700 KB prompt-ids line) is not re-joined at every read.
        self._limit = self._size + max(COMPACT_BYTES, self._size)

    def _joined(self) -> bytes:
        buf = b"".join(self._chunks)
        if self._fresh and buf:
            self._fresh = False
            if self.stream and buf.startswith(BOM):
                buf = buf[len(BOM) :]
        return buf

    def finish(self) -> Assembly:
        """Decode whatever was not decoded yet; an unfinished last event is ignored, as the client's SDK does."""
        if self._failed is not None:
            raise self._failed
        buf = self._joined()
        self._chunks = []
        asm = self.assembly
        if not self.stream:
            if buf:
                asm.add_body(buf)
            return asm
        if buf.find(b"\r") >= 0:
            asm.add_events_exact(buf)  # CR line ends are legal SSE, never vLLM's: the exact parser knows them
            return asm
        cut = buf.rfind(b"\n\n")
        rest = cut + 2 if cut >= 0 else 0
        if rest:
            asm.add_events(buf[:rest] if rest < len(buf) else buf)
        if rest < len(buf) and _DONE.search(buf, rest) is not None:
            asm.done = True  # `data: [DONE]` without its blank line still ends an OpenAI stream
        return asm
