"""The upstream HTTP/1.1 client: keep-alive connections, responses streamed as they arrive, llhttp parsing.

Why not aiohttp's `ClientSession`, which the server side uses: on the hot path it is most of the gateway's CPU.
Measured side by side on a 2-vCPU VM (`bench/`), c=32, against the bench's minimal upstream: ~300 µs of CPU per
plain request and ~450 µs per 25-event stream for `ClientSession`, ~75 µs and ~180 µs for this client. What it
does is what a relay to an inference server needs and no more: one request per connection at a time, a body of
bytes, `Content-Length`, chunked or read-until-close responses (llhttp, through `httptools`, decodes the framing),
and:

- a pool of idle connections per (scheme, host, port), closed after `keepalive_timeout` s idle; at most
  `max_connections` open in all (a request waits for one to free up);
- `connect_timeout` to open a connection, `read_timeout` for the longest silence of an upstream while a response
  is awaited or read (not counted while the client side is slow and reading is paused). The read and keep-alive
  timeouts are checked by one timer per pool, every `tick` s (a quarter of the shorter, within 10 ms to 1 s), so
  they fire up to one tick late: a timer armed and cancelled per request and per idle spell cost ~4 µs of CPU
  per call under load;
- flow control: reading pauses once `HIGH_WATER` bytes wait for the consumer, resumes under `LOW_WATER`;
- a reused connection that the upstream had closed (keep-alive race: nothing at all came back) is retried once on a
  new connection; nothing else is retried here (`Upstream.open` decides about other targets);
- a connection goes back to the pool only in a state the next exchange can use: reading resumed, and nothing
  received past the end of the answer (an upstream that sends more than its `Content-Length` gets its connection
  closed: the extra bytes would be read as the next caller's answer);
- a response head over `MAX_HEAD_BYTES` is refused (`ProtocolError`).

Errors: `TimeoutError`, `ConnectError` (could not connect; an `OSError`), `UpstreamDisconnected` (closed or reset
mid-exchange; an `OSError`) and `ProtocolError` (not HTTP/1.1; an `OSError` too, so one `except OSError` holds).
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import Iterable
from typing import cast

import httptools
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

__all__ = [
    "HIGH_WATER",
    "LOW_WATER",
    "MAX_HEAD_BYTES",
    "MIN_TICK",
    "Body",
    "ConnectError",
    "ConnectionPool",
    "HttpResponse",
    "ProtocolError",
    "UpstreamDisconnected",
]

HIGH_WATER = 256 * 1024
"""Bytes of a response waiting for its consumer at which reading from the upstream pauses."""
LOW_WATER = 64 * 1024
"""...and under which it resumes."""
MAX_HEAD_BYTES = 64 * 1024
"""The most an upstream may send before its response headers are complete (1xx answers included)."""

MIN_TICK = 0.01
"""The shortest pause between two looks at the timeouts, whatever they are."""

_NO_BODY_STATUSES = frozenset({204, 304})


class ConnectError(OSError):
    """The connection to the upstream could not be opened."""

    def __init__(self, os_error: OSError) -> None:
        super().__init__(os_error.errno, os_error.strerror or str(os_error))
        self.os_error = os_error


class UpstreamDisconnected(OSError):
    """The upstream closed or reset the connection before its response was complete."""


class ProtocolError(OSError):
    """The upstream's bytes are not an HTTP/1.1 response."""


class Body:
    """A response body as it arrives: `async for chunk in body.iter_any()`, or `await body.read()`."""

    __slots__ = ("_buffered", "_chunks", "_conn", "_error", "_waiter", "eof")

    def __init__(self, conn: _Connection) -> None:
        self._conn: _Connection | None = conn
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._waiter: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        self.eof = False

    # --- the connection's side ---------------------------------------------------------------------------------

    def _feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered >= HIGH_WATER and self._conn is not None:
            self._conn.pause()
        self._wake()

    def _end(self, error: BaseException | None = None) -> None:
        if error is not None and not self.eof:
            self._error = error
        self.eof = True
        self._conn = None
        self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None:
            self._waiter = None
            if not w.done():
                w.set_result(None)

    # --- the consumer's side -----------------------------------------------------------------------------------

    def iter_any(self) -> Body:
        return self

    def __aiter__(self) -> Body:
        return self

    async def __anext__(self) -> bytes:
        while not self._chunks:
            if self._error is not None:
                raise self._error
            if self.eof:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        chunks = self._chunks
        data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        was = self._buffered
        self._buffered = 0
        if was >= LOW_WATER and self._conn is not None:
            self._conn.resume()
        return data

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self])


