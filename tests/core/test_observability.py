"""What an operator sees of every request: one access-log line and a count, whatever the request was (routed or
not, refused before its body, an Anthropic call rewritten for the upstream); upstream failures counted per
upstream even when a retry recovered them, and a stream cut mid-response logged."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import structlog
from prometheus_client.parser import text_string_to_metric_families

from agl_lite.addons import DEFAULT_CHAIN
from agl_lite.addons.metrics import Metrics
from agl_lite.testing import MockVLLM, Scenario, running_mock
from tests.addons.test_metrics import scrape as scrape_text
from tests.conftest import ADMIN_KEY, GatewayFactory, gateway_url

AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
CHAIN = ("auth", "route", "anthropic", "capture")
DEAD = "http://127.0.0.1:9/v1"  # the discard port: nothing listens there
DOCS = Path(__file__).resolve().parents[2] / "docs" / "observability.md"
LOG = {"log": {"access_log": True}, "server": {"max_body_bytes": 1000, "body_timeout_s": 0.2}}


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """One family's samples of a scrape, by their sorted labels."""
    return {labels: value for (n, labels), value in scrape_text(text).items() if n == name}


async def scrape(s: aiohttp.ClientSession, base: str) -> str:
    async with s.get(base + "/metrics") as r:
        return await r.text()


def access_lines(logged: list[dict[str, Any]]) -> list[tuple[str, str, str, int]]:
    return [(e["method"], e["path"], e["route"], e["status"]) for e in logged if e.get("event") == "flow"]


async def _stalled_body(port: int) -> bytes:
    """A request whose body never comes: its headers promise 100 bytes and one arrives."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        + ADMIN_KEY.encode()
        + b"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
    )
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(4096), 10)
    finally:
        writer.close()


async def test_every_request_gets_an_access_line_and_a_count(gateway_factory: GatewayFactory) -> None:
    async with (
        running_mock(MockVLLM(("m",))) as url,
        gateway_factory({"m": [url]}, chain=CHAIN, extra_addons=[Metrics()], extra=LOG) as gw,
        aiohttp.ClientSession() as s,
    ):
        base = gateway_url(gw)
        with structlog.testing.capture_logs() as logged:
            async with s.get(base + "/no/such/route") as r:
                assert r.status == 404
            async with s.delete(base + "/v1/chat/completions", headers=AUTH) as r:
                assert r.status == 405
            async with s.post(
                base + "/v1/chat/completions", json={**CHAT, "pad": "x" * 2000}, headers=AUTH
            ) as r:
                assert r.status == 413
            assert b" 408 " in (await _stalled_body(gw.port)).split(b"\r\n")[0]
            anthropic = {**AUTH, "anthropic-version": "2023-06-01"}
            body = {"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
            async with s.post(base + "/v1/messages", json=body, headers=anthropic) as r:
                assert r.status == 200
        text = await scrape(s, base)
    assert access_lines(logged) == [
        ("GET", "/no/such/route", "unmatched", 404),
        ("DELETE", "/v1/chat/completions", "unmatched", 405),
        ("POST", "/v1/chat/completions", "chat_completions", 413),
        ("POST", "/v1/chat/completions", "chat_completions", 408),
        ("POST", "/v1/messages", "messages", 200),  # the client's path, not the upstream's
    ]
    counts = samples(text, "agl_requests_total")
    assert counts[(("outcome", "ok"), ("route", "unmatched"), ("status", "4xx"))] == 2
    assert counts[(("outcome", "ok"), ("route", "chat_completions"), ("status", "4xx"))] == 2
    assert counts[(("outcome", "ok"), ("route", "messages"), ("status", "2xx"))] == 1


async def test_a_failure_a_retry_recovered_is_counted_for_its_upstream(
    gateway_factory: GatewayFactory,
) -> None:
    async with (
        running_mock(MockVLLM(("m",))) as url,
        gateway_factory(
            {"m": [DEAD, url]}, strategy="round_robin", chain=CHAIN, extra_addons=[Metrics()], extra=LOG
        ) as gw,
        aiohttp.ClientSession() as s,
    ):
        base = gateway_url(gw)
        for _ in range(2):  # round robin: one of the two tries the dead upstream first
            async with s.post(base + "/v1/chat/completions", json=CHAT, headers=AUTH) as r:
                assert r.status == 200
        text = await scrape(s, base)
    errors = samples(text, "agl_upstream_errors_total")
    assert errors == {(("model", "m"), ("type", "upstream_error"), ("upstream", DEAD)): 1.0}
    attempts = samples(text, "agl_upstream_requests_total")
    assert attempts[(("model", "m"), ("status", "error"), ("upstream", DEAD))] == 1
    assert attempts[(("model", "m"), ("status", "2xx"), ("upstream", url))] == 2
    # The route addon's own view of each upstream, through the shared registry.
    in_flight = samples(text, "agl_upstream_in_flight")
    assert in_flight == {(("model", "m"), ("upstream", DEAD)): 0.0, (("model", "m"), ("upstream", url)): 0.0}
    assert set(samples(text, "agl_upstream_cooling").values()) == {0.0}


async def test_a_stream_cut_mid_response_is_logged_and_counted(gateway_factory: GatewayFactory) -> None:
    mock = MockVLLM(("m",))
    async with (
        running_mock(mock) as url,
        gateway_factory({"m": [url]}, chain=CHAIN, extra_addons=[Metrics()], extra=LOG) as gw,
        aiohttp.ClientSession() as s,
    ):
        mock.enqueue(Scenario(reset_after=3))
        with structlog.testing.capture_logs() as logged:
            async with s.post(
                gateway_url(gw) + "/v1/chat/completions", json={**CHAT, "stream": True}, headers=AUTH
            ) as r:
                assert r.status == 200
                assert b'"error"' in await r.read()
        text = await scrape(s, gateway_url(gw))
    (cut,) = [e for e in logged if e["event"] == "upstream failed mid-response"]
    assert (cut["upstream"], cut["path"], cut["log_level"]) == (url, "/v1/chat/completions", "warning")
    assert cut["bytes_to_client"] > 0
    errors = samples(text, "agl_upstream_errors_total")
    assert errors == {(("model", "m"), ("type", "upstream_error"), ("upstream", url)): 1.0}


async def test_every_metric_the_default_chain_exposes_is_documented(gateway_factory: GatewayFactory) -> None:
    async with (
        running_mock(MockVLLM(("m",))) as url,
        gateway_factory({"m": [url]}, chain=DEFAULT_CHAIN, addons={"store": {"backend": "memory"}}) as gw,
        aiohttp.ClientSession() as s,
    ):
        async with s.post(gateway_url(gw) + "/v1/chat/completions", json=CHAT, headers=AUTH) as r:
            assert r.status == 200
        text = await scrape(s, gateway_url(gw))
    families = text_string_to_metric_families(text)
    # (`_created`: the client library's creation time of a counter, not a metric of ours)
    names = {f.name for f in families if f.name.startswith("agl_") and not f.name.endswith("_created")}
    assert len(names) >= 15
    documented = DOCS.read_text()
    missing = {n for n in names if f"`{n}" not in documented}
    assert not missing, f"docs/observability.md does not list {sorted(missing)}"
