"""The client's view of a vLLM response when capture injected options the client did not ask for.

It rewrites vLLM's compact JSON at byte level (token id arrays and injected logprobs become `null`) and drops the
events vLLM sends only because of an injected option, so the client gets what vLLM would have sent it. It must not
decode JSON, and it never holds stream bytes beyond the current event.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import partial

from agl_lite.core.flow import WholeBody

__all__ = ["StreamStripper", "Strip", "client_view", "strip_body"]

# `"token_ids":[1,2]` and `"prompt_token_ids":[...]` as object keys: the lookbehinds come after the literal so
# the regex engine keeps its fast literal-prefix scan. Inside a JSON string every `"` is escaped, so a match (the
# unescaped quote after `token_ids`, and `{"`/`,"` before the key) can only be a key, never string content.
_IDS = re.compile(rb'token_ids":\[(?:(?<=[{,]"token_ids":\[)|(?<=[{,]"prompt_token_ids":\[))[0-9,]*\]')
_IDS_NULL = b'token_ids":null'
_LOGPROBS = re.compile(rb'"logprobs":\{(?<=[{,]"logprobs":\{)')
_LOGPROBS_NULL = b'"logprobs":null'
_JSON_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}]')
"""A JSON string (skipped whole, escapes included) or a brace: enough to find where an object ends."""


@dataclass(frozen=True, slots=True)
class Strip:
    """What capture injected that the client did not ask for, hence must not see."""

    token_ids: bool = False
    usage: bool = False
    logprobs: bool = False

    def __bool__(self) -> bool:
        return self.token_ids or self.usage or self.logprobs


def strip_body(body: bytes, strip: Strip) -> bytes:
    """A whole (non-streamed) vLLM JSON body as vLLM would have sent it without the injected options."""
    if strip.token_ids:
        body = _IDS.sub(_IDS_NULL, body)
    if strip.logprobs:
        body = _null_logprobs(body)
    return body


class StreamStripper:
    """Transform for a vLLM event stream (events end with a blank line, LF only, as vLLM writes them).

    Whole events go through at once; only an unfinished event waits for the rest of its bytes. The common path is
    one regex substitution per chunk; the rest runs only when a chunk holds an event that needs more.
    """

    __slots__ = ("_buf", "_empty_deltas", "_finishing", "_ids", "_logprobs", "_usage")

    def __init__(self, strip: Strip, *, chat: bool) -> None:
        self._ids = strip.token_ids
        self._usage = strip.usage
        self._logprobs = strip.logprobs
        # With return_token_ids vLLM also sends the chunks its tool parser left empty (only ids in them).
        self._empty_deltas = strip.token_ids and chat
        self._buf = bytearray()
        # vLLM sends the usage event only after a choice finished: until then no chunk needs looking at for it.
        self._finishing = False

    def __call__(self, chunk: bytes) -> bytes:
        buf = self._buf
        if buf:
            start = len(buf) - 1  # the blank line may straddle the two reads
            buf += chunk
            cut = buf.rfind(b"\n\n", start)
            if cut < 0:
                return b""
            data = bytes(buf[: cut + 2])
            del buf[: cut + 2]
        elif chunk.endswith(b"\n\n"):
            data = chunk
        else:
            end = chunk.rfind(b"\n\n") + 2
            if end == 1:
                buf += chunk
                return b""
            buf += chunk[end:]
            data = chunk[:end]
        if self._ids:
            data = _IDS.sub(_IDS_NULL, data)
        # Whole-chunk checks (several events may have come in one read): find(), not `in`, which costs more on
        # bytes. Only chunks that hold an event needing more than the substitution go event by event.
        if not self._finishing:
            if self._usage and data.find(b'"finish_reason":"') >= 0:
                self._finishing = True
                return self._per_event(data)
            if self._empty_deltas and data.find(b'"delta":{}') >= 0:
                return self._per_event(data)
            if self._logprobs and data.find(b'"logprobs":{') >= 0:
                return self._per_event(data)
            return data
        return self._per_event(data)

    def _per_event(self, data: bytes) -> bytes:
        # Without include_usage vLLM puts the stream's system_fingerprint on the last choice event, with it on the
        # usage event, which the client did not ask for and does not get: the fingerprint goes with it rather than
        # hold a choice event back until the next one (streams are never held beyond the current event).
        out: list[bytes] = []
        pieces = data.split(b"\n\n")
        pieces.pop()  # data ends with a blank line: the last piece is empty
        for ev in pieces:
            if self._usage and ev.find(b'"choices":[]') >= 0 and ev.find(b'"usage":{') >= 0:
                continue
            if (
                self._empty_deltas
                and ev.find(b'"delta":{}') >= 0
                and ev.find(b'"finish_reason":null') >= 0
                and ev.count(b'"delta":') == 1
            ):
                continue
            if self._logprobs and ev.find(b'"logprobs":{') >= 0:
                ev = _null_logprobs(ev)
            out.append(ev + b"\n\n")
        return b"".join(out)

    def flush(self) -> bytes:
        if not self._buf:
            return b""
        rest = bytes(self._buf)
        self._buf.clear()
        return _IDS.sub(_IDS_NULL, rest) if self._ids else rest


def client_view(strip: Strip, *, stream: bool, chat: bool) -> WholeBody | StreamStripper | None:
    """The transform that gives the client its own view; None when there is nothing to take out (fast path)."""
    if not strip:
        return None
    return StreamStripper(strip, chat=chat) if stream else WholeBody(partial(strip_body, strip=strip))


def _null_logprobs(data: bytes) -> bytes:
    """Every `"logprobs":{...}` member set to null (rare path: only when logprobs were injected)."""
    parts: list[bytes] = []
    pos = 0
    while (m := _LOGPROBS.search(data, pos)) is not None:
        end = _object_end(data, m.end() - 1)
        if end < 0:
            break
        parts += (data[pos : m.start()], _LOGPROBS_NULL)
        pos = end
    if not parts:
        return data
    parts.append(data[pos:])
    return b"".join(parts)


def _object_end(data: bytes, start: int) -> int:
    """Offset just past the JSON object opening at `start` (a structural `{`); -1 if it does not end in `data`."""
    depth = 0
    for tok in _JSON_TOKEN.finditer(data, start):
        c = data[tok.start()]
        if c == 0x7B:
            depth += 1
        elif c == 0x7D:
            depth -= 1
            if depth == 0:
                return tok.end()
    return -1