class HttpResponse:
    """Status and headers of an upstream response; its body streams through `content`."""

    __slots__ = ("_conn", "content", "headers", "status")

    def __init__(self, conn: _Connection, status: int, headers: CIMultiDictProxy[str], content: Body) -> None:
        self._conn: _Connection | None = conn
        self.status = status
        self.headers = headers
        self.content = content

    async def read(self) -> bytes:
        return await self.content.read()

    def release(self) -> None:
        """Done with it: an unfinished exchange cannot be reused, so its connection is closed."""
        if not self.content.eof:
            self.close()

    def close(self) -> None:
        """Drop the connection now (the upstream sees the client go away and frees the request)."""
        conn = self.content._conn
        if conn is not None:
            conn.abort(UpstreamDisconnected("the response was closed before its end"))


class _Connection(asyncio.Protocol):
    """One upstream connection: one exchange at a time, then back to its pool if both sides keep it alive."""

    def __init__(self, pool: ConnectionPool, key: tuple[str, str, int]) -> None:
        self.pool = pool
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.reused = False
        self.received = False  # a byte of the current exchange came back
        self._head_bytes = 0  # received while the headers of the current exchange are awaited
        self._complete = False  # the answer ended in the current read and the connection may be kept
        self._stray = False  # bytes came past the end of the answer
        self._status = 0
        self._headers: list[tuple[str, str]] = []
        self._until_close = False
        self._head_only = False
        self._ready: asyncio.Future[HttpResponse] | None = None
        self._body: Body | None = None
        self._parts: list[bytes] = []  # body bytes of the current read
        self._paused = False
        self._last_read = 0.0
        self._idle_since: float | None = None
        """Loop time at which it went back to the pool; None while in use."""

    # --- an exchange -------------------------------------------------------------------------------------------

    def start(self, request: bytes, *, head: bool) -> asyncio.Future[HttpResponse]:
        assert self.transport is not None
        loop = self.pool.loop
        if self.closed or self.transport.is_closing():
            # Lost between connect and now (the upstream closed at once, or sent bytes nobody asked for): nothing
            # would ever answer this exchange, nor time it out.
            lost = loop.create_future()
            lost.set_exception(UpstreamDisconnected("the connection closed before the request was sent"))
            return lost
        self._status = 0
        self._idle_since = None
        self.received = False
        self._head_bytes = 0
        self._complete = self._stray = False
        if self._paused:  # (never pooled paused; defensive, as a paused connection would wait forever)
            self.resume()
        self._head_only = head
        self._ready = loop.create_future()
        self._last_read = loop.time()
        self.transport.write(request)
        return self._ready

    def _check(self, now: float) -> None:
        """The pool's periodic look (`ConnectionPool._sweep`): an exchange silent past the read timeout fails, an
        idle connection past the keep-alive timeout closes."""
        if self.closed:
            return
        pool = self.pool
        if self._ready is not None or self._body is not None:
            # Paused, the silence is the consumer's, not the upstream's (only a body being consumed can pause it);
            # `resume` restarts the clock.
            if not (self._paused and self._body is not None) and now - self._last_read >= pool.read_timeout:
                self.abort(TimeoutError(f"no bytes from the upstream for {pool.read_timeout:g} s"))
        elif (
            self._idle_since is not None
            and now - self._idle_since >= pool.keepalive_timeout
            and self.transport is not None
        ):
            self.transport.close()

    def pause(self) -> None:
        if not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self._paused and self.transport is not None and not self.closed:
            self._paused = False
            self._last_read = self.pool.loop.time()
            self.transport.resume_reading()

    def abort(self, error: BaseException) -> None:
        """Close at once; whoever waits on this exchange gets `error`."""
        if self.transport is not None:
            self.transport.abort()
        self._lost(error)

    # --- asyncio.Protocol --------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # (uvloop's transports are not subclasses)

    def data_received(self, data: bytes) -> None:
        if self._ready is None and self._body is None:
            # Nothing is awaited on this connection (it is idle in the pool): whatever comes is not an answer.
            self.abort(ProtocolError("the upstream sent bytes no request asked for"))
            return
        self.received = True
        self._last_read = self.pool.loop.time()
        try:
            self.parser.feed_data(data)
            if self._parts:
                self._flush_parts()
        except httptools.HttpParserUpgrade:
            self.abort(ProtocolError("the upstream switched protocols"))
            return
        except httptools.HttpParserError as exc:
            self.abort(ProtocolError(f"the upstream's answer is not valid HTTP/1.1: {exc}"))
            return
        if self._ready is not None:  # the headers are still awaited
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self.abort(ProtocolError(f"the upstream's response head exceeds {MAX_HEAD_BYTES} bytes"))
        elif self._complete:
            self._complete = False
            if self._stray:
                self.abort(ProtocolError("the upstream sent bytes past the end of its answer"))
            else:
                self.resume()  # the last read may have paused it; the next exchange must find it reading
                self.pool._release(self)

    def eof_received(self) -> bool:
        return False  # close the transport: an upstream that stops sending has ended the exchange

    def connection_lost(self, exc: Exception | None) -> None:
        if self._body is not None and self._until_close and exc is None:
            self.on_message_complete()  # a body without a length ends when the connection does
        self._lost(UpstreamDisconnected(f"the upstream closed the connection ({exc or 'EOF'})"))

    def _lost(self, error: BaseException) -> None:
        if self.closed:
            return
        self.closed = True
        ready, self._ready = self._ready, None
        if ready is not None and not ready.done():
            ready.set_exception(error)
        body, self._body = self._body, None
        if body is not None:
            body._end(error)
        self.pool._closed(self)

    # --- httptools callbacks -----------------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._ready is None:  # a second answer in the same read: the first one ran past its length
            self._stray = True

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if status < 200:  # 1xx: an interim answer; the real one follows
            self._headers = []
            return
        headers = CIMultiDictProxy(CIMultiDict(self._headers))
        self._headers = []
        self._status = status
        self._until_close = (
            "Content-Length" not in headers
            and "chunked" not in headers.get("Transfer-Encoding", "").lower()
            and status not in _NO_BODY_STATUSES
            and not self._head_only
        )
        self._body = body = Body(self)
        ready, self._ready = self._ready, None
        if ready is not None and not ready.done():
            ready.set_result(HttpResponse(self, status, headers, body))
        if self._head_only:  # no body follows; llhttp would wait for one: this connection is done
            self.on_message_complete()
            if self.transport is not None:
                self.transport.close()

    def on_body(self, body: bytes) -> None:
        # handed to the body once per read (a read holds many SSE events, one chunk each)
        self._parts.append(body)

    def _flush_parts(self) -> None:
        parts, self._parts = self._parts, []
        if self._body is not None:
            self._body._feed(parts[0] if len(parts) == 1 else b"".join(parts))

    def on_message_complete(self) -> None:
        if self._ready is not None:
            return  # the end of a 1xx: the final answer is still awaited
        if self._parts:
            self._flush_parts()
        body, self._body = self._body, None
        keep = not self._until_close and not self._head_only and self.parser.should_keep_alive()
        if body is not None:
            body._end()
        if keep and not self.closed:
            self._complete = True  # pooled once the read is parsed to its end (`data_received`)
        elif self.transport is not None:
            self.transport.close()

    # --- idle in the pool --------------------------------------------------------------------------------------

    def idle(self) -> None:
        self.reused = True
        self._idle_since = self.pool.loop.time()


