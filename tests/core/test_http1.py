"""The upstream HTTP/1.1 client against raw asyncio servers that answer byte for byte what each test needs."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from yarl import URL

from agl_lite.core import http1
from agl_lite.core.http1 import ConnectError, ConnectionPool, ProtocolError, UpstreamDisconnected

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


class Server:
    """A TCP server running `handler` per connection; counts connections."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.closed = 0
        self.changed = asyncio.Event()  # set at every connection's end
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Server:
        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            try:
                await self.handler(reader, writer)
            except (ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                writer.close()
                self.closed += 1
                self.changed.set()

        self.server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    def url(self, path: str = "/v1/x") -> URL:
        assert self.server is not None
        return URL(f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}{path}")


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One request's head and body (by Content-Length)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head, await reader.readexactly(length)


async def answer_ok_forever(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        await read_request(reader)
        writer.write(OK)
        await writer.drain()


@pytest.fixture
async def pool() -> AsyncIterator[ConnectionPool]:
    p = ConnectionPool(max_connections=8, keepalive_timeout=30, connect_timeout=2, read_timeout=2)
    yield p
    await p.close()


async def test_a_request_goes_out_as_http11_and_the_connection_is_reused(pool: ConnectionPool) -> None:
    heads: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head, body = await read_request(reader)
            heads.append(head + body)
            writer.write(OK)

    async with Server(handler) as server:
        for _ in range(3):
            resp = await pool.request("POST", server.url("/v1/x?a=1"), [("X-Trace", "t")], b'{"a":1}')
            assert (resp.status, await resp.read()) == (200, b"ok")
        assert server.connections == 1
        port = server.url().port
    assert heads[0] == (
        f"POST /v1/x?a=1 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Trace: t\r\nContent-Length: 7\r\n\r\n".encode()
        + b'{"a":1}'
    )


async def test_chunks_reach_the_reader_as_they_arrive(pool: ConnectionPool) -> None:
    gate = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await gate.wait()  # the second chunk only after the reader got the first
        writer.write(b"6\r\nsecond\r\n0\r\n\r\n")

    async with Server(handler) as server:
        resp = await pool.request("POST", server.url(), [], b"{}")
        chunks = resp.content.iter_any()
        assert await chunks.__anext__() == b"first"
        gate.set()
        assert [c async for c in chunks] == [b"second"]
        assert resp.content.eof


async def test_a_body_without_length_ends_with_the_connection(pool: ConnectionPool) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end")

    async with Server(handler) as server:
        resp = await pool.request("GET", server.url(), [], b"")
        assert await resp.read() == b"until the end"


async def test_interim_1xx_answers_are_skipped(pool: ConnectionPool) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n" + OK)

    async with Server(handler) as server:
        resp = await pool.request("POST", server.url(), [], b"{}")
        assert (resp.status, await resp.read()) == (200, b"ok")


async def test_a_head_answer_has_no_body(pool: ConnectionPool) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
        await reader.read()

    async with Server(handler) as server:
        resp = await asyncio.wait_for(pool.request("HEAD", server.url(), [], b""), 5)
        assert (resp.status, resp.headers["Content-Length"], await resp.read()) == (200, "100", b"")


async def test_silence_past_the_read_timeout_is_a_timeout() -> None:
    pool = ConnectionPool(max_connections=8, keepalive_timeout=30, connect_timeout=2, read_timeout=0.2)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf")
        await reader.read()  # then nothing

    async with Server(handler) as server:
        resp = await pool.request("POST", server.url(), [], b"{}")
        with pytest.raises(TimeoutError):
            await resp.read()
    async with Server(lambda r, w: r.read()) as silent:
        with pytest.raises(TimeoutError):  # and before the headers too
            await pool.request("POST", silent.url(), [], b"{}")
    assert pool.open_connections == 0
    await pool.close()


async def test_a_reset_mid_body_is_a_disconnect(pool: ConnectionPool) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf")
        await writer.drain()
        sock = writer.get_extra_info("socket")
        sock.setsockopt(
            socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
        )  # RST on close

    async with Server(handler) as server:
        resp = await pool.request("POST", server.url(), [], b"{}")
        with pytest.raises(UpstreamDisconnected):
            await resp.read()
    assert pool.open_connections == 0


async def test_a_kept_alive_connection_closed_by_the_upstream_is_retried_once(pool: ConnectionPool) -> None:
    async def answer_once_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(OK)  # keep-alive by default, and yet it closes when the next request comes
        await writer.drain()
        await reader.read(1)

    async with Server(answer_once_then_close) as server:
        for _ in range(3):
            resp = await pool.request("POST", server.url(), [], b"{}")
            assert await resp.read() == b"ok"
        assert server.connections == 3


async def test_a_fresh_connection_that_closes_is_not_retried(pool: ConnectionPool) -> None:
    async def close_at_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)

    async with Server(close_at_once) as server:
        with pytest.raises(UpstreamDisconnected):
            await pool.request("POST", server.url(), [], b"{}")
        assert server.connections == 1


async def test_idle_connections_close_after_the_keepalive_timeout() -> None:
    pool = ConnectionPool(max_connections=8, keepalive_timeout=0.1, connect_timeout=2, read_timeout=2)
    async with Server(answer_ok_forever) as server:
        resps = await asyncio.gather(*(pool.request("POST", server.url(), [], b"{}") for _ in range(3)))
        for r in resps:
            await r.read()
        assert pool.open_connections == 3
        async with asyncio.timeout(5):  # the server sees the three connections end
            while server.closed < 3:
                server.changed.clear()
                await server.changed.wait()
        assert pool.open_connections == 0
    await pool.close()


@pytest.mark.parametrize(("keepalive", "read"), [(0.0, 600.0), (30.0, 0.0), (30.0, -1.0)])
async def test_timeouts_of_zero_pool_nothing_and_never_spin_the_timer(
    monkeypatch: pytest.MonkeyPatch, keepalive: float, read: float
) -> None:
    """A keep-alive of 0 keeps no connection (and a pool built with a zero or negative timeout, which the config
    refuses, still looks at its connections at most every `MIN_TICK`): a tick of 0 re-armed the pool's timer at
    every turn of the loop, a whole CPU for as long as a connection was open."""
    sweeps = 0
    real_sweep = ConnectionPool._sweep

    def counted(pool: ConnectionPool) -> None:
        nonlocal sweeps
        sweeps += 1
        real_sweep(pool)

    monkeypatch.setattr(ConnectionPool, "_sweep", counted)
    pool = ConnectionPool(
        max_connections=8, keepalive_timeout=keepalive, connect_timeout=2, read_timeout=read
    )
    assert pool.tick >= http1.MIN_TICK

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.2)  # (the silence the pool's timer runs through)
        writer.write(b"ok")
        await reader.read()

    async with Server(slow) as server:
        try:
            resp = await pool.request("POST", server.url(), [], b"{}")
            await resp.read()
        except TimeoutError:
            assert read <= 0  # no read may wait on a timeout that is already over
        else:
            assert read > 0
        if keepalive == 0:  # not pooled: closed as soon as its answer was read
            async with asyncio.timeout(5):
                while server.closed < 1:
                    server.changed.clear()
                    await server.changed.wait()
        assert pool.open_connections == (0 if keepalive == 0 or read <= 0 else 1)
    assert sweeps <= 0.3 / http1.MIN_TICK
    await pool.close()


