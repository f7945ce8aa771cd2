"""The relay: chunks flow as they come, the commit point holds the end, failures are contained and JSON."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from yarl import URL

from agl_lite.addons import DEFAULT_CHAIN
from agl_lite.addons.capture import Capture
from agl_lite.core.flow import Flow
from agl_lite.errors import ConfigError
from agl_lite.service import build_gateway
from agl_lite.store.records import CallOutcome
from agl_lite.testing.gateway import write_config
from agl_lite.testing.servers import serve_app
from tests.conftest import ADMIN_KEY, GatewayFactory, gateway_url

AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def chunk(text: str) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": text}}]}).encode() + b"\n\n"


class Probe:
    """Counts hooks per flow and can hold `response_end` until released."""

    def __init__(self, *, hold_end: bool = False) -> None:
        self.calls: Counter[str] = Counter()
        self.flows: list[Flow] = []
        self.hold_end = hold_end
        self.end_entered = asyncio.Event()
        self.release_end = asyncio.Event()
        self.done = asyncio.Event()

    async def response_end(self, flow: Flow) -> None:
        self.calls["response_end"] += 1
        self.end_entered.set()
        if self.hold_end:
            await self.release_end.wait()

    def error(self, flow: Flow) -> None:
        self.calls["error"] += 1

    def flow_done(self, flow: Flow) -> None:
        self.calls["flow_done"] += 1
        self.flows.append(flow)
        self.done.set()


@pytest.fixture
async def upstream() -> AsyncIterator[Callable[[Handler], Awaitable[str]]]:
    """`url = await upstream(handler)`: serve one POST handler at /v1/chat/completions; returns the base URL."""
    stack: list[object] = []

    async def start(handler: Handler) -> str:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", handler)
        cm = serve_app(app)
        url = await cm.__aenter__()
        stack.append(cm)
        return url + "/v1"

    yield start
    for cm in reversed(stack):
        await cm.__aexit__(None, None, None)  # type: ignore[attr-defined]


async def sse_start(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    return resp


async def test_chunk_reaches_client_before_upstream_sends_the_next(
    upstream: Callable[[Handler], Awaitable[str]], gateway_factory: GatewayFactory
) -> None:
    next_chunk = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = await sse_start(request)
        await resp.write(chunk("first"))
        await next_chunk.wait()  # the second chunk goes only once the client holds the first
        await resp.write(chunk("second"))
        await resp.write(b"data: [DONE]\n\n")
        return resp

    base = await upstream(handler)
    async with (
        gateway_factory({"m": [base]}) as gw,
        aiohttp.ClientSession() as s,
        s.post(gateway_url(gw) + "/v1/chat/completions", json={**CHAT, "stream": True}, headers=AUTH) as r,
    ):
        assert r.status == 200
        first = await asyncio.wait_for(r.content.readuntil(b"\n\n"), 5)
        assert b"first" in first
        next_chunk.set()
        rest = await asyncio.wait_for(r.content.read(), 5)
    assert rest == chunk("second") + b"data: [DONE]\n\n"


async def test_done_is_released_only_after_response_end(
    upstream: Callable[[Handler], Awaitable[str]], gateway_factory: GatewayFactory
) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = await sse_start(request)
        await resp.write(
            chunk("a") + b"data: [DONE]\n\n"
        )  # one read holds both: the split must happen inside it
        return resp

    probe = Probe(hold_end=True)
    base = await upstream(handler)
    async with gateway_factory({"m": [base]}, extra_addons=[probe]) as gw, aiohttp.ClientSession() as s:
        async with s.post(
            gateway_url(gw) + "/v1/chat/completions", json={**CHAT, "stream": True}, headers=AUTH
        ) as r:
            assert await asyncio.wait_for(r.content.readuntil(b"\n\n"), 5) == chunk("a")
            await asyncio.wait_for(probe.end_entered.wait(), 5)
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(r.content.readuntil(b"[DONE]"), 0.3)
            probe.release_end.set()
            assert await asyncio.wait_for(r.content.read(), 5) == b"data: [DONE]\n\n"
    assert probe.calls == {"response_end": 1, "flow_done": 1}


async def test_plain_body_is_released_only_after_response_end(
    upstream: Callable[[Handler], Awaitable[str]], gateway_factory: GatewayFactory
) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response({"id": "x", "choices": []})

    async def fetch(s: aiohttp.ClientSession, url: str) -> Any:
        async with s.post(url, json=CHAT, headers=AUTH) as r:
            return await r.json()

    probe = Probe(hold_end=True)
    base = await upstream(handler)
    async with gateway_factory({"m": [base]}, extra_addons=[probe]) as gw, aiohttp.ClientSession() as s:
        task = asyncio.ensure_future(fetch(s, gateway_url(gw) + "/v1/chat/completions"))
        await asyncio.wait_for(probe.end_entered.wait(), 5)
        # headers and body leave together, after the commit: nothing has arrived yet
        done, _ = await asyncio.wait({task}, timeout=0.3)
        assert not done
        probe.release_end.set()
        assert await asyncio.wait_for(task, 5) == {"id": "x", "choices": []}


async def test_upstream_reset_mid_stream_gives_in_band_error_and_ends(
    upstream: Callable[[Handler], Awaitable[str]], gateway_factory: GatewayFactory
) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = await sse_start(request)
        await resp.write(chunk("partial"))
        assert request.transport is not None
        request.transport.abort()  # connection reset: no [DONE], no chunk terminator
        return resp

    probe = Probe()
    base = await upstream(handler)
    async with gateway_factory({"m": [base]}, extra_addons=[probe]) as gw, aiohttp.ClientSession() as s:
        async with s.post(
            gateway_url(gw) + "/v1/chat/completions", json={**CHAT, "stream": True}, headers=AUTH
        ) as r:
            body = await asyncio.wait_for(r.content.read(), 5)
        await asyncio.wait_for(probe.done.wait(), 5)
    events = [e for e in body.split(b"\n\n") if e]
    assert events[0] == chunk("partial").rstrip(b"\n")
    error = json.loads(events[-1].removeprefix(b"data: "))
    assert error["error"]["type"] == "upstream_error"
    assert b"[DONE]" not in body
    assert probe.calls == {"error": 1, "flow_done": 1}
    assert probe.flows[0].error is not None


async def test_client_disconnect_closes_the_upstream_connection(
    upstream: Callable[[Handler], Awaitable[str]], gateway_factory: GatewayFactory
) -> None:
    upstream_closed = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = await sse_start(request)
        await resp.write(chunk("one"))
        try:
            await asyncio.Event().wait()  # stall until the gateway drops us
        finally:
            upstream_closed.set()
        return resp

    probe = Probe()
    base = await upstream(handler)
    async with gateway_factory({"m": [base]}, extra_addons=[probe]) as gw:
        async with aiohttp.ClientSession() as s:
            r = await s.post(
                gateway_url(gw) + "/v1/chat/completions", json={**CHAT, "stream": True}, headers=AUTH
            )
            await asyncio.wait_for(r.content.readuntil(b"\n\n"), 5)
            r.close()  # the client goes away mid-stream
        await asyncio.wait_for(upstream_closed.wait(), 5)
        await asyncio.wait_for(probe.done.wait(), 5)
    assert probe.flows[0].client_disconnected
    assert probe.calls == {"error": 1, "flow_done": 1}


async def test_upstream_down_gives_502_json_and_gateway_keeps_serving(
    upstream: Callable[[Handler], Awaitable[str]],
    gateway_factory: GatewayFactory,
    unused_tcp_port_factory: Callable[[], int],
) -> None:
    async def ok(request: web.Request) -> web.StreamResponse:
        return web.json_response({"ok": True})

    dead = [f"http://127.0.0.1:{unused_tcp_port_factory()}/v1" for _ in range(2)]
    live = await upstream(ok)
    async with gateway_factory({"down": dead, "up": [live]}) as gw, aiohttp.ClientSession() as s:
        url = gateway_url(gw) + "/v1/chat/completions"
        async with s.post(url, json={**CHAT, "model": "down"}, headers=AUTH) as r:
            assert r.status == 502
            assert (await r.json())["error"]["type"] == "upstream_error"
        async with s.post(url, json={**CHAT, "model": "up"}, headers=AUTH) as r:
            assert r.status == 200
            assert await r.json() == {"ok": True}


async def test_503_is_retried_on_the_next_upstream(
    upstream: Callable[[Handler], Awaitable[str]], gateway_factory: GatewayFactory
) -> None:
    hits: Counter[str] = Counter()

    async def busy(request: web.Request) -> web.StreamResponse:
        hits["busy"] += 1
        return web.json_response({"error": "overloaded"}, status=503)

    async def ok(request: web.Request) -> web.StreamResponse:
        hits["ok"] += 1
        return web.json_response({"ok": True})

    urls = [await upstream(busy), await upstream(ok)]
    async with gateway_factory({"m": urls}, strategy="round_robin") as gw, aiohttp.ClientSession() as s:
        for _ in range(4):
            async with s.post(gateway_url(gw) + "/v1/chat/completions", json=CHAT, headers=AUTH) as r:
                assert r.status == 200
    assert hits["ok"] == 4
    assert 1 <= hits["busy"] <= 4


async def test_upstream_request_carries_upstream_credential_not_the_client_key(
    upstream: Callable[[Handler], Awaitable[str]], gateway_factory: GatewayFactory
) -> None:
    seen: list[dict[str, str]] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        seen.append(dict(request.headers))
        return web.json_response(await request.json())

    base = await upstream(handler)
    async with (
        gateway_factory({"m": [base]}, served_model={"m": "served-name"}) as gw,
        aiohttp.ClientSession() as s,
    ):
        hdrs = {**AUTH, "x-api-key": ADMIN_KEY, "Connection": "keep-alive", "Accept-Encoding": "gzip"}
        async with s.post(gateway_url(gw) + "/v1/chat/completions", json=CHAT, headers=hdrs) as r:
            echoed = await r.json()
    assert echoed["model"] == "served-name"
    (headers,) = seen
    assert ADMIN_KEY not in json.dumps(headers)
    assert "Authorization" not in headers
    assert "X-Api-Key" not in headers
    assert headers["Accept-Encoding"] == "identity"


async def test_oversize_body_gives_413_json(gateway_factory: GatewayFactory) -> None:
    async with (
        gateway_factory({"m": ["http://127.0.0.1:9/v1"]}, extra={"server": {"max_body_bytes": 1000}}) as gw,
        aiohttp.ClientSession() as s,
    ):
        body = {**CHAT, "pad": "x" * 2000}
        async with s.post(gateway_url(gw) + "/v1/chat/completions", json=body, headers=AUTH) as r:
            assert r.status == 413
            assert (await r.json())["error"]["type"] == "payload_too_large"


async def test_body_above_aiohttp_default_limit_is_accepted(
    upstream: Callable[[Handler], Awaitable[str]], gateway_factory: GatewayFactory
) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response({"received": len(await request.read())})

    base = await upstream(handler)
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * (3 * 1024 * 1024)}]}
    async with gateway_factory({"m": [base]}) as gw, aiohttp.ClientSession() as s:
        async with s.post(gateway_url(gw) + "/v1/chat/completions", json=big, headers=AUTH) as r:
            assert r.status == 200
            assert (await r.json())["received"] > 3 * 1024 * 1024


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "type_"),
    [
        ("POST", "/v1/chat/completions", b"{not json", 400, "invalid_request"),
        ("POST", "/v1/chat/completions", b'{"messages": []}', 400, "invalid_request"),
        ("POST", "/v1/chat/completions", b'{"model": 7}', 400, "invalid_request"),
        ("POST", "/v1/chat/completions", b"[1, 2]", 400, "invalid_request"),
        ("POST", "/v1/chat/completions", b"", 400, "invalid_request"),
        ("POST", "/v1/chat/completions", b'{"model": "nope"}', 404, "model_not_found"),
        ("GET", "/v1/no/such/path", b"", 404, "not_found"),
        ("GET", "/v1/chat/completions", b"", 405, "method_not_allowed"),
        ("POST", "/v1/chat/completions", b'{"model": "\xff\xfe"}', 400, "invalid_request"),
    ],
)
async def test_bad_input_gets_a_json_error(
    gateway_factory: GatewayFactory, method: str, path: str, body: bytes, status: int, type_: str
) -> None:
    async with gateway_factory({"m": ["http://127.0.0.1:9/v1"]}) as gw, aiohttp.ClientSession() as s:
        async with s.request(method, gateway_url(gw) + path, data=body, headers=AUTH) as r:
            assert r.status == status
            payload = await r.json()
    assert payload["error"]["type"] == type_
    assert payload["error"]["message"]
    assert "Traceback" not in json.dumps(payload)


class BadHeaders:
    """Answers with a header value aiohttp refuses to send: a bug in an addon, after the request hooks."""

    def request(self, flow: Flow) -> None:
        from agl_lite.core.flow import json_response

        flow.response = json_response(200, {}, headers={"X-Bad": "line\nbreak"})


async def test_unexpected_failure_still_answers_json_500(gateway_factory: GatewayFactory) -> None:
    probe = Probe()
    async with gateway_factory({"m": ["http://127.0.0.1:9/v1"]}, extra_addons=[BadHeaders(), probe]) as gw:
        async with aiohttp.ClientSession() as s, s.get(gateway_url(gw) + "/healthz") as r:
            assert r.status == 500
            assert (await r.json())["error"]["type"] == "internal_error"
    assert probe.calls["flow_done"] == 1


class _FailsWhenRunning:
    """An addon whose `running` hook fails: start() must undo everything it set up."""

    def __init__(self) -> None:
        self.shut_down = False

    def running(self) -> None:
        raise RuntimeError("cannot reach its store")

    def shutdown(self) -> None:
        self.shut_down = True


async def test_a_failing_running_hook_stops_the_gateway_and_frees_its_port(tmp_path: Path) -> None:
    addon = _FailsWhenRunning()
    gateway = build_gateway(write_config(tmp_path, {"m": ["http://127.0.0.1:9/v1"]}), [addon])
    with pytest.raises(ConfigError, match="failed to start"):
        await gateway.start()
    assert addon.shut_down
    assert gateway.upstream._pool is None  # closed and dropped
    with socket.socket() as probe:  # the port is free again: nothing is left listening
        probe.bind(("127.0.0.1", gateway.port))


@pytest.mark.parametrize("upstream", [{"read_timeout": 0}, {"read_timeout": -1}, {"keepalive_timeout": -1}])
def test_a_read_timeout_that_is_over_or_a_negative_keepalive_is_a_config_error(
    tmp_path: Path, upstream: dict[str, float]
) -> None:
    config = write_config(tmp_path, {"m": ["http://127.0.0.1:9/v1"]}, extra={"upstream": upstream})
    with pytest.raises(ConfigError, match=next(iter(upstream))):
        build_gateway(config, [])


class _Order:
    """Records the order of the lifecycle: configured, the `configured` callback, running."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def configure(self, config: Any, options: Any) -> None:
        self.seen.append("configure")

    def running(self) -> None:
        self.seen.append("running")