class ConnectionPool:
    """Keep-alive connections to any number of upstreams. `await pool.request(...)` → `HttpResponse`."""

    def __init__(
        self,
        *,
        max_connections: int,
        keepalive_timeout: float,
        connect_timeout: float,
        read_timeout: float,
    ) -> None:
        self.max_connections = max_connections
        self.keepalive_timeout = keepalive_timeout
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.loop = asyncio.get_running_loop()
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._open = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._ssl: ssl.SSLContext | None = None
        self._closing = False
        self._conns: set[_Connection] = set()
        """Every open connection, in use or idle: what `_sweep` looks at."""
        # (a keep-alive of 0 pools nothing, so it sets no pace; and never a tick of 0: a timer that spins)
        self.tick = max(
            MIN_TICK, min(1.0, read_timeout / 4, keepalive_timeout / 4 if keepalive_timeout > 0 else 1.0)
        )
        """Seconds between two looks at the timeouts (how late one may fire)."""
        self._sweeper: asyncio.TimerHandle | None = None

    @property
    def open_connections(self) -> int:
        return self._open

    async def request(
        self, method: str, url: URL, headers: Iterable[tuple[str, str]], body: bytes
    ) -> HttpResponse:
        host = url.raw_host or ""
        port = url.port or (443 if url.scheme == "https" else 80)
        key = (url.scheme, host, port)
        head = [f"{method} {url.raw_path_qs} HTTP/1.1\r\nHost: {_host_header(url, port)}\r\n"]
        head += [f"{k}: {v}\r\n" for k, v in headers]
        if body or method not in ("GET", "HEAD", "DELETE", "OPTIONS"):
            head.append(f"Content-Length: {len(body)}\r\n")
        head.append("\r\n")
        # Header values arrive decoded with surrogateescape (raw bytes that are not UTF-8): they leave as they came.
        request = "".join(head).encode("utf-8", "surrogateescape") + body
        is_head = method == "HEAD"
        for attempt in range(2):
            conn = await self._acquire(key)
            ready = conn.start(request, head=is_head)
            try:
                return await ready
            except UpstreamDisconnected:
                if attempt or not conn.reused or conn.received:
                    raise
                # A kept-alive connection the upstream had closed: nothing came back, nothing was processed.
            except BaseException:
                conn.abort(UpstreamDisconnected("the request was abandoned"))
                raise
        raise AssertionError("unreachable")

    def _take_idle(self, key: tuple[str, str, int]) -> _Connection | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn.closed and conn.transport is not None and not conn.transport.is_closing():
                return conn
        return None

    async def _acquire(self, key: tuple[str, str, int]) -> _Connection:
        if (conn := self._take_idle(key)) is not None:
            return conn
        while self._open >= self.max_connections:
            if not self._close_an_idle_connection():
                waiter = self.loop.create_future()
                self._waiters.append(waiter)
                try:
                    await waiter
                finally:
                    if waiter in self._waiters:
                        self._waiters.remove(waiter)
                if (conn := self._take_idle(key)) is not None:
                    return conn
        self._open += 1
        conn = _Connection(self, key)
        self._conns.add(conn)
        if self._sweeper is None:
            self._sweeper = self.loop.call_later(self.tick, self._sweep)
        scheme, host, port = key
        try:
            await asyncio.wait_for(
                self.loop.create_connection(
                    lambda: conn, host, port, ssl=self._ssl_context() if scheme == "https" else None
                ),
                self.connect_timeout,
            )
        except TimeoutError:
            conn._lost(TimeoutError(f"connecting to {host}:{port} took over {self.connect_timeout:g} s"))
            raise
        except OSError as exc:
            conn._lost(ConnectError(exc))
            raise ConnectError(exc) from exc
        except BaseException:
            conn._lost(UpstreamDisconnected("the connection attempt was abandoned"))
            raise
        return conn

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

    def _close_an_idle_connection(self) -> bool:
        for idle in self._idle.values():
            while idle:
                conn = idle.pop(0)
                if not conn.closed and conn.transport is not None:
                    conn.transport.close()
                    conn._lost(UpstreamDisconnected("closed to make room"))
                    return True
        return False

    def _release(self, conn: _Connection) -> None:
        if self._closing or self.keepalive_timeout <= 0:
            if conn.transport is not None:
                conn.transport.close()
            return
        conn.idle()
        self._idle.setdefault(conn.key, []).append(conn)
        self._wake_one()

    def _closed(self, conn: _Connection) -> None:
        self._open -= 1
        self._conns.discard(conn)
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)
        self._wake_one()

    def _sweep(self) -> None:
        """Every `tick` s while a connection is open: each one's timeouts (`_Connection._check`)."""
        self._sweeper = None
        now = self.loop.time()
        for conn in list(self._conns):
            conn._check(now)
        if self._conns:
            self._sweeper = self.loop.call_later(self.tick, self._sweep)

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def close(self) -> None:
        """Close every idle connection; those in use close when their exchange ends."""
        self._closing = True
        for idle in self._idle.values():
            for conn in list(idle):
                if conn.transport is not None:
                    conn.transport.close()
            idle.clear()


def _host_header(url: URL, port: int) -> str:
    """`Host`: the host, bracketed if IPv6, with the port unless it is the scheme's default (as browsers send)."""
    host = url.raw_host or ""
    if ":" in host:
        host = f"[{host}]"
    default = 443 if url.scheme == "https" else 80
    return host if port == default else f"{host}:{port}"
