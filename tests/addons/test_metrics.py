"""Prometheus exposition: what flow_done counts, the shared registry, and /metrics through a real gateway."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import openai
import pytest
from multidict import CIMultiDict
from prometheus_client import REGISTRY, Gauge
from prometheus_client.parser import text_string_to_metric_families
from yarl import URL

from agl_lite.addons.control import Control
from agl_lite.addons.metrics import Metrics
from agl_lite.addons.router import Router
from agl_lite.core.config import GatewayConfig
from agl_lite.core.flow import Flow, Response, UpstreamTarget, json_response
from agl_lite.core.services import METRICS_REGISTRY, LoadContext
from agl_lite.errors import UpstreamError, UpstreamTimeout
from agl_lite.testing import MockVLLM, running_mock
from agl_lite.testing.flows import make_flow
from tests.conftest import ADMIN_KEY, GatewayFactory, gateway_url

ROUTES = (*Router.routes, *Metrics.routes)
MESSAGES: Any = [{"role": "user", "content": "What is 2+3?"}]


@dataclass
class FakeRecord:
    """Shaped like the capture addon's LLMCall, as far as metrics reads it."""

    model: str | None = "smollm2"
    usage: Any = field(default_factory=lambda: {"prompt_tokens": 11, "completion_tokens": 4})


U1, U2 = "http://127.0.0.1:18001/v1", "http://127.0.0.1:18002/v1"


def llm_flow(upstream: str | None = U1) -> Flow:
    flow = make_flow("POST", "/v1/chat/completions", json_body={"model": "m"}, routes=ROUTES)
    flow.metadata["route.model"] = "m"
    if upstream is not None:
        flow.upstream = UpstreamTarget(URL(upstream + "/chat/completions"), name=upstream)
    return flow


