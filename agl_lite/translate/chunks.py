"""The chat completion chunks of an upstream event stream, as the translations read them: each SSE event's JSON
object, in order, until `data: [DONE]`. A stray non-JSON event is skipped, as the OpenAI SDKs skip it; an event of
a later read waits only for its own bytes (the SSE splitter keeps the unfinished one).
"""

from __future__ import annotations

from typing import Any

import orjson

from agl_lite.core.sse import SSEParser

__all__ = ["ChatChunks"]


class ChatChunks:
    __slots__ = ("_parser", "done")

    def __init__(self) -> None:
        self._parser = SSEParser()
        self.done = False
        """`data: [DONE]` arrived: the upstream finished its answer (nothing after it is read)."""

    def feed(self, chunk: bytes) -> list[dict[str, Any]]:
        """The chunk objects that this read completed."""
        out: list[dict[str, Any]] = []
        for event in self._parser.feed(chunk):
            if self.done:
                continue
            if event.data == b"[DONE]":
                self.done = True
                continue
            try:
                obj = orjson.loads(event.data)
            except orjson.JSONDecodeError:
                continue
            if type(obj) is dict:
                out.append(obj)
        return out