async def test_configured_runs_once_every_addon_is_configured_and_before_any_runs(tmp_path: Path) -> None:
    """Where `serve` makes the process non-dumpable and wipes its keys: before a `running` hook (the runner's)
    can start an agent that would read them."""
    order = _Order()
    gateway = build_gateway(write_config(tmp_path, {"m": ["http://127.0.0.1:9/v1"]}), [order])
    await gateway.start(configured=lambda: order.seen.append("configured"))
    try:
        assert order.seen == ["configure", "configured", "running"]
    finally:
        await gateway.stop()


def _route_state(gw: Any) -> Any:
    return next(a.addon for a in gw.addons.addons if a.name == "route")


@pytest.mark.parametrize("stream", [False, True])
async def test_a_client_that_leaves_before_the_upstream_answers_leaves_one_record(
    upstream: Callable[[Handler], Awaitable[str]], gateway_factory: GatewayFactory, stream: bool
) -> None:
    # Issue #15 H1: cancelled while the upstream's headers were awaited, the flow fired neither `response_end` nor
    # `error` (no record), and the upstream's in-flight count stayed one too high for good.
    reached = asyncio.Event()
    upstream_closed = asyncio.Event()

    async def queued(request: web.Request) -> web.StreamResponse:
        reached.set()
        try:
            await asyncio.Event().wait()  # a long queue: not even the headers come
        finally:
            upstream_closed.set()
        raise AssertionError("unreachable")

    probe = Probe()
    base = await upstream(queued)
    async with gateway_factory({"m": [base]}, extra_addons=[Capture(), probe]) as gw:
        async with aiohttp.ClientSession() as s:
            post = asyncio.ensure_future(
                s.post(
                    gateway_url(gw) + "/v1/chat/completions", json={**CHAT, "stream": stream}, headers=AUTH
                )
            )
            await asyncio.wait_for(reached.wait(), 5)
            assert _route_state(gw)._by_name["m"].upstreams[0].inflight == 1
            post.cancel()  # the client times out and goes away
            with pytest.raises(asyncio.CancelledError):
                await post
        await asyncio.wait_for(probe.done.wait(), 5)
        await asyncio.wait_for(upstream_closed.wait(), 5)
        assert _route_state(gw)._by_name["m"].upstreams[0].inflight == 0
    assert probe.calls == {"error": 1, "flow_done": 1}
    record = probe.flows[0].metadata["capture.record"]
    assert (record.outcome, record.upstream) == (CallOutcome.CLIENT_DISCONNECTED, base)