def upstream_response(status: int) -> Response:
    return Response(status=status, headers=CIMultiDict(), from_upstream=True)


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def scrape(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


# --- unit ------------------------------------------------------------------------------------------------------


def test_metrics_route_answers_prometheus_text() -> None:
    metrics, flow = Metrics(), make_flow("GET", "/metrics", routes=ROUTES)
    metrics.request(flow)
    assert flow.response is not None
    assert flow.response.headers["Content-Type"].startswith("text/plain")
    names = {f.name for f in text_string_to_metric_families((flow.response.body or b"").decode())}
    assert {"agl_requests", "agl_request_duration_seconds", "agl_llm_in_flight"} <= names


def test_metrics_route_is_public() -> None:
    assert [r.scope.value for r in Metrics.routes] == ["public"]


def test_flow_done_counts_the_request_by_route_status_class_and_outcome() -> None:
    metrics, flow = Metrics(), make_flow("GET", "/v1/models", routes=ROUTES)
    flow.response = json_response(200, {})
    metrics.flow_done(flow)
    assert sample(metrics, "agl_requests_total", route="models", status="2xx", outcome="ok") == 1
    assert sample(metrics, "agl_request_duration_seconds_count", route="models") == 1


def test_client_disconnect_is_its_own_outcome() -> None:
    metrics, flow = Metrics(), llm_flow()
    flow.client_disconnected = True
    metrics.flow_done(flow)
    labels = {"route": "chat_completions", "status": "none", "outcome": "client_disconnected"}
    assert sample(metrics, "agl_requests_total", **labels) == 1


def test_llm_in_flight_rises_in_request_and_falls_in_flow_done_once() -> None:
    metrics, flow = Metrics(), llm_flow()
    metrics.request(flow)
    assert sample(metrics, "agl_llm_in_flight") == 1
    metrics.flow_done(flow)
    metrics.flow_done(make_flow("GET", "/v1/models", routes=ROUTES))  # never counted as in flight
    assert sample(metrics, "agl_llm_in_flight") == 0


def test_tokens_are_counted_from_the_capture_records_usage() -> None:
    metrics, flow = Metrics(), llm_flow()
    metrics.request(flow)
    flow.metadata["capture.record"] = FakeRecord()
    metrics.flow_done(flow)
    assert sample(metrics, "agl_llm_tokens_total", model="smollm2", kind="prompt") == 11
    assert sample(metrics, "agl_llm_tokens_total", model="smollm2", kind="completion") == 4


@pytest.mark.parametrize(
    "record",
    [object(), FakeRecord(usage=None), FakeRecord(usage={"prompt_tokens": "11", "completion_tokens": True})],
)
def test_a_record_without_usable_usage_counts_no_tokens(record: Any) -> None:
    metrics, flow = Metrics(), llm_flow()
    metrics.request(flow)
    flow.metadata["capture.record"] = record
    metrics.flow_done(flow)
    assert sample(metrics, "agl_llm_tokens_total", model="smollm2", kind="prompt") is None
    labels = {"route": "chat_completions", "status": "none", "outcome": "error"}
    assert sample(metrics, "agl_requests_total", **labels) == 1


def test_upstream_failure_is_counted_by_type() -> None:
    metrics, flow = Metrics(), llm_flow()
    metrics.request(flow)
    flow.error = UpstreamTimeout("upstream x timed out")
    metrics.flow_done(flow)
    assert sample(metrics, "agl_upstream_errors_total", model="m", upstream=U1, type="upstream_timeout") == 1
    assert sample(metrics, "agl_upstream_requests_total", model="m", upstream=U1, status="error") == 1


def test_a_failure_with_no_upstream_to_try_is_counted_too() -> None:
    metrics, flow = Metrics(), llm_flow(upstream=None)
    metrics.request(flow)
    flow.error = UpstreamError("no upstream is configured for this request")
    metrics.flow_done(flow)
    assert (
        sample(metrics, "agl_upstream_errors_total", model="m", upstream="none", type="upstream_error") == 1
    )


def test_failures_a_retry_recovered_are_counted_per_upstream() -> None:
    metrics, flow = Metrics(), llm_flow(upstream=U2)
    metrics.request(flow)
    flow.retried = [(U1, "upstream_error"), (U1, "http_503")]
    flow.response = upstream_response(200)
    metrics.flow_done(flow)
    assert sample(metrics, "agl_upstream_errors_total", model="m", upstream=U1, type="upstream_error") == 1
    assert sample(metrics, "agl_upstream_errors_total", model="m", upstream=U1, type="http_503") == 1
    assert sample(metrics, "agl_upstream_errors_total", model="m", upstream=U2, type="http_200") is None
    assert sample(metrics, "agl_upstream_requests_total", model="m", upstream=U1, status="error") == 2
    assert sample(metrics, "agl_upstream_requests_total", model="m", upstream=U2, status="2xx") == 1


def test_a_call_the_client_left_is_not_the_upstreams_error() -> None:
    metrics, flow = Metrics(), llm_flow()
    metrics.request(flow)
    flow.client_disconnected = True
    metrics.flow_done(flow)
    assert sample(metrics, "agl_upstream_requests_total", model="m", upstream=U1, status="cancelled") == 1
    assert sample(metrics, "agl_upstream_requests_total", model="m", upstream=U1, status="error") is None


def test_upstream_5xx_answer_is_counted_but_a_4xx_is_not() -> None:
    metrics = Metrics()
    for status in (503, 400):
        flow = llm_flow()
        metrics.request(flow)
        flow.response = upstream_response(status)
        metrics.flow_done(flow)
    assert sample(metrics, "agl_upstream_errors_total", model="m", upstream=U1, type="http_503") == 1
    assert sample(metrics, "agl_upstream_errors_total", model="m", upstream=U1, type="http_400") is None
    assert sample(metrics, "agl_upstream_requests_total", model="m", upstream=U1, status="4xx") == 1


def test_registry_is_provided_as_a_service_and_is_not_the_global_one() -> None:
    ctx, metrics = LoadContext(), Metrics()
    metrics.load(ctx)
    assert ctx.services.get(METRICS_REGISTRY) is metrics.registry
    assert metrics.registry is not REGISTRY


def test_another_addons_gauge_appears_in_the_exposition() -> None:
    ctx, metrics = LoadContext(), Metrics()
    metrics.load(ctx)
    registry = ctx.services.get(METRICS_REGISTRY)
    Gauge("agl_sink_queue_depth", "Records waiting to be committed.", registry=registry).set(3)
    flow = make_flow("GET", "/metrics", routes=ROUTES)
    metrics.request(flow)
    assert flow.response is not None
    assert scrape((flow.response.body or b"").decode())[("agl_sink_queue_depth", ())] == 3


def test_process_metrics_follow_the_option() -> None:
    on, off = Metrics(), Metrics()
    on.configure(GatewayConfig(), None)
    off.configure(GatewayConfig(), Metrics.Options(process=False))
    assert sample(on, "process_cpu_seconds_total") is not None
    assert sample(off, "process_cpu_seconds_total") is None


# --- through a real gateway ------------------------------------------------------------------------------------


@pytest.fixture
async def gateway_url_with_metrics(gateway_factory: GatewayFactory) -> AsyncIterator[str]:
    mock = MockVLLM(("smollm2",))
    async with (
        running_mock(mock) as url,
        gateway_factory({"smollm2": [url]}, extra_addons=[Control(), Metrics()]) as gw,
    ):
        yield gateway_url(gw)


async def test_metrics_endpoint_counts_requests_through_the_gateway(gateway_url_with_metrics: str) -> None:
    base = gateway_url_with_metrics
    async with openai.AsyncOpenAI(base_url=base + "/v1", api_key=ADMIN_KEY, max_retries=0) as sdk:
        await sdk.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=3)
        await sdk.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=3)
    async with aiohttp.ClientSession() as http, http.get(base + "/metrics") as r:  # no key: public
        assert r.status == 200
        samples = scrape(await r.text())
    ok = (("outcome", "ok"), ("route", "chat_completions"), ("status", "2xx"))
    assert samples[("agl_requests_total", ok)] == 2
    assert samples[("agl_llm_in_flight", ())] == 0
    assert samples[("agl_gateway_held_requests", ())] == 0  # published by Control through the shared registry