async def test_requests_past_max_connections_wait_for_a_free_one() -> None:
    pool = ConnectionPool(max_connections=2, keepalive_timeout=30, connect_timeout=2, read_timeout=5)
    release = asyncio.Event()

    async def slow_bodies(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n")
            await release.wait()  # a connection is busy until its body is complete
            writer.write(b"ok")

    async with Server(slow_bodies) as server:
        resps = await asyncio.gather(*(pool.request("POST", server.url(), [], b"{}") for _ in range(2)))
        third = asyncio.ensure_future(pool.request("POST", server.url(), [], b"{}"))
        done, _ = await asyncio.wait({third}, timeout=0.2)
        assert not done
        assert pool.open_connections == 2
        release.set()
        await resps[0].read()  # its connection goes back to the pool: the third request takes it
        assert await (await asyncio.wait_for(third, 5)).read() == b"ok"
        await resps[1].read()
        assert server.connections == 2
    await pool.close()


async def test_a_slow_reader_pauses_the_upstream(pool: ConnectionPool) -> None:
    size = 8 * http1.HIGH_WATER

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
        for _ in range(size // 65536):
            writer.write(b"x" * 65536)
            await writer.drain()

    async with Server(handler) as server:
        resp = await pool.request("POST", server.url(), [], b"{}")
        conn = resp.content._conn
        assert conn is not None
        paused = asyncio.Event()
        pause = conn.pause
        conn.pause = lambda: (pause(), paused.set())  # type: ignore[method-assign]
        if not conn._paused:  # (it may have filled up before the headers were handed over)
            await asyncio.wait_for(paused.wait(), 5)  # the server keeps writing until our buffer is full
        assert http1.HIGH_WATER <= resp.content._buffered < http1.HIGH_WATER + 2 * 65536
        assert len(await resp.read()) == size


async def test_errors_say_what_went_wrong(pool: ConnectionPool) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ConnectError):
        await pool.request("GET", URL(f"http://127.0.0.1:{port}/"), [], b"")

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"SPDY/9 what\r\n\r\n")
        await reader.read()

    async with Server(garbage) as server:
        with pytest.raises(ProtocolError):
            await pool.request("GET", server.url(), [], b"")