async def test_a_flow_cut_by_shutdown_is_answered_and_recorded_as_aborted_within_the_timeout(
    upstream: Callable[[Handler], Awaitable[str]], tmp_path: Path
) -> None:
    # Issue #15 (low): the outcome said `client_disconnected` for flows the shutdown ended, and the shutdown took
    # 23 s with shutdown_timeout = 10 (aiohttp waits the timeout once for the handlers, once more after
    # cancelling them).
    reached = asyncio.Event()

    async def queued(request: web.Request) -> web.StreamResponse:
        reached.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    probe = Probe()
    base = await upstream(queued)
    config = write_config(tmp_path, {"m": [base]}, extra={"server": {"shutdown_timeout": 1.0}})
    gateway = build_gateway(config, [Capture(), probe])
    await gateway.start()
    async with aiohttp.ClientSession() as s:
        post = asyncio.ensure_future(
            s.post(gateway_url(gateway) + "/v1/chat/completions", json=CHAT, headers=AUTH)
        )
        await asyncio.wait_for(reached.wait(), 5)
        began = time.monotonic()
        await gateway.stop()
        took = time.monotonic() - began
        resp = await post
        assert resp.status == 503
        assert (await resp.json())["error"]["type"] == "shutting_down"
    assert 0.7 <= took < 1.8, took  # the flows had their time, and no more
    flow = probe.flows[0]
    assert not flow.client_disconnected
    assert flow.metadata["capture.record"].outcome is CallOutcome.ABORTED


