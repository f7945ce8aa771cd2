"""Metrics: Prometheus text exposition at `GET /metrics` from the addon's own registry (never the global one).

Counts every flow in `flow_done` (requests, durations, upstream errors, tokens from `capture.record`'s usage).
Other addons add their own metrics to the registry it provides as the `metrics` service, without importing it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from multidict import CIMultiDict
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)

from agl_lite.core.config import GatewayConfig, option
from agl_lite.core.flow import Flow, Response
from agl_lite.core.routes import HttpRoute, RouteKind, Scope
from agl_lite.core.services import METRICS_REGISTRY, LoadContext
from agl_lite.errors import UpstreamError

__all__ = ["DURATION_BUCKETS", "Metrics"]


_MAX_CHILDREN = 10_000

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
"""Seconds: a cached API answer takes milliseconds, a long agentic generation minutes."""


class Metrics:
    # Public, as Prometheus scrapers expect: the route table is built before options are read, so the scope
    # cannot be an option yet. It shows counts, route and model names; never keys, rollout ids or bodies.
    routes = (HttpRoute("metrics", "GET", "/metrics", Scope.PUBLIC, RouteKind.API, "Prometheus metrics."),)

    @dataclass(frozen=True, slots=True)
    class Options:
        process: bool = option(True, "Also export the process's CPU, memory and open files (`process_*`).")

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "agl_requests",
            "Finished flows by route, status class and outcome.",
            ["route", "status", "outcome"],
            registry=r,
        )
        self.duration = Histogram(
            "agl_request_duration_seconds",
            "Time from request read to response end, by route.",
            ["route"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.first_byte = Histogram(
            "agl_llm_time_to_first_byte_seconds",
            "Time to the upstream's first body byte, by model.",
            ["model"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge(
            "agl_llm_in_flight", "LLM calls past this addon's place in the chain, not yet done.", registry=r
        )
        self.tokens = Counter(
            "agl_llm_tokens",
            "Tokens the upstream reported in usage, by model and kind (prompt, completion).",
            ["model", "kind"],
            registry=r,
        )
        self.upstream_errors = Counter(
            "agl_upstream_errors",
            "Upstream failures (unreachable, timeout, reset) and 5xx answers, by model.",
            ["model", "type"],
            registry=r,
        )
        self._llm_flows: set[int] = set()
        # Label children by their values: `labels()` validates, locks and builds a key on every call.
        self._children: dict[tuple[object, ...], Any] = {}
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
            self.in_flight.inc()
        elif route.name == "metrics":
            flow.response = Response(
                status=200,
                headers=CIMultiDict({"Content-Type": CONTENT_TYPE_LATEST}),
                body=generate_latest(self.registry),
            )

    def flow_done(self, flow: Flow) -> None:
        route = flow.route.name
        response = flow.response
        status = f"{response.status // 100}xx" if response is not None else "none"
        if flow.client_disconnected:
            outcome = "client_disconnected"
        elif flow.error is not None or response is None:
            outcome = "error"
        else:
            outcome = "ok"
        self._child(self.requests, route, status, outcome).inc()
        self._child(self.duration, route).observe((flow.t_end or time.monotonic()) - flow.t_start)
        if flow.id not in self._llm_flows:
            return
        self._llm_flows.discard(flow.id)
        self.in_flight.dec()
        model = str(flow.metadata.get("route.model") or "unknown")
        if flow.t_first_byte is not None:
            self._child(self.first_byte, model).observe(flow.t_first_byte - flow.t_start)
        if isinstance(flow.error, UpstreamError):
            self.upstream_errors.labels(model, flow.error.type).inc()
        elif response is not None and response.from_upstream and response.status >= 500:
            self.upstream_errors.labels(model, f"http_{response.status}").inc()
        self._count_tokens(flow, model)

    def _count_tokens(self, flow: Flow, model: str) -> None:
        # The capture addon's LLMCall, read by shape: addons never import each other, and it may be absent.
        record = flow.metadata.get("capture.record")
        usage = getattr(record, "usage", None)
        if not isinstance(usage, Mapping):
            return
        model = str(getattr(record, "model", None) or model)
        for kind in ("prompt", "completion"):
            n = usage.get(f"{kind}_tokens")
            if isinstance(n, int) and not isinstance(n, bool) and n > 0:
                self._child(self.tokens, model, kind).inc(n)

    def _child(self, metric: Any, *values: str) -> Any:
        key = (metric, *values)
        child = self._children.get(key)
        if child is None:
            if len(self._children) >= _MAX_CHILDREN:  # label values come from routes and models: bounded, but
                self._children.clear()  # a bound on the cache is cheap insurance
            child = self._children[key] = metric.labels(*values)
        return child