async def test_closing_a_response_drops_its_connection(pool: ConnectionPool) -> None:
    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n")
        await reader.read()  # until the client goes away

    async with Server(endless) as server:
        resp = await pool.request("POST", server.url(), [], b"{}")
        assert await resp.content.__anext__() == b"a"
        resp.close()
        assert pool.open_connections == 0
        with pytest.raises(UpstreamDisconnected):
            await resp.read()


async def test_header_bytes_that_are_not_utf8_leave_as_they_came(pool: ConnectionPool) -> None:
    heads: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head, _ = await read_request(reader)
        heads.append(head)
        writer.write(OK)

    async with Server(handler) as server:
        # what aiohttp's server hands over for a header byte 0xff
        resp = await pool.request(
            "GET", server.url(), [("X-Raw", b"a\xffb".decode("utf-8", "surrogateescape"))], b""
        )
        assert await resp.read() == b"ok"
    assert b"\r\nX-Raw: a\xffb\r\n" in heads[0]


async def test_a_connection_paused_by_its_last_read_is_pooled_reading(
    pool: ConnectionPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue #15 H2: a read that filled the buffer to the high-water mark paused the connection, the answer ended
    # in that read, and the connection went back to the pool paused: the next exchange on it waited forever.
    # With the mark at one byte, every answer's last read pauses its connection.
    monkeypatch.setattr(http1, "HIGH_WATER", 1)
    async with Server(answer_ok_forever) as server:
        for _ in range(3):
            resp = await asyncio.wait_for(pool.request("POST", server.url(), [], b"{}"), 5)
            assert await asyncio.wait_for(resp.read(), 5) == b"ok"
        assert server.connections == 1


async def test_bytes_past_the_content_length_close_the_connection(pool: ConnectionPool) -> None:
    # Issue #15 M6: the extra bytes parsed as a second answer put the connection into the pool twice; two callers
    # then shared one socket and one of them hung.
    extra = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstray"

    async def overlong_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = True
        while True:
            await read_request(reader)
            writer.write(OK + extra if first else OK)
            first = False

    async with Server(overlong_once) as server:
        resp = await pool.request("POST", server.url(), [], b"{}")
        assert await resp.read() == b"ok"
        assert sum(len(v) for v in pool._idle.values()) == 0
        again = await asyncio.wait_for(
            asyncio.gather(*(pool.request("POST", server.url(), [], b"{}") for _ in range(2))), 5
        )
        assert [await asyncio.wait_for(r.read(), 5) for r in again] == [b"ok", b"ok"]
        assert server.connections == 3


async def test_bytes_sent_to_an_idle_connection_close_it(pool: ConnectionPool) -> None:
    answered = asyncio.Event()

    async def late_bytes(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(OK)
        await answered.wait()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstray")
        await reader.read()

    async with Server(late_bytes) as server:
        resp = await pool.request("POST", server.url(), [], b"{}")
        assert await resp.read() == b"ok"
        assert pool.open_connections == 1
        answered.set()
        async with asyncio.timeout(5):
            while server.closed < 1:
                server.changed.clear()
                await server.changed.wait()
        assert pool.open_connections == 0


async def test_a_response_head_past_the_cap_is_refused(pool: ConnectionPool) -> None:
    async def huge_head(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n")
        for i in range(2 * http1.MAX_HEAD_BYTES // 1024):
            writer.write(b"X-Filler-%d: %s\r\n" % (i, b"x" * 1024))
            await writer.drain()
        await reader.read()

    async with Server(huge_head) as server:
        with pytest.raises(ProtocolError, match="head exceeds"):
            await asyncio.wait_for(pool.request("POST", server.url(), [], b"{}"), 5)
    assert pool.open_connections == 0


async def test_a_connection_lost_before_its_request_fails_at_once(pool: ConnectionPool) -> None:
    # Review of issue #15: an upstream that wrote at accept (or closed at once) had the connection aborted before
    # the request was sent; the exchange then waited for an answer nothing would give, read timeout or not.
    async def greets(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
        await writer.drain()
        await reader.read()

    async with Server(greets) as server:
        with pytest.raises((UpstreamDisconnected, ProtocolError)):
            await asyncio.wait_for(pool.request("POST", server.url(), [], b"{}"), 5)
    assert pool.open_connections == 0
