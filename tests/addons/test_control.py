"""Pause/hold/reject of LLM calls and the drain count: unit tests on flows, then through a real gateway."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import openai
import pytest
from prometheus_client import CollectorRegistry

from agl_lite.addons.control import METRICS_REGISTRY, Control, ServiceUnavailable
from agl_lite.addons.metrics import Metrics
from agl_lite.addons.router import Router
from agl_lite.client import AglLiteClient, DrainTimeout
from agl_lite.core.config import GatewayConfig
from agl_lite.core.contract import derive_key
from agl_lite.core.flow import Flow
from agl_lite.core.server import Gateway
from agl_lite.core.services import LoadContext
from agl_lite.errors import BadRequest, ConfigError, TooManyRequests
from agl_lite.testing import MockVLLM, Scenario, running_mock
from agl_lite.testing.flows import make_flow
from tests.client.conftest import NO_UPSTREAM
from tests.conftest import ADMIN_KEY, GatewayFactory, gateway_url

ROUTES = (*Router.routes, *Control.routes)
MESSAGES: Any = [{"role": "user", "content": "What is 2+3?"}]
AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}


def llm_flow() -> Flow:
    return make_flow("POST", "/v1/chat/completions", json_body={"model": "m"}, routes=ROUTES)


async def call(control: Control, method: str, path: str, body: bytes = b"", query: str = "") -> Flow:
    flow = make_flow(method, path, body=body, query_string=query, routes=ROUTES)
    await control.request(flow)
    return flow


async def pause(control: Control, **body: Any) -> Flow:
    return await call(control, "POST", "/api/gateway/pause", json.dumps(body).encode())


def answer(flow: Flow) -> dict[str, Any]:
    assert flow.response is not None
    return dict(json.loads(flow.response.body or b""))


# --- unit ------------------------------------------------------------------------------------------------------


async def test_llm_call_is_in_flight_from_request_to_flow_done() -> None:
    control, flow = Control(), llm_flow()
    await control.request(flow)
    assert flow.response is None
    assert control.in_flight == 1
    control.flow_done(flow)
    control.flow_done(flow)  # a second call must not count twice
    assert control.in_flight == 0


async def test_flow_done_of_a_call_that_never_reached_the_gate_changes_nothing() -> None:
    control = Control()
    control.flow_done(llm_flow())
    assert control.in_flight == 0


async def test_pause_with_empty_body_holds_with_the_default_timeout() -> None:
    control = Control(Control.Options(hold_timeout_s=7.0))
    state = answer(await call(control, "POST", "/api/gateway/pause"))
    assert state["paused"] is True
    assert (state["mode"], state["hold_timeout_s"]) == ("hold", 7.0)
    assert isinstance(state["paused_since"], float)


async def test_held_call_goes_on_after_resume_and_only_then_is_in_flight() -> None:
    control, flow = Control(), llm_flow()
    await pause(control)
    gate = asyncio.create_task(control.request(flow))
    await control.wait_until(lambda c: c.held == 1, timeout=5)
    assert control.in_flight == 0
    answer(await call(control, "POST", "/api/gateway/resume"))
    await asyncio.wait_for(gate, 5)
    assert (control.held, control.in_flight, flow.response) == (0, 1, None)
    assert flow.metadata["control.held_s"] >= 0


async def test_held_call_gets_503_with_retry_after_when_the_hold_times_out() -> None:
    control, flow = Control(Control.Options(retry_after_s=3)), llm_flow()
    await pause(control, hold_timeout_s=0.05)
    with pytest.raises(ServiceUnavailable) as info:
        await control.request(flow)
    assert info.value.headers == {"Retry-After": "3"}
    assert flow.metadata["control.rejected"] == "hold_timeout"
    assert (control.held, control.in_flight) == (0, 0)


async def test_reject_mode_answers_429_at_once() -> None:
    control, flow = Control(), llm_flow()
    await pause(control, mode="reject")
    with pytest.raises(TooManyRequests) as info:
        await control.request(flow)
    assert info.value.headers == {"Retry-After": "10"}
    assert flow.metadata["control.rejected"] == "paused"
    control.flow_done(flow)
    assert control.in_flight == 0


async def test_switching_to_reject_answers_held_calls_429() -> None:
    control = Control()
    await pause(control)
    gate = asyncio.create_task(control.request(llm_flow()))
    await control.wait_until(lambda c: c.held == 1, timeout=5)
    await pause(control, mode="reject")
    with pytest.raises(TooManyRequests):
        await asyncio.wait_for(gate, 5)
    assert control.held == 0


async def test_cancelled_held_call_leaves_the_counters_clean() -> None:
    control, flow = Control(), llm_flow()
    await pause(control)
    gate = asyncio.create_task(control.request(flow))
    await control.wait_until(lambda c: c.held == 1, timeout=5)
    gate.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gate
    control.flow_done(flow)
    assert (control.held, control.in_flight, flow.client_disconnected) == (0, 0, True)


async def test_api_routes_are_answered_while_paused() -> None:
    control = Control()
    await pause(control)
    models = make_flow("GET", "/v1/models", routes=ROUTES)
    await asyncio.wait_for(control.request(models), 5)
    assert control.held == 0
    assert answer(await call(control, "GET", "/api/gateway/state"))["paused"] is True


async def test_wait_drained_answers_once_the_last_call_is_done() -> None:
    control, flow = Control(), llm_flow()
    await control.request(flow)
    drained = asyncio.create_task(call(control, "GET", "/api/gateway/state", query="wait_drained=10"))
    done, _ = await asyncio.wait({drained}, timeout=0.05)
    assert not done  # still waiting: one call in flight
    control.flow_done(flow)
    assert answer(await asyncio.wait_for(drained, 5))["in_flight"] == 0


async def test_wait_drained_times_out_with_the_current_state() -> None:
    control = Control()
    await control.request(llm_flow())
    state = answer(await call(control, "GET", "/api/gateway/state", query="wait_drained=0.01"))
    assert state["in_flight"] == 1


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"[]",
        b'{"mode": "sleep"}',
        b'{"mode": 1}',
        b'{"hold_timeout_s": -1}',
        b'{"hold_timeout_s": "5"}',
        b'{"hold_timeout_s": true}',
        b'{"hold_timeout_s": Infinity}',
        b'{"mode": "hold", "extra": 1}',
    ],
)
async def test_bad_pause_body_is_400_and_changes_nothing(body: bytes) -> None:
    control = Control()
    with pytest.raises(BadRequest):
        await call(control, "POST", "/api/gateway/pause", body)
    assert (control.paused, control.mode) == (False, None)


@pytest.mark.parametrize("seconds", ["soon", "-1", "nan", ""])
async def test_bad_wait_drained_is_400(seconds: str) -> None:
    with pytest.raises(BadRequest):
        await call(Control(), "GET", "/api/gateway/state", query=f"wait_drained={seconds}")


def test_negative_option_stops_start_up() -> None:
    with pytest.raises(ConfigError, match="must be >= 0"):
        Control().configure(GatewayConfig(), Control.Options(hold_timeout_s=-1))


@pytest.mark.parametrize("field", ["max_in_flight", "max_held", "busy_retry_after_s"])
def test_negative_in_flight_cap_option_stops_start_up(field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        Control().configure(GatewayConfig(), Control.Options(**{field: -1}))


async def test_call_over_the_in_flight_cap_gets_503_with_retry_after_at_once() -> None:
    control = Control(Control.Options(max_in_flight=2, busy_retry_after_s=2))
    first, second, third = llm_flow(), llm_flow(), llm_flow()
    await control.request(first)
    await control.request(second)
    with pytest.raises(ServiceUnavailable) as info:
        await control.request(third)
    assert info.value.headers == {"Retry-After": "2"}
    assert "max_in_flight" in info.value.message
    assert third.metadata["control.rejected"] == "busy"
    control.flow_done(third)  # a refused call was never in flight
    assert (control.in_flight, control.refused_busy) == (2, 1)


async def test_a_call_done_frees_its_place_under_the_cap() -> None:
    control = Control(Control.Options(max_in_flight=1))
    first, second = llm_flow(), llm_flow()
    await control.request(first)
    control.flow_done(first)
    await control.request(second)
    assert (control.in_flight, control.refused_busy) == (1, 0)


async def test_without_a_cap_any_number_of_calls_is_admitted() -> None:
    control = Control(Control.Options(max_in_flight=0))
    for _ in range(3000):
        await control.request(llm_flow())
    assert (control.in_flight, control.refused_busy) == (3000, 0)


async def test_the_default_cap_is_the_upstream_connection_pool() -> None:
    control = Control()
    for _ in range(2048):
        await control.request(llm_flow())
    with pytest.raises(ServiceUnavailable):
        await control.request(llm_flow())


async def test_a_pause_holds_at_most_max_held_calls_and_answers_the_next_503_at_once() -> None:
    control = Control(Control.Options(max_held=2))
    await pause(control)
    held = [asyncio.create_task(control.request(llm_flow())) for _ in range(2)]
    await control.wait_until(lambda c: c.held == 2, timeout=5)
    extra = llm_flow()
    with pytest.raises(ServiceUnavailable) as info:
        await control.request(extra)
    assert (info.value.headers, extra.metadata["control.rejected"]) == ({"Retry-After": "10"}, "hold_full")
    await call(control, "POST", "/api/gateway/resume")
    await asyncio.wait_for(asyncio.gather(*held), 5)
    assert (control.held, control.in_flight) == (0, 2)


async def test_the_cap_never_refuses_api_routes() -> None:
    control = Control(Control.Options(max_in_flight=1))
    await control.request(llm_flow())
    state = answer(await call(control, "GET", "/api/gateway/state"))
    assert (state["in_flight"], state["max_in_flight"], state["refused_busy"]) == (1, 1, 0)
    assert answer(await pause(control))["paused"] is True


async def test_held_calls_are_not_counted_by_the_cap_and_resume_into_it() -> None:
    control = Control(Control.Options(max_in_flight=1))
    await pause(control)
    held = [asyncio.create_task(control.request(llm_flow())) for _ in range(3)]
    await control.wait_until(lambda c: c.held == 3, timeout=5)
    assert control.in_flight == 0
    await call(control, "POST", "/api/gateway/resume")
    results = await asyncio.wait_for(asyncio.gather(*held, return_exceptions=True), 5)
    refused = [r for r in results if isinstance(r, ServiceUnavailable)]
    assert (len(refused), control.in_flight, control.refused_busy) == (2, 1, 2)


async def test_in_flight_gauge_and_busy_counter_are_published() -> None:
    ctx, registry = LoadContext(), CollectorRegistry()
    control = Control(Control.Options(max_in_flight=1))
    ctx.services.provide(METRICS_REGISTRY, registry, by="test")
    control.load(ctx)
    control.configure(GatewayConfig(), None)
    await control.request(llm_flow())
    with pytest.raises(ServiceUnavailable):
        await control.request(llm_flow())
    assert registry.get_sample_value("agl_gateway_in_flight_requests") == 1.0
    assert registry.get_sample_value("agl_gateway_busy_refusals_total") == 1.0


async def test_paused_and_held_gauges_are_published_on_the_metrics_registry() -> None:
    ctx, registry, control = LoadContext(), CollectorRegistry(), Control()
    ctx.services.provide(METRICS_REGISTRY, registry, by="test")
    control.load(ctx)
    control.configure(GatewayConfig(), None)
    await pause(control)
    assert registry.get_sample_value("agl_gateway_paused") == 1.0
    assert registry.get_sample_value("agl_gateway_held_requests") == 0.0


# --- through a real gateway ------------------------------------------------------------------------------------


@dataclass
class Setup:
    mock: MockVLLM
    gateway: Gateway
    control: Control
    http: aiohttp.ClientSession
    sdk: openai.AsyncOpenAI

    async def post(self, path: str, body: Any = None) -> dict[str, Any]:
        async with self.http.post(path, json=body) as r:
            assert r.status == 200, await r.text()
            return dict(await r.json())

    async def state(self, query: str = "") -> dict[str, Any]:
        async with self.http.get("/api/gateway/state" + query) as r:
            assert r.status == 200, await r.text()
            return dict(await r.json())


@pytest.fixture
async def setup(gateway_factory: GatewayFactory) -> AsyncIterator[Setup]:
    mock, control = MockVLLM(("smollm2",)), Control()
    async with (
        running_mock(mock) as url,
        gateway_factory({"smollm2": [url]}, extra_addons=[control, Metrics()]) as gw,
        aiohttp.ClientSession(gateway_url(gw), headers=AUTH) as http,
        openai.AsyncOpenAI(base_url=gateway_url(gw) + "/v1", api_key=ADMIN_KEY, max_retries=0) as sdk,
    ):
        yield Setup(mock, gw, control, http, sdk)


async def test_held_sdk_call_completes_after_resume(setup: Setup) -> None:
    await setup.post("/api/gateway/pause", {"mode": "hold"})
    pending = asyncio.create_task(
        setup.sdk.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=5)
    )
    await setup.control.wait_until(lambda c: c.held == 1, timeout=5)
    state = await setup.state()
    assert (state["paused"], state["held"], state["in_flight"]) == (True, 1, 0)
    assert setup.mock.requests_total == 0
    assert (await setup.post("/api/gateway/resume"))["paused"] is False
    completion = await asyncio.wait_for(pending, 5)
    assert completion.choices[0].message.content
    await setup.control.wait_until(lambda c: c.in_flight == 0, timeout=5)


async def test_hold_timeout_answers_503_json_with_retry_after(setup: Setup) -> None:
    await setup.post("/api/gateway/pause", {"mode": "hold", "hold_timeout_s": 0.05})
    async with setup.http.post("/v1/chat/completions", json={"model": "smollm2", "messages": MESSAGES}) as r:
        assert (r.status, r.headers["Retry-After"]) == (503, "10")
        assert (await r.json())["error"]["type"] == "service_unavailable"
    assert setup.mock.requests_total == 0


async def test_reject_raises_rate_limit_error_in_the_sdk(setup: Setup) -> None:
    await setup.post("/api/gateway/pause", {"mode": "reject"})
    with pytest.raises(openai.RateLimitError) as info:
        await setup.sdk.chat.completions.create(model="smollm2", messages=MESSAGES)
    assert info.value.response.headers["Retry-After"] == "10"
    assert setup.mock.requests_total == 0


async def test_api_routes_are_not_paused(setup: Setup) -> None:
    await setup.post("/api/gateway/pause", {"mode": "hold"})
    models = await asyncio.wait_for(setup.sdk.models.list(), 5)
    assert [m.id for m in models.data] == ["smollm2"]
    assert (await setup.state())["held"] == 0


async def test_drain_waits_for_a_streaming_call_started_before_the_pause(setup: Setup) -> None:
    setup.mock.enqueue(Scenario(stall_after=2))
    stream = await setup.sdk.chat.completions.create(model="smollm2", messages=MESSAGES, stream=True)
    async for _ in stream:
        break
    await setup.post("/api/gateway/pause", {"mode": "hold"})
    assert (await setup.state())["in_flight"] == 1
    drained = asyncio.create_task(setup.state("?wait_drained=10"))
    done, _ = await asyncio.wait({drained}, timeout=0.1)
    assert not done  # the stream is still in flight
    await stream.close()
    assert (await asyncio.wait_for(drained, 5))["in_flight"] == 0


async def test_client_leaving_while_held_releases_it(setup: Setup) -> None:
    await setup.post("/api/gateway/pause", {"mode": "hold"})
    async with aiohttp.ClientSession(gateway_url(setup.gateway), headers=AUTH) as client:
        pending = asyncio.create_task(
            client.post("/v1/chat/completions", json={"model": "smollm2", "messages": MESSAGES})
        )
        await setup.control.wait_until(lambda c: c.held == 1, timeout=5)
        pending.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pending
    await setup.control.wait_until(lambda c: c.held == 0, timeout=5)
    await setup.post("/api/gateway/resume")
    completion = await setup.sdk.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=3)
    assert completion.choices
    assert (await setup.state())["in_flight"] == 0


async def test_bad_pause_request_is_a_400_json_error(setup: Setup) -> None:
    async with setup.http.post("/api/gateway/pause", data=b"{not json") as r:
        assert r.status == 400
        assert (await r.json())["error"]["type"] == "invalid_request"
    assert (await setup.state())["paused"] is False


async def test_call_over_the_in_flight_cap_is_a_503_json_error_and_never_reaches_the_upstream(
    gateway_factory: GatewayFactory,
) -> None:
    mock, control = MockVLLM(("smollm2",)), Control(Control.Options(max_in_flight=2))
    mock.enqueue(Scenario(stall_after=1), times=2)
    async with (
        running_mock(mock) as url,
        gateway_factory({"smollm2": [url]}, extra_addons=[control]) as gw,
        openai.AsyncOpenAI(base_url=gateway_url(gw) + "/v1", api_key=ADMIN_KEY, max_retries=0) as sdk,
    ):
        streams = [
            await sdk.chat.completions.create(model="smollm2", messages=MESSAGES, stream=True)
            for _ in range(2)
        ]
        await mock.wait_until(lambda m: m.stalled_streams == 2)
        with pytest.raises(openai.InternalServerError) as info:
            await sdk.chat.completions.create(model="smollm2", messages=MESSAGES)
        assert info.value.status_code == 503
        assert info.value.response.headers["Retry-After"] == "1"
        assert info.value.response.json()["error"]["type"] == "service_unavailable"
        assert mock.requests_total == 2
        for stream in streams:
            await stream.close()
        await control.wait_until(lambda c: c.in_flight == 0, timeout=5)
        completion = await sdk.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=3)
        assert completion.choices
    assert control.refused_busy == 1


async def test_pause_needs_the_admin_key(setup: Setup) -> None:
    agent = {"Authorization": f"Bearer {derive_key(ADMIN_KEY, 'ro-1')}"}
    async with setup.http.post("/api/gateway/pause", json={}, headers=agent) as r:
        assert r.status == 403
    assert (await setup.state())["paused"] is False


async def test_a_pause_through_one_gateway_pauses_every_gateway_on_the_store_and_its_drain_waits_for_them(
    gateway_factory: GatewayFactory, postgres_db: str
) -> None:
    """A weight sync asks one replica behind a Service: every replica must hold new calls, and the drain must wait
    for the calls in flight on all of them, not on the one that answered (#21)."""
    mock = MockVLLM(("smollm2",))
    mock.enqueue(Scenario(stall_after=1))
    control_a, control_b = Control(), Control()
    chain = ("store", "auth", "store_api", "route")
    store = {"store": {"dsn": postgres_db}}
    async with (
        running_mock(mock) as url,
        gateway_factory({"smollm2": [url]}, chain=chain, addons=store, extra_addons=[control_a]) as gw_a,
        gateway_factory({"smollm2": [url]}, chain=chain, addons=store, extra_addons=[control_b]) as gw_b,
        openai.AsyncOpenAI(base_url=gateway_url(gw_b) + "/v1", api_key=ADMIN_KEY, max_retries=0) as sdk_b,
        aiohttp.ClientSession(gateway_url(gw_a), headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as admin_a,
    ):
        stream = await sdk_b.chat.completions.create(model="smollm2", messages=MESSAGES, stream=True)
        await mock.wait_until(lambda m: m.stalled_streams == 1)  # in flight on b
        async with AglLiteClient(gateway_url(gw_a), ADMIN_KEY) as client_a:  # a weight sync's own guard
            with pytest.raises(DrainTimeout, match="in another gateway on the store"):
                async with client_a.paused(drain_timeout_s=0.5):
                    raise AssertionError("the weights must not be swapped with a call in flight on b")
        await control_b.wait_until(lambda c: not c.paused, timeout=10)  # (it resumed on the way out)
        async with admin_a.post("/api/gateway/pause", json={"mode": "hold"}) as r:
            assert r.status == 200
        await control_b.wait_until(lambda c: c.paused, timeout=10)
        assert control_b.pause_id == control_a.pause_id
        async with admin_a.get("/api/gateway/state?wait_drained=0.5") as r:
            state = await r.json()
        assert (state["in_flight"], state["others_drained"]) == (0, False)  # b still has its call
        held = asyncio.ensure_future(sdk_b.chat.completions.create(model="smollm2", messages=MESSAGES))
        await control_b.wait_until(lambda c: c.held == 1, timeout=10)  # a new call on b is held
        await stream.close()
        async with admin_a.get("/api/gateway/state?wait_drained=10") as r:
            assert (await r.json())["others_drained"] is True
        async with admin_a.post("/api/gateway/resume") as r:
            assert r.status == 200
        await control_b.wait_until(lambda c: not c.paused, timeout=10)
        assert (await asyncio.wait_for(held, 10)).choices  # released by the resume made on a


async def test_gateways_paused_and_resumed_side_by_side_end_alike(
    gateway_factory: GatewayFactory, postgres_db: str
) -> None:
    """Changes of the shared pause made at once through two gateways are applied everywhere in commit order: both
    end as the last one committed left them (each applying its own first ended them opposite, for good)."""
    controls = [Control(), Control()]
    store = {"store": {"dsn": postgres_db}}
    chain = ("store", "auth", "store_api")
    async with (
        gateway_factory(NO_UPSTREAM, chain=chain, addons=store, extra_addons=[controls[0]]) as gw_a,
        gateway_factory(NO_UPSTREAM, chain=chain, addons=store, extra_addons=[controls[1]]) as gw_b,
        AglLiteClient(gateway_url(gw_a), ADMIN_KEY) as a,
        AglLiteClient(gateway_url(gw_b), ADMIN_KEY) as b,
    ):
        for _ in range(10):
            await asyncio.gather(a.pause(), b.resume())
            await asyncio.gather(a.pause(), b.pause())
            await asyncio.gather(a.resume(), b.pause())
            state = [lambda c=c: (c.pause_id, c.paused) for c in controls]
            async with asyncio.timeout(10):
                # (until the notifications arrived: polled, bounded)
                while state[0]() != state[1]():  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
            assert controls[0]._version == controls[1]._version
