"""Metrics: Prometheus text exposition at `GET /metrics` from the addon's own registry (never the global one).

Counts every flow in `flow_done` (requests, durations, upstream errors, tokens from `capture.record`'s usage).
Other addons add their own metrics to the registry it provides as the `metrics` service, without importing it.

The per-flow counts are plain numbers (`agl_lite.core.prom`), turned into metric families only when scraped
(`_FlowCounts`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from multidict import CIMultiDict
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agl_lite.core.config import GatewayConfig, option
from agl_lite.core.flow import Flow, Response
from agl_lite.core.prom import Histogram, counter_family, histogram_family
from agl_lite.core.routes import HttpRoute, RouteKind, Scope
from agl_lite.core.services import METRICS_REGISTRY, LoadContext
from agl_lite.errors import UpstreamError

__all__ = ["DURATION_BUCKETS", "Metrics"]


_MAX_CHILDREN = 10_000

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
"""Seconds: a cached API answer takes milliseconds, a long agentic generation minutes."""


class _FlowCounts(Collector):
    """What `flow_done` counts, as plain numbers; metric families are built from them at scrape time."""

    def __init__(self) -> None:
        self.requests: dict[tuple[str, str, str], int] = {}
        self.duration: dict[tuple[str, ...], Histogram] = {}
        self.first_byte: dict[tuple[str, ...], Histogram] = {}
        self.tokens: dict[tuple[str, str], int] = {}
        self.upstream_errors: dict[tuple[str, ...], int] = {}
        self.upstream_requests: dict[tuple[str, ...], int] = {}
        self.in_flight = 0

    def collect(self) -> Iterator[Metric]:
        yield counter_family(
            "agl_requests",
            "Finished flows by route, status class and outcome.",
            ["route", "status", "outcome"],
            self.requests,
        )
        yield histogram_family(
            "agl_request_duration_seconds",
            "Time from request read to response end, by route.",
            ["route"],
            self.duration,
        )
        yield histogram_family(
            "agl_llm_time_to_first_byte_seconds",
            "Time to the upstream's first body byte, by model.",
            ["model"],
            self.first_byte,
        )
        yield GaugeMetricFamily(
            "agl_llm_in_flight",
            "LLM calls past this addon's place in the chain, not yet done.",
            self.in_flight,
        )
        yield counter_family(
            "agl_llm_tokens",
            "Tokens the upstream reported in usage, by model and kind (prompt, completion).",
            ["model", "kind"],
            self.tokens,
        )
        yield counter_family(
            "agl_upstream_errors",
            "Upstream failures (unreachable, timeout, reset, retryable status) and 5xx answers, by model and "
            "upstream; an attempt that failed and was retried on another upstream counts too.",
            ["model", "upstream", "type"],
            self.upstream_errors,
        )
        yield counter_family(
            "agl_upstream_requests",
            "Attempts on each upstream by outcome: the status class of its answer, `error` (no answer, or the "
            "answer failed mid-response) or `cancelled` (the client left, or the gateway ended the call).",
            ["model", "upstream", "status"],
            self.upstream_requests,
        )


def _bounded(counts: dict[Any, Any], key: Any) -> Any:
    """`key`, or an `other` key once a family has _MAX_CHILDREN label sets (label values come from routes and
    models, so they are bounded anyway: this is cheap insurance)."""
    if key in counts or len(counts) < _MAX_CHILDREN:
        return key
    return ("other",) * len(key)


class Metrics:
    short_name = "metrics"
    """Its name in a chain, and what other addons' `after` call it."""
    # Public, as Prometheus scrapers expect: the route table is built before options are read, so the scope
    # cannot be an option yet. It shows counts, route and model names; never keys, rollout ids or bodies.
    routes = (
        HttpRoute(
            "metrics",
            "GET",
            "/metrics",
            Scope.PUBLIC,
            RouteKind.API,
            "Prometheus metrics.",
            media="text/plain",
        ),
    )

    @dataclass(frozen=True, slots=True)
    class Options:
        process: bool = option(True, "Also export the process's CPU, memory and open files (`process_*`).")

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.counts = _FlowCounts()
        self.registry.register(self.counts)
        self._llm_flows: set[int] = set()
        self._process_collector: ProcessCollector | None = None

    # --- hooks -----------------------------------------------------------------------------------------------

    def load(self, ctx: LoadContext) -> None:
        ctx.services.provide(METRICS_REGISTRY, self.registry, by="metrics")

    def configure(self, config: GatewayConfig, options: Metrics.Options | None) -> None:
        if (options or Metrics.Options()).process and self._process_collector is None:
            self._process_collector = ProcessCollector(registry=self.registry)

    def request(self, flow: Flow) -> None:
        route = flow.route
        if route.kind is RouteKind.LLM:
            self._llm_flows.add(flow.id)
            self.counts.in_flight += 1
        elif route.name == "metrics":
            flow.response = Response(
                status=200,
                headers=CIMultiDict({"Content-Type": CONTENT_TYPE_LATEST}),
                body=generate_latest(self.registry),
            )

    def flow_done(self, flow: Flow) -> None:
        counts = self.counts
        route = flow.route.name
        response = flow.response
        status = f"{response.status // 100}xx" if response is not None else "none"
        if flow.client_disconnected:
            outcome = "client_disconnected"
        elif flow.error is not None or response is None:
            outcome = "error"
        else:
            outcome = "ok"
        _count(counts.requests, (route, status, outcome))
        _observe(counts.duration, (route,), (flow.t_end or time.monotonic()) - flow.t_start)
        if flow.id not in self._llm_flows:
            return
        self._llm_flows.discard(flow.id)
        counts.in_flight -= 1
        model = str(flow.metadata.get("route.model") or "unknown")
        if flow.t_first_byte is not None:
            _observe(counts.first_byte, (model,), flow.t_first_byte - flow.t_start)
        for upstream, error_type in flow.retried:  # failed attempts a later upstream replaced
            _count(counts.upstream_errors, (model, upstream, error_type))
            _count(counts.upstream_requests, (model, upstream, "error"))
        target = flow.upstream
        name = target.name if target is not None else "none"
        if isinstance(flow.error, UpstreamError):
            _count(counts.upstream_errors, (model, name, flow.error.type))
            attempt = "error"
        elif response is not None and response.from_upstream:
            if response.status >= 500:
                _count(counts.upstream_errors, (model, name, f"http_{response.status}"))
            attempt = f"{response.status // 100}xx"
        else:
            attempt = "cancelled"  # the client left, or the gateway cut or refused the call
        if target is not None:
            _count(counts.upstream_requests, (model, name, attempt))
        self._count_tokens(flow, model)

    def _count_tokens(self, flow: Flow, model: str) -> None:
        # The capture addon's LLMCall, read by shape: addons never import each other, and it may be absent.
        record = flow.metadata.get("capture.record")
        usage = getattr(record, "usage", None)
        if not isinstance(usage, Mapping):
            return
        model = str(getattr(record, "model", None) or model)
        tokens = self.counts.tokens
        for kind in ("prompt", "completion"):
            n = usage.get(f"{kind}_tokens")
            if isinstance(n, int) and not isinstance(n, bool) and n > 0:
                _count(tokens, (model, kind), n)


def _count(counts: dict[Any, int], key: tuple[str, ...], n: int = 1) -> None:
    key = _bounded(counts, key)
    counts[key] = counts.get(key, 0) + n


def _observe(histograms: dict[tuple[str, ...], Histogram], key: tuple[str, ...], value: float) -> None:
    h = histograms.get(key)
    if h is None:
        key = _bounded(histograms, key)
        h = histograms.get(key)
        if h is None:
            h = histograms[key] = Histogram(DURATION_BUCKETS)
    h.observe(value)
