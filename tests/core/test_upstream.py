"""Upstream.open against real local servers: failover, retryable statuses, timeouts, and the headers sent."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from yarl import URL

from agl_lite.core.config import UpstreamConfig
from agl_lite.core.flow import Flow, UpstreamTarget
from agl_lite.core.upstream import Upstream
from agl_lite.errors import UpstreamError
from agl_lite.testing.flows import make_flow


class Observer:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, bool | None]] = []

    def attempt_started(self, target: UpstreamTarget) -> None:
        self.events.append(("start", target.name, None))

    def attempt_ended(self, target: UpstreamTarget, *, ok: bool) -> None:
        self.events.append(("end", target.name, ok))


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    up = Upstream(UpstreamConfig(read_timeout=0.5))
    await up.start()
    yield up
    await up.close()


def closed_port_url() -> str:
    """A loopback URL nothing listens on: connecting is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1/x"


async def serve(handler: web.Handler) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_route("*", "/v1/x", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}/v1/x"


def flow_to(*urls: str, observer: Observer | None = None, headers: dict[str, str] | None = None) -> Flow:
    f = make_flow("GET", "/healthz", headers=headers)
    f.upstreams = [UpstreamTarget(URL(u), name=u, observer=observer) for u in urls]
    return f


async def test_connect_failure_moves_on_to_the_next_target(upstream: Upstream) -> None:
    async def ok(request: web.Request) -> web.Response:
        return web.Response(body=b"ok")

    runner, b = await serve(ok)
    a = closed_port_url()
    try:
        obs = Observer()
        resp = await upstream.open(f := flow_to(a, b, observer=obs))
        assert (resp.status, await resp.read()) == (200, b"ok")
        assert f.upstream is not None
        assert f.upstream.name == b
        assert obs.events == [("start", a, None), ("end", a, False), ("start", b, None)]
    finally:
        await runner.cleanup()


async def test_retryable_status_moves_on_but_not_past_the_last_target(upstream: Upstream) -> None:
    async def busy(request: web.Request) -> web.Response:
        return web.Response(status=503, body=b"busy " + request.host.encode())

    runner_a, a = await serve(busy)
    runner_b, b = await serve(busy)
    try:
        resp = await upstream.open(flow_to(a, b))
        assert resp.status == 503  # the last target's answer is relayed as it is
        assert await resp.read() == f"busy {URL(b).host}:{URL(b).port}".encode()
    finally:
        await runner_a.cleanup()
        await runner_b.cleanup()


async def test_every_target_down_is_an_upstream_error(upstream: Upstream) -> None:
    silent = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)  # accepts, never answers
    b = f"http://127.0.0.1:{silent.sockets[0].getsockname()[1]}/v1/x"
    try:
        with pytest.raises(UpstreamError) as info:
            await upstream.open(flow_to(closed_port_url(), b))
        assert info.value.type == "upstream_timeout"
    finally:
        silent.close()


async def test_client_key_and_hop_by_hop_headers_never_go_upstream(upstream: Upstream) -> None:
    seen: list[dict[str, str]] = []

    async def record(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        return web.Response()

    runner, url = await serve(record)
    headers = {
        "Authorization": "Bearer client-key",
        "x-api-key": "client-key",
        "Connection": "close",
        "Accept-Encoding": "gzip",
        "X-Trace": "t1",
    }
    try:
        f = flow_to(url, headers=headers)
        f.upstreams[0].headers = {"Authorization": "Bearer upstream-key"}
        resp = await upstream.open(f)
        await resp.read()
    finally:
        await runner.cleanup()
    (sent,) = seen
    assert sent.pop("Host") == f"127.0.0.1:{URL(url).port}"
    assert sent == {"X-Trace": "t1", "Accept-Encoding": "identity", "Authorization": "Bearer upstream-key"}
