"""Sink: commits each captured LLM call (`capture.record`) to the store.

By default (`durability = "sync"`) it commits in `response_end`, before the client receives the end of its
response, so no agent ever saw a completion the store lost: when the commit fails (disk full, database read-only),
the client gets that error (507 or 503, with `Retry-After`) instead of the end of its response. `"async"` trades
that guarantee for latency. Writes are batched
across flows by the store's group commit; its queue is bounded.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import structlog
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from agl_lite.core.config import GatewayConfig, option
from agl_lite.core.flow import Flow
from agl_lite.core.prom import Histogram, gauges, histogram_family
from agl_lite.core.services import METRICS_REGISTRY, LoadContext
from agl_lite.errors import HttpError
from agl_lite.store.records import LLMCall
from agl_lite.store.rules import STORE, Store

__all__ = ["Sink"]

log = structlog.get_logger("agl_lite.sink")

COMMIT_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)
"""Seconds to commit one captured call."""


class _CommitLatency(Collector):
    def __init__(self, histogram: Histogram) -> None:
        self.histogram = histogram

    def collect(self) -> Iterator[Metric]:
        yield histogram_family(
            "agl_sink_commit_seconds",
            "Time to commit one captured call (the end of the response waits for it).",
            [],
            {(): self.histogram},
        )


class Sink:
    short_name = "sink"
    """Its name in a chain, and what other addons' `after` call it."""
    after = {"capture": "it commits the record capture builds in response_end"}

    @dataclass(frozen=True, slots=True)
    class Options:
        durability: Literal["sync", "async"] = option(
            "sync",
            "`sync`: commit before the client gets the end of the response; `async`: in the background.",
        )

    def __init__(self) -> None:
        self.committed = 0
        self.failed = 0

    def load(self, ctx: LoadContext) -> None:
        self._ctx = ctx

    def configure(self, config: GatewayConfig, options: Sink.Options | None) -> None:
        self.options = options or Sink.Options()
        self.store: Store = self._ctx.services.require(STORE, by="sink")
        self._latency: Histogram | None = None
        registry = self._ctx.services.get(METRICS_REGISTRY)
        if registry is not None:
            # commits / writes = how well group commit batches (SQLite; the memory store has no commits)
            gauges(
                registry,
                agl_store_write_queue_depth=(
                    "Writes waiting for the store's writer.",
                    lambda: self._stat("queue_depth"),
                ),
                agl_store_commits=(
                    "Transactions the store's writer committed.",
                    lambda: self._stat("commits"),
                ),
                agl_store_writes=("Writes the store's writer committed.", lambda: self._stat("ops")),
            )
            self._latency = Histogram(COMMIT_BUCKETS)  # observed per call: plain numbers (`core.prom`)
            registry.register(_CommitLatency(self._latency))

    def _stat(self, name: str) -> float:
        return float(getattr(self.store, name, 0))

    async def response_end(self, flow: Flow) -> None:
        failed = await self._commit(flow)
        if failed is not None:
            # The commit point: a call whose record is not stored must not look complete to its client. The core
            # sends this error instead of the end of the response (`ResponseEndHook`).
            flow.error = failed

    async def error(self, flow: Flow) -> None:
        await self._commit(flow)  # the client already has an error

    async def _commit(self, flow: Flow) -> HttpError | None:
        record = flow.metadata.get("capture.record")
        if not isinstance(record, LLMCall):
            return None
        if self.options.durability == "async":
            self._ctx.tasks.spawn(self._write(record), name=f"sink {record.id}")
            return None
        return await self._write(record)

    async def _write(self, record: LLMCall) -> HttpError | None:
        start = time.perf_counter()
        try:
            await self.store.add_call(record)
        except HttpError as exc:
            self.failed += 1
            log.error(
                "captured call not stored", call=record.id, rollout=record.rollout_id, error=exc.message
            )
            return exc
        self.committed += 1
        if self._latency is not None:
            self._latency.observe(time.perf_counter() - start)
        return None
