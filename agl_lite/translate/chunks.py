"""The chat completion chunks of an upstream event stream, as the translations read them: each SSE event's JSON
object, in order, until `data: [DONE]`. A stray non-JSON event is skipped, as the OpenAI SDKs skip it; an event of
a later read waits only for its own bytes.

vLLM writes each event as one `data: ...` line and a blank line: those are split on `\\n\\n` at C speed, which was a
third of a translated stream's cost when every line went through the general parser. Any other shape of event
(several lines, comments, `data:` without its space) is read line by line here, and a stream that uses CR line
ends goes to the general parser (`core.sse.SSEParser`) for good.
"""

from __future__ import annotations

from typing import Any

import orjson

from agl_lite.core.sse import BOM, SSEParser

__all__ = ["ChatChunks"]


class ChatChunks:
    __slots__ = ("_buf", "_head", "_parser", "_scan", "done")

    def __init__(self) -> None:
        self._head: bytes | None = b""
        """The stream's first bytes while they may still be a byte-order mark, which SSE drops; None after."""
        self._buf = bytearray()
        self._scan = 0  # where in _buf an event's end is yet to be searched for: a long event is scanned once
        self._parser: SSEParser | None = None  # the general parser, once a CR line end was seen
        self.done = False
        """`data: [DONE]` arrived: the upstream finished its answer (nothing after it is read)."""

    def feed(self, chunk: bytes) -> list[dict[str, Any]]:
        """The chunk objects that this read completed."""
        if self._head is not None:
            head = self._head + chunk
            if len(head) < len(BOM) and BOM.startswith(head):
                self._head = head  # (a mark split across reads)
                return []
            self._head = None
            chunk = head[len(BOM) :] if head.startswith(BOM) else head
        if self._parser is None and b"\r" in chunk:
            self._parser = SSEParser()
            chunk, self._buf = bytes(self._buf) + chunk, bytearray()
        if self._parser is not None:
            return self._objects([e.data for e in self._parser.feed(chunk)])
        if self._buf:
            self._buf += chunk
            end = self._buf.find(b"\n\n", self._scan)
            if end < 0:  # (a long event, read in many pieces: each byte is searched once)
                self._scan = len(self._buf) - 1
                return []
            chunk, self._buf = bytes(self._buf), bytearray()
        events = chunk.split(b"\n\n")
        rest = events.pop()
        if rest:
            self._buf += rest
            self._scan = len(rest) - 1  # (a "\n" at its end may be the first half of the next "\n\n")
        datas: list[bytes] = []
        for event in events:
            if event.startswith(b"data: ") and b"\n" not in event:
                datas.append(event[6:])
            elif (data := _data(event)) is not None:
                datas.append(data)
        return self._objects(datas)

    def _objects(self, datas: list[bytes]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for data in datas:
            if self.done:
                break
            if data == b"[DONE]":
                self.done = True
                continue
            try:
                obj = orjson.loads(data)
            except orjson.JSONDecodeError:
                continue
            if type(obj) is dict:
                out.append(obj)
        return out


def _data(event: bytes) -> bytes | None:
    """An event's data as the SSE format reads it: its `data` fields' values (one leading space dropped) joined
    by newlines; None for an event without one (a comment, a lone `event:` line, blank lines)."""
    values = []
    for line in event.split(b"\n"):
        name, colon, value = line.partition(b":")
        if name == b"data" and colon:
            values.append(value[1:] if value.startswith(b" ") else value)
        elif name == b"data":  # a `data` field without a colon: an empty value
            values.append(b"")
    return b"\n".join(values) if values else None
