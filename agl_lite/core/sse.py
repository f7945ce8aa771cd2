"""Incremental server-sent-events parsing at byte level, for taps that watch a stream as it passes.

Feed it chunks exactly as they arrive (any split, LF, CRLF or CR line ends, comments, lines of any length); it
returns complete events. It never sits on the relay path itself and never decodes JSON.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BOM", "DoneDetector", "SSEEvent", "SSEParser", "find_done"]

BOM = "\ufeff".encode()
"""A UTF-8 byte-order mark: SSE drops one before a stream's first byte (capture and the translations do)."""


@dataclass(frozen=True, slots=True)
class SSEEvent:
    data: bytes
    """The event's data lines joined with `\\n` (the `data:` prefix and one leading space removed)."""
    event: str | None = None
    id: str | None = None


class SSEParser:
    def __init__(self) -> None:
        self._buf = bytearray()
        self._scan = 0  # bytes of _buf already searched for a line end; keeps 1 MB lines O(n)
        self._data: list[bytes] = []
        self._event: str | None = None
        self._id: str | None = None
        self._skip_lf = (
            False  # the previous chunk ended with CR: a LF right after it belongs to that line end
        )

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Events completed by this chunk, in order."""
        if self._skip_lf and chunk:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        buf = self._buf
        buf += chunk
        events: list[SSEEvent] = []
        start = 0
        i = self._scan
        n = len(buf)
        # The next LF and CR at or after i: -2 until looked for, -1 when there is none. Looked for again only once
        # i has passed them, so that a stream with one kind of line end only is not scanned to its end per line.
        lf = cr = -2
        while i < n:
            c = buf[i]
            if c != 10 and c != 13:  # fast path: look for the next CR or LF
                if -1 < lf < i or lf == -2:
                    lf = buf.find(b"\n", i)
                if -1 < cr < i or cr == -2:
                    cr = buf.find(b"\r", i)
                if lf < 0 and cr < 0:
                    i = n
                    break
                i = lf if cr < 0 else cr if lf < 0 else min(lf, cr)
                continue
            line = bytes(buf[start:i])
            if c == 13:
                if i + 1 < n:
                    if buf[i + 1] == 10:
                        i += 1
                else:
                    self._skip_lf = True
            i += 1
            start = i
            event = self._line(line)
            if event is not None:
                events.append(event)
        del buf[:start]
        self._scan = len(buf)
        return events

    def _line(self, line: bytes) -> SSEEvent | None:
        if not line:
            if not self._data and self._event is None:
                return None
            event = SSEEvent(b"\n".join(self._data), self._event, self._id)
            self._data = []
            self._event = None
            return event
        if line[:1] == b":":
            return None
        name, sep, value = line.partition(b":")
        if sep and value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            self._data.append(value)
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")
        elif name == b"id":
            self._id = value.decode("utf-8", "replace")
        return None


_LINE_ENDS = (0x0A, 0x0D)


def find_done(tail: bytes, chunk: bytes) -> int:
    """Where, in `chunk`, the terminal `data: [DONE]` line of an OpenAI stream starts; -1 if it does not.

    `tail` is the end of the previous chunks (at least 13 bytes, or `b"\\n"` at stream start), so a marker split
    across reads is found too; then 0 is returned (its start was already sent, its end was not). A `[DONE]` inside
    JSON content cannot match: a data line holds no raw line break. The line is `data: [DONE]` or `data:[DONE]`
    after LF or CR: one scan for `[DONE]`, then a look at the bytes before it.
    """
    window = tail + chunk
    pos = window.find(b"[DONE]")
    while pos >= 0:
        if pos >= 7 and window[pos - 6 : pos] == b"data: " and window[pos - 7] in _LINE_ENDS:
            return max(0, pos - 6 - len(tail))
        if pos >= 6 and window[pos - 5 : pos] == b"data:" and window[pos - 6] in _LINE_ENDS:
            return max(0, pos - 5 - len(tail))
        pos = window.find(b"[DONE]", pos + 1)
    return -1


class DoneDetector:
    """Finds where the terminal `data: [DONE]` line starts in a stream fed chunk by chunk (the relay's commit point).

    Runs on every chunk of every stream, so it first applies a filter made of single-byte scans (memchr, several
    times cheaper than a search for two bytes or more): the read that completes the marker holds its `D`, or, when
    the split fell after the `D`, its closing `]` in its first five bytes.
    """

    __slots__ = ("_tail", "found")

    def __init__(self) -> None:
        self._tail = b"\n"  # a stream start counts as a line start
        self.found = False

    def feed(self, chunk: bytes) -> int:
        """Offset in `chunk` where the `[DONE]` line starts (0 if it began in an earlier chunk), else -1."""
        if self.found:
            return -1
        if chunk.find(b"D") >= 0 or chunk.find(b"]", 0, 5) >= 0:
            cut = find_done(self._tail, chunk)
            if cut >= 0:
                self.found = True
                return cut
        self._tail = chunk[-16:] if len(chunk) >= 16 else (self._tail + chunk)[-16:]
        return -1
