"""The client's view of a vLLM response when capture injected options the client did not ask for.

It rewrites vLLM's compact JSON at byte level (token id arrays and injected logprobs become `null`) and drops the
events vLLM sends only because of an injected option, so the client gets what vLLM would have sent it. It must not
decode JSON, and it never holds stream bytes beyond the current event.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from agl_lite.capture.native import find, strip_ids
from agl_lite.core.flow import WholeBody

__all__ = ["StreamStripper", "Strip", "client_view", "strip_body"]

_LOGPROBS = re.compile(rb'"logprobs":\{(?<=[{,]"logprobs":\{)')
_LOGPROBS_NULL = b'"logprobs":null'
_JSON_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*("|\\?\Z)|[{}]', re.S)
"""A JSON string (skipped whole, escapes included) or a brace: enough to find where an object ends. A string that
does not end in the bytes matches to their end, its group 1 not a quote: one pass, where a pattern that needs the
closing quote would be tried again from every quote after it (seconds for a 32 KB event of escaped quotes)."""


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
        body = strip_ids(body)
    if strip.logprobs:
        body = _null_logprobs(body)
    return body


class StreamStripper:
    """Transform for a vLLM event stream (events end with a blank line; CRLF and CR line ends become LF).

    Whole events go through at once; only an unfinished event waits for the rest of its bytes. The common path is
    one substitution and a `find` or two per read (capture/native.py: in C when built); an event is looked at on
    its own only when the read holds the marker of one that must go (the usage event, an id-only delta) or change
    (injected logprobs).
    """

    __slots__ = ("_after_cr", "_buf", "_empty_deltas", "_ids", "_logprobs", "_usage")

    def __init__(self, strip: Strip, *, chat: bool) -> None:
        self._ids = strip.token_ids
        self._usage = strip.usage
        self._logprobs = strip.logprobs
        # With return_token_ids vLLM also sends the chunks its tool parser left empty (only ids in them).
        self._empty_deltas = strip.token_ids and chat
        self._buf = bytearray()
        self._after_cr: bool | None = None
        """None until the stream holds a CR; then whether the last read ended with one."""

    def __call__(self, chunk: bytes) -> bytes:
        if self._after_cr is not None or chunk.find(b"\r") >= 0:
            chunk = self._lf(chunk)
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
            data = strip_ids(data)
        # Whole-read checks (a read holds several events). The markers are structural: inside a JSON string every
        # `"` is escaped, so text cannot hold them.
        if self._usage and (at := find(data, b'"choices":[]')) >= 0:
            data = _drop_events(data, b'"choices":[]', _is_usage_event, at)
        if self._empty_deltas and (at := find(data, b'"delta":{}')) >= 0:
            # An empty delta that carries logprobs the client asked for is vLLM's too: it stays.
            drop = _is_id_only_delta if self._logprobs else _is_id_only_delta_without_logprobs
            data = _drop_events(data, b'"delta":{}', drop, at)
        if self._logprobs and find(data, b'"logprobs":{') >= 0:
            data = b"".join(_null_logprobs(ev) + b"\n\n" for ev in data.split(b"\n\n")[:-1])
        return data

    def _lf(self, chunk: bytes) -> bytes:
        """CRLF and CR line ends (legal SSE, never vLLM's) as LF, so that events end where the client's parser ends
        them and pass at once: the same events, each line ended alike. A CR that ends a read becomes LF at once,
        and the LF that may follow it in the next read (one CRLF split in two) is dropped then."""
        if self._after_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        self._after_cr = chunk.endswith(b"\r")
        return chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")

    def flush(self) -> bytes:
        if not self._buf:
            return b""
        rest = bytes(self._buf)
        self._buf.clear()
        return strip_ids(rest) if self._ids else rest


def _is_usage_event(ev: bytes) -> bool:
    """vLLM's last event when usage was asked for: no choices, the usage. Without include_usage vLLM puts the
    stream's system_fingerprint on the last choice event, with it on this one, which the client did not ask for
    and does not get: the fingerprint goes with it rather than hold a choice event back until the next one."""
    return ev.find(b'"usage":{') >= 0


def _is_id_only_delta(ev: bytes) -> bool:
    """A chunk vLLM sends only because token ids were asked for: an empty delta that does not finish a choice."""
    return ev.find(b'"finish_reason":null') >= 0 and ev.count(b'"delta":') == 1


def _is_id_only_delta_without_logprobs(ev: bytes) -> bool:
    return _is_id_only_delta(ev) and ev.find(b'"logprobs":{') < 0


def _drop_events(data: bytes, marker: bytes, drop: Callable[[bytes], bool], at: int) -> bytes:
    """`data` (whole events) less the events that hold `marker` (the first at `at`) and that `drop` says go."""
    kept: list[bytes] = []
    pos = 0  # the start of the event after the last one dropped
    while at >= 0:
        sep = data.rfind(b"\n\n", pos, at)
        start = sep + 2 if sep >= 0 else pos
        end = data.find(b"\n\n", at) + 2
        if drop(data[start:end]):
            kept.append(data[pos:start])
            pos = end
        at = data.find(marker, end)
    if not pos:
        return data
    kept.append(data[pos:])
    return b"".join(kept)


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
        elif tok.group(1) != b'"':
            return -1  # a string that does not end: nor does the object
    return -1