async def test_sink_publishes_queue_depth_and_commit_latency(gateway_factory: GatewayFactory) -> None:
    from agl_lite.addons import DEFAULT_CHAIN

    async with (
        running_mock(MockVLLM()) as url,
        gateway_factory(
            {"smollm2": [url]}, chain=DEFAULT_CHAIN, addons={"store": {"backend": "memory"}}
        ) as gw,
        aiohttp.ClientSession() as s,
    ):
        body = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        async with s.post(
            gateway_url(gw) + "/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        ) as r:
            assert r.status == 200
        async with s.get(gateway_url(gw) + "/metrics") as r:
            text = await r.text()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert "agl_store_write_queue_depth" in families
    (count,) = [s.value for s in families["agl_sink_commit_seconds"].samples if s.name.endswith("_count")]
    assert count == 1


def test_durations_fall_in_prometheus_le_buckets() -> None:
    """A duration equal to a bucket's bound counts in that bucket (`le`), one past it in the next."""
    metrics = Metrics()
    for seconds in (0.005, 0.0051, 1000.0):
        flow = make_flow("GET", "/v1/models", routes=ROUTES)
        flow.response = json_response(200, {})
        flow.t_start, flow.t_end = 0.0, seconds
        metrics.flow_done(flow)
    assert sample(metrics, "agl_request_duration_seconds_bucket", route="models", le="0.005") == 1
    assert sample(metrics, "agl_request_duration_seconds_bucket", route="models", le="0.01") == 2
    assert sample(metrics, "agl_request_duration_seconds_bucket", route="models", le="600.0") == 2
    assert sample(metrics, "agl_request_duration_seconds_bucket", route="models", le="+Inf") == 3
    assert sample(metrics, "agl_request_duration_seconds_count", route="models") == 3
    assert sample(metrics, "agl_request_duration_seconds_sum", route="models") == pytest.approx(1000.0101)