async def test_a_body_that_is_not_what_its_content_encoding_says_is_a_json_400(
    upstream: Callable[[Handler], Awaitable[str]], gateway_factory: GatewayFactory
) -> None:
    # Issue #15 M1: aiohttp's own decoding answered a plain-text 500 and logged a traceback.
    async def never(request: web.Request) -> web.StreamResponse:
        raise AssertionError("an undecodable body must not be forwarded")

    base = await upstream(never)
    async with gateway_factory({"m": [base]}) as gw, aiohttp.ClientSession(auto_decompress=False) as s:
        for encoding, status, kind in [
            ("gzip", 400, "invalid_request"),
            ("deflate", 400, "invalid_request"),
            ("br", 415, "unsupported_media_type"),
        ]:
            headers = {**AUTH, "Content-Encoding": encoding, "Content-Type": "application/json"}
            async with s.post(
                gateway_url(gw) + "/v1/chat/completions", data=json.dumps(CHAT), headers=headers
            ) as r:
                assert r.status == status
                assert r.headers["Content-Type"].startswith("application/json")
                assert (await r.json())["error"]["type"] == kind


async def test_a_compressed_body_is_forwarded_decoded_and_without_its_content_encoding(
    upstream: Callable[[Handler], Awaitable[str]], gateway_factory: GatewayFactory
) -> None:
    seen: list[tuple[str | None, bytes]] = []

    async def echo(request: web.Request) -> web.StreamResponse:
        seen.append((request.headers.get("Content-Encoding"), await request.read()))
        return web.json_response({"ok": True})

    base = await upstream(echo)
    raw = json.dumps(CHAT).encode()
    async with gateway_factory({"m": [base]}) as gw, aiohttp.ClientSession() as s:
        headers = {**AUTH, "Content-Encoding": "gzip", "Content-Type": "application/json"}
        async with s.post(
            gateway_url(gw) + "/v1/chat/completions", data=gzip.compress(raw), headers=headers
        ) as r:
            assert r.status == 200
    assert seen == [(None, raw)]


async def test_a_request_without_a_valid_key_is_answered_before_its_body_is_read(
    gateway_factory: GatewayFactory,
) -> None:
    # Issue #15 M3: up to max_body_bytes were read (and held) before the key was checked.
    async with gateway_factory({"m": ["http://127.0.0.1:9/v1"]}) as gw:
        for key in ("", "Authorization: Bearer not-a-key\r\n"):
            reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
            writer.write(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + key.encode()
                + b"Content-Length: 60000000\r\n\r\n{"  # 60 MB announced, one byte sent
            )
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)  # not after the body timeout
            assert head.startswith(b"HTTP/1.1 401 ")
            assert b"Connection: close" in head
            writer.close()


