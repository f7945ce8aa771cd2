"""Prometheus metrics kept as plain numbers on the hot path, turned into metric families only when scraped.

prometheus-client's own metric objects take a lock and validate labels on every update (20-40 µs per flow on a
small VM); addons that count per flow keep these instead and expose them through a `Collector` of their own.
prometheus-client still writes the exposition.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

__all__ = ["Histogram", "counter_family", "gauges", "histogram_family"]


class Histogram:
    """Observations counted per bucket (`le` bounds, +Inf last), and their sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # per bucket (not cumulative); the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # the first bound >= value: Prometheus's `le`
        self.sum += value


def counter_family(name: str, doc: str, labels: list[str], counts: Mapping[Any, int]) -> CounterMetricFamily:
    """`counts` maps label values (a tuple, in `labels` order) to a count."""
    family = CounterMetricFamily(name, doc, labels=labels)
    for values, n in counts.items():
        family.add_metric(values, n)
    return family


def histogram_family(
    name: str, doc: str, labels: list[str], histograms: Mapping[tuple[str, ...], Histogram]
) -> HistogramMetricFamily:
    """`histograms` maps label values (a tuple, in `labels` order; `()` without labels) to a histogram."""
    family = HistogramMetricFamily(name, doc, labels=labels)
    for values, h in histograms.items():
        running, buckets = 0, []
        for bound, n in zip((*h.bounds, float("inf")), h.counts, strict=True):
            running += n
            buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
        family.add_metric(list(values), buckets, h.sum)
    return family


def gauges(registry: CollectorRegistry, **read: tuple[str, Callable[[], float]]) -> None:
    """Gauges whose value is read when scraped: `name=(doc, read)` each."""
    for name, (doc, fn) in read.items():
        Gauge(name, doc, registry=registry).set_function(fn)