OVERSIZED = {
    # (streamed, the bytes after one fine event, then a piece sent again and again: four times the cap, bounded)
    "a stream's endless line": (True, b"data: {", b'"x": 1,' * 585),
    "a plain body": (False, b"data: {", b'"x": 1,' * 585),
    # A review after issue #15: the cap bounded a line, but capture and the translations hold a whole event until
    # its blank line: short lines and never a blank one grew their buffers without bound.
    "short lines, LF, never a blank one": (True, b"", b'data: {"choices":[]}\n' * 100),
    "short lines, CRLF, never a blank one": (True, b"", b'data: {"choices":[]}\r\n' * 100),
    "short lines, CR, never a blank one": (True, b"", b'data: {"choices":[]}\r' * 100),
}


@pytest.mark.parametrize(("stream", "opening", "piece"), OVERSIZED.values(), ids=OVERSIZED.keys())
async def test_an_upstream_line_or_body_past_max_event_bytes_fails_the_call(
    upstream: Callable[[Handler], Awaitable[str]],
    gateway_factory: GatewayFactory,
    stream: bool,
    opening: bytes,
    piece: bytes,
) -> None:
    # Issue #15 M7: one 400 MB event line drove a call to 1.26 GB: capture parses each line whole.
    cap = 256 * 1024

    async def oversized(request: web.Request) -> web.StreamResponse:
        resp = (
            await sse_start(request)
            if stream
            else web.StreamResponse(headers={"Content-Type": "application/json"})
        )
        if not stream:
            await resp.prepare(request)
        await resp.write(chunk("fine") + opening)
        try:
            for _ in range(4 * cap // len(piece) + 1):
                await resp.write(piece)
        except ConnectionError:
            pass
        return resp

    probe = Probe()
    base = await upstream(oversized)
    async with (
        gateway_factory(
            {"m": [base]}, extra={"upstream": {"max_event_bytes": cap}}, extra_addons=[Capture(), probe]
        ) as gw,
        aiohttp.ClientSession() as s,
    ):
        async with s.post(
            gateway_url(gw) + "/v1/chat/completions", json={**CHAT, "stream": stream}, headers=AUTH
        ) as r:
            try:
                received = await r.read()
            except (
                aiohttp.ClientPayloadError
            ):  # a plain body is cut: its status went out with its first bytes
                received = b""
        await asyncio.wait_for(probe.done.wait(), 5)
    if stream:
        assert b"max_event_bytes" in received.rsplit(b"data: ", 1)[-1]
    record = probe.flows[0].metadata["capture.record"]
    assert record.outcome is CallOutcome.UPSTREAM_ERROR
    assert "max_event_bytes" in record.error


@pytest.mark.parametrize("ids", ["-1", "null", "4294967296"])
async def test_a_long_stream_whose_ids_do_not_decode_reaches_the_client_whole(
    upstream: Callable[[Handler], Awaitable[str]], gateway_factory: GatewayFactory, ids: str
) -> None:
    # A review after issue #15: past 256 KiB capture decodes a stream's events on the way, in its tap; ids that
    # are no token ids raised into the relay, which cut the client's stream and logged a traceback.
    head = '{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":'
    event = f'data: {head}[{{"index":0,"delta":{{"content":"x"}},"token_ids":[{ids}]}}]}}\n\n'.encode()
    count = 300 * 1024 // len(event) + 1  # bounded: past the first batch decode

    async def bad_ids(request: web.Request) -> web.StreamResponse:
        resp = await sse_start(request)
        for _ in range(count):
            await resp.write(event)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    probe = Probe()
    base = await upstream(bad_ids)
    async with (
        gateway_factory({"m": [base]}, extra_addons=[Capture(), probe]) as gw,
        aiohttp.ClientSession() as s,
    ):
        async with s.post(
            gateway_url(gw) + "/v1/chat/completions", json={**CHAT, "stream": True}, headers=AUTH
        ) as r:
            received = await r.read()
        await asyncio.wait_for(probe.done.wait(), 5)
    assert r.status == 200
    assert received.count(b"data: {") == count
    assert received.endswith(b"data: [DONE]\n\n")
    record = probe.flows[0].metadata["capture.record"]
    assert record.outcome is CallOutcome.UPSTREAM_ERROR
    assert "capture could not assemble" in record.error


TRANSLATED = {
    "anthropic": (
        "/v1/messages",
        {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
    ),
    "responses": ("/v1/responses", {"model": "m", "input": "hi"}),
}
BAD_USAGE = {"usage": {"prompt_tokens": "a", "completion_tokens": 1}}
UNCONVERTIBLE = [
    # (the API, streamed, the upstream's answer past its first event: fields of a type a translation did not take)
    ("anthropic", True, {"choices": 5}),
    ("responses", True, {"choices": 5}),
    ("anthropic", True, {"choices": [{"index": 0, "delta": {"tool_calls": 1}, "finish_reason": None}]}),
    ("responses", True, {"choices": [{"index": 0, "delta": {"tool_calls": 1}, "finish_reason": None}]}),
    ("responses", True, {"choices": [], **BAD_USAGE}),
    ("anthropic", False, {"choices": 5}),
    ("responses", False, {"choices": [{"index": 0, "message": {"tool_calls": 1}, "finish_reason": "stop"}]}),
    ("responses", False, {"choices": [{"index": 0, "message": {"content": "x"}}], **BAD_USAGE}),
]


async def translated_call(
    upstream: Callable[[Handler], Awaitable[str]],
    gateway_factory: GatewayFactory,
    answer: Handler,
    api: str,
    stream: bool,
) -> tuple[aiohttp.ClientResponse, bytes, Any]:
    """One call of `api` (Anthropic Messages, the Responses API) through a translating gateway whose upstream
    answers with `answer`: the client's response, the body it read whole, and the call's record."""
    probe = Probe()
    base = await upstream(answer)
    path, body = TRANSLATED[api]
    headers = {**AUTH, "x-api-key": ADMIN_KEY, "anthropic-version": "2023-06-01"}
    async with (
        gateway_factory(
            {"m": [base]}, chain=["auth", "route", "anthropic", "responses", "capture"], extra_addons=[probe]
        ) as gw,
        aiohttp.ClientSession() as s,
    ):
        async with s.post(gateway_url(gw) + path, json={**body, "stream": stream}, headers=headers) as r:
            received = await r.read()  # whole: not cut
        await asyncio.wait_for(probe.done.wait(), 5)
    return r, received, probe.flows[0].metadata["capture.record"]


@pytest.mark.parametrize(("api", "stream", "bad"), UNCONVERTIBLE)
async def test_an_upstream_field_a_translation_cannot_take_is_an_error_the_client_reads(
    upstream: Callable[[Handler], Awaitable[str]],
    gateway_factory: GatewayFactory,
    api: str,
    stream: bool,
    bad: dict[str, Any],
) -> None:
    # A review after issue #15: a translation given a field of a type it does not expect raised into the relay,
    # which cut the client's stream (or answered 500 internal_error) and logged a traceback.
    head = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    first = {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hi"}}]}

    async def answer(request: web.Request) -> web.StreamResponse:
        if not stream:
            return web.json_response({**head, "object": "chat.completion", **bad})
        resp = await sse_start(request)
        for event in (first, {**head, **bad}):
            await resp.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    r, received, record = await translated_call(upstream, gateway_factory, answer, api, stream)
    assert b"could not be converted for the client" in received
    if stream:
        assert r.status == 200
        # the call must not look complete: no end of message, no completed response
        assert b"message_stop" not in received
        assert b"response.completed" not in received
    else:
        assert r.status == 502
        assert r.headers["Content-Type"].startswith("application/json")
    # (its error: this one, or capture's own when it could not assemble the same fields first)
    assert record.outcome is CallOutcome.UPSTREAM_ERROR


@pytest.mark.parametrize("api", TRANSLATED)
async def test_a_whole_answer_a_translation_refuses_leaves_a_failed_record(
    upstream: Callable[[Handler], Awaitable[str]], gateway_factory: GatewayFactory, api: str
) -> None:
    # A review after issue #15: the client got the translation's 502, but `response_end` had already recorded the
    # upstream's answer as `ok`, a success the client never saw (and a Responses API id it could build on).
    async def no_choice(request: web.Request) -> web.StreamResponse:
        return web.json_response({"id": "c", "object": "chat.completion", "model": "m", "choices": []})

    r, received, record = await translated_call(upstream, gateway_factory, no_choice, api, False)
    assert r.status == 502
    assert b"is not a chat completion" in received
    assert record.outcome is CallOutcome.UPSTREAM_ERROR
    assert "is not a chat completion" in record.error


async def test_the_query_string_is_forwarded_as_the_client_encoded_it(
    upstream: Callable[[Handler], Awaitable[str]], gateway_factory: GatewayFactory
) -> None:
    # Issue #15 (low): `%20` reached the upstream as a raw space in its request line.
    seen: list[str] = []

    async def echo(request: web.Request) -> web.StreamResponse:
        seen.append(request.raw_path)
        return web.json_response({"ok": True})

    base = await upstream(echo)
    async with gateway_factory({"m": [base]}) as gw, aiohttp.ClientSession() as s:
        url = URL(gateway_url(gw) + "/v1/chat/completions?a=%20b&c=d%26e&f=%2F", encoded=True)
        async with s.post(url, json=CHAT, headers=AUTH) as r:
            assert r.status == 200
    assert seen == ["/v1/chat/completions?a=%20b&c=d%26e&f=%2F"]


async def test_a_keep_alive_connection_gets_503_while_the_shutdown_drains(
    upstream: Callable[[Handler], Awaitable[str]], tmp_path: Path
) -> None:
    # Review of issue #15: during the drain the listening socket was closed but kept-alive connections were still
    # served, and such flows were never cut.
    reached = asyncio.Event()

    async def queued(request: web.Request) -> web.StreamResponse:
        reached.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    base = await upstream(queued)
    config = write_config(tmp_path, {"m": [base]}, extra={"server": {"shutdown_timeout": 2.0}})
    gateway = build_gateway(config, [])
    await gateway.start()
    url = gateway_url(gateway)
    async with aiohttp.ClientSession() as s, aiohttp.ClientSession() as other:
        async with other.get(url + "/healthz") as r:  # a kept-alive connection, idle
            assert r.status == 200
        stalled = asyncio.ensure_future(s.post(url + "/v1/chat/completions", json=CHAT, headers=AUTH))
        await asyncio.wait_for(reached.wait(), 5)
        stopping = asyncio.ensure_future(gateway.stop())
        await asyncio.wait_for(gateway.stopping.wait(), 5)
        async with other.get(url + "/healthz") as r:
            assert r.status == 503
            assert (await r.json())["error"]["type"] == "shutting_down"
        await stopping
        assert (await stalled).status == 503


async def test_a_client_that_reads_nothing_holds_the_upstream_back(
    upstream: Callable[[Handler], Awaitable[str]], gateway_factory: GatewayFactory
) -> None:
    # The stream's chunks after the first go straight to the client's transport (`_ChunkSender`): what the client
    # does not read must stop the relay (and so the upstream), never pile up in the gateway.
    event = b"data: " + b"x" * 8186 + b"\n\n"  # 8 KiB
    total = 16384  # events: 128 MiB, far more than the socket buffers on the way hold (tens of MB at most)
    written = 0
    in_write = False
    finished = asyncio.Event()

    async def flood(request: web.Request) -> web.StreamResponse:
        nonlocal written, in_write
        resp = await sse_start(request)
        for _ in range(total):
            in_write = True
            await resp.write(event)
            in_write = False
            written += len(event)
        await resp.write(b"data: [DONE]\n\n")
        finished.set()
        return resp

    base = await upstream(flood)
    async with gateway_factory({"m": [base]}) as gw:
        client = socket.create_connection(("127.0.0.1", gw.port))
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        client.setblocking(False)
        body = json.dumps({**CHAT, "stream": True}).encode()
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN_KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(client, head.encode() + body)
        # The client reads nothing. Until the upstream is held in a write, or (the bug) has sent everything.
        stalled, seen = 0, -1
        for _ in range(400):  # at most 20 s
            if finished.is_set():
                break
            stalled = stalled + 1 if (in_write and written == seen) else 0
            if stalled >= 6:  # the same write pending for 0.3 s
                break
            seen = written
            await asyncio.sleep(0.05)
        assert not finished.is_set(), "the gateway took the whole stream while its client read nothing"
        assert written < total * len(event) // 2
        received, head, tail = 0, b"", b""
        while not tail.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n"):  # now the client reads, to the end
            data = await asyncio.wait_for(loop.sock_recv(client, 1 << 20), 20)
            assert data, "the stream ended early"
            if not head:  # (the response head is in the first read)
                head, _, data = data.partition(b"\r\n\r\n")
            received += data.count(b"x")
            tail = (tail + data)[-64:]
        client.close()
    assert finished.is_set()
    assert received == total * 8186  # every byte, and nothing more


async def test_a_stream_to_an_http_1_0_client_is_sent_unframed_and_ends_with_the_connection(
    upstream: Callable[[Handler], Awaitable[str]], gateway_factory: GatewayFactory
) -> None:
    # HTTP/1.0 has no chunked encoding: the stream's bytes go as they are and the connection's end ends them.
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = await sse_start(request)
        for word in ("one", "two", "three"):
            await resp.write(chunk(word))
        await resp.write(b"data: [DONE]\n\n")
        return resp

    base = await upstream(handler)
    async with gateway_factory({"m": [base]}) as gw:
        body = json.dumps({**CHAT, "stream": True}).encode()
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(
            b"POST /v1/chat/completions HTTP/1.0\r\nAuthorization: Bearer "
            + ADMIN_KEY.encode()
            + b"\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
        raw = await asyncio.wait_for(reader.read(), 10)  # until the gateway closes the connection
        writer.close()
    head, _, payload = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200") or head.startswith(b"HTTP/1.1 200")
    assert b"transfer-encoding" not in head.lower()
    assert payload == chunk("one") + chunk("two") + chunk("three") + b"data: [DONE]\n\n"


_NOT_A_COMPLETION: dict[str, Callable[[], web.Response]] = {
    "204": lambda: web.Response(status=204),
    "html": lambda: web.Response(body=b"<html>busy</html>", content_type="text/html"),
    "gzip": lambda: web.Response(
        body=gzip.compress(b'{"choices": []}'),
        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
    ),
    "json, no completion": lambda: web.json_response({"choices": [{"index": 0}]}),
}
_TRANSLATED = {
    "/v1/messages": {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
    "/v1/responses": {"model": "m", "input": "hi"},
}


@pytest.mark.parametrize("path", list(_TRANSLATED))
@pytest.mark.parametrize("answer", list(_NOT_A_COMPLETION))
async def test_a_translated_call_whose_upstream_answer_is_no_completion_gets_a_502_json(
    upstream: Callable[[Handler], Awaitable[str]], gateway_factory: GatewayFactory, path: str, answer: str
) -> None:
    """The translation's error with the upstream's status and headers went out: a JSON body after a 204 (read by
    the client as the start of its next response), an error under `text/html` or `Content-Encoding: gzip`."""

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        return _NOT_A_COMPLETION[answer]()

    base = await upstream(handler)
    headers = {"Authorization": f"Bearer {ADMIN_KEY}", "anthropic-version": "2023-06-01"}
    async with (
        gateway_factory({"m": [base]}, chain=DEFAULT_CHAIN, addons={"store": {"path": "agl.db"}}) as gw,
        aiohttp.ClientSession(auto_decompress=False) as session,
    ):
        for _ in range(2):  # the second call on the same kept-alive connection reads a response of its own
            async with session.post(gateway_url(gw) + path, json=_TRANSLATED[path], headers=headers) as r:
                body = json.loads(await r.read())
                assert (r.status, r.headers["Content-Type"], r.headers.get("Content-Encoding")) == (
                    502,
                    "application/json",
                    None,
                )
                assert "error" in body


async def test_an_event_stream_is_one_whatever_the_case_of_its_media_type(
    upstream: Callable[[Handler], Awaitable[str]], gateway_factory: GatewayFactory
) -> None:
    """`Text/Event-Stream` is `text/event-stream` (media types ignore case): relayed, captured and stripped as
    a stream, not read as a plain body."""

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "Text/Event-Stream; charset=utf-8"})
        await resp.prepare(request)
        await resp.write(chunk("hi"))
        await resp.write(b"data: [DONE]\n\n")
        return resp

    base = await upstream(handler)
    async with gateway_factory({"m": [base]}) as gw, aiohttp.ClientSession() as session:
        async with session.post(
            gateway_url(gw) + "/v1/chat/completions",
            json={"model": "m", "messages": [], "stream": True},
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        ) as r:
            await r.read()
            assert (r.status, r.headers.get("X-Accel-Buffering")) == (200, "no")


async def test_a_stream_whose_upstream_never_ends_its_body_after_done_still_ends_for_the_client(
    upstream: Callable[[Handler], Awaitable[str]], gateway_factory: GatewayFactory
) -> None:
    """`[DONE]` waits for the commit and then for the upstream's end of body; when that end never comes (the
    read times out), the record says `ok` and the client must get its whole stream too, not a cut connection."""
    release = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = await sse_start(request)
        await resp.write(chunk("hi") + b"data: [DONE]\n\n")
        await release.wait()  # the body's end never comes (until the test is over)
        return resp

    base = await upstream(handler)
    try:
        async with (
            gateway_factory({"m": [base]}, extra={"upstream": {"read_timeout": 0.3}}) as gw,
            aiohttp.ClientSession() as session,
        ):
            async with session.post(
                gateway_url(gw) + "/v1/chat/completions",
                json={"model": "m", "messages": [], "stream": True},
                headers={"Authorization": f"Bearer {ADMIN_KEY}"},
            ) as r:
                body = await r.read()  # a cut connection raises ClientPayloadError here
            assert body.endswith(b"data: [DONE]\n\n")
    finally:
        release.set()


@pytest.mark.parametrize(
    ("path", "end", "failed"),
    [
        ("/v1/messages", b"event: message_stop", b"event: error"),
        ("/v1/responses", b"event: response.completed", b"event: response.failed"),
    ],
)
async def test_a_translated_stream_whose_upstream_never_ends_its_body_after_done_still_ends_whole(
    upstream: Callable[[Handler], Awaitable[str]],
    gateway_factory: GatewayFactory,
    path: str,
    end: bytes,
    failed: bytes,
) -> None:
    """As a chat stream: the translation's own end (`message_stop`, `response.completed`) is owed from the
    upstream's `[DONE]` on, held for the commit, and sent when the end of body does not come (the read times out):
    the client gets its whole answer and the record says `ok`, not a timeout in place of the end."""
    release = asyncio.Event()
    finish = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = await sse_start(request)
        await resp.write(chunk("hi") + finish + b"data: [DONE]\n\n")
        await release.wait()  # the body's end never comes (until the test is over)
        return resp

    base = await upstream(handler)
    probe = Probe()
    headers = {"Authorization": f"Bearer {ADMIN_KEY}", "anthropic-version": "2023-06-01"}
    try:
        async with (
            gateway_factory(
                {"m": [base]},
                chain=DEFAULT_CHAIN,
                addons={"store": {"path": "agl.db"}},
                extra={"upstream": {"read_timeout": 0.3}},
                extra_addons=[probe],
            ) as gw,
            aiohttp.ClientSession() as session,
        ):
            body = {**_TRANSLATED[path], "stream": True}
            async with session.post(gateway_url(gw) + path, json=body, headers=headers) as r:
                received = await r.read()  # a cut connection raises ClientPayloadError here
            await asyncio.wait_for(probe.done.wait(), 5)
        assert end in received
        assert failed not in received
        assert probe.flows[0].metadata["capture.record"].outcome is CallOutcome.OK
    finally:
        release.set()


async def test_expect_100_continue_is_answered_before_the_body_and_not_forwarded(
    upstream: Callable[[Handler], Awaitable[str]], gateway_factory: GatewayFactory
) -> None:
    """curl sends `Expect: 100-continue` with a body over 1 KB and waits for the 100 (a second, unanswered); the
    header must not reach the upstream (whose own 417 would become the answer), nor another expectation pass."""
    seen: list[str | None] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get("Expect"))
        return web.json_response({"choices": []})

    base = await upstream(handler)
    async with gateway_factory({"m": [base]}) as gw:
        body = json.dumps({"model": "m", "messages": [], "pad": "x" * 2000}).encode()
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN_KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        )
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write((head + "Expect: 100-continue\r\n\r\n").encode())
        assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(body)
        assert (await asyncio.wait_for(reader.readline(), 5)).startswith(b"HTTP/1.1 200")
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write((head + "Expect: 200-ok\r\n\r\n").encode() + body)
        status = await asyncio.wait_for(reader.readline(), 5)
        writer.close()
        # A body over the cap is not invited (then read and refused): a 413 in place of the 100.
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        too_big = head.replace(f"Content-Length: {len(body)}", f"Content-Length: {10**12}")
        writer.write((too_big + "Expect: 100-continue\r\n\r\n").encode())
        refused = await asyncio.wait_for(reader.readline(), 5)
        writer.close()
    assert status.startswith(b"HTTP/1.1 417")
    assert refused.startswith(b"HTTP/1.1 413")
    assert seen == [None]
