"""Line charts as SVG numbers, laid out here and drawn by a template (`_chart.html`), so that a plot needs no
script and no library in the browser, and its text is escaped like every other value."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Chart", "Point", "line_chart"]

WIDTH, HEIGHT = 520, 220
_LEFT, _RIGHT, _TOP, _BOTTOM = 56, 12, 12, 28


@dataclass(frozen=True, slots=True)
class Point:
    x: float
    y: float
    label: str
    """What hovering the point says: its x label and value."""


@dataclass(frozen=True, slots=True)
class Chart:
    title: str
    points: list[Point]
    line: str
    """The polyline's `points` attribute."""
    y_ticks: list[tuple[float, str]]
    x_ticks: list[tuple[float, str]]
    width: int = WIDTH
    height: int = HEIGHT


def _fmt(v: float, step: float = 0.0) -> str:
    """`v` with as many decimals as `step` (the gap between two ticks) needs to tell them apart."""
    if v != 0 and not 1e-3 <= abs(v) < 1e6:
        return f"{v:.2e}"
    if step > 0:
        return f"{v:.{max(0, min(6, 1 - math.floor(math.log10(step))))}f}"
    return f"{v:.3g}"


def line_chart(title: str, values: Sequence[tuple[str, float]]) -> Chart:
    """`values` as (x label, y) in order, one point each; a value that is not a finite number is left out (its x
    keeps its place)."""
    n = len(values)
    kept = [(i, label, y) for i, (label, y) in enumerate(values) if math.isfinite(y)]
    lo = min((y for _, _, y in kept), default=0.0)
    hi = max((y for _, _, y in kept), default=1.0)
    if hi == lo:
        lo, hi = lo - 0.5, hi + 0.5
    plot_w, plot_h = WIDTH - _LEFT - _RIGHT, HEIGHT - _TOP - _BOTTOM

    def sx(i: int) -> float:
        return round(_LEFT + (plot_w * i / (n - 1) if n > 1 else plot_w / 2), 1)

    def sy(y: float) -> float:
        return round(_TOP + plot_h * (hi - y) / (hi - lo), 1)

    points = [Point(sx(i), sy(y), f"{label}: {_fmt(y)}") for i, label, y in kept]
    y_ticks = [(sy(lo + (hi - lo) * k / 4), _fmt(lo + (hi - lo) * k / 4, (hi - lo) / 4)) for k in range(5)]
    step = max(1, math.ceil(n / 8))
    x_ticks = [(sx(i), values[i][0]) for i in range(0, n, step)]
    return Chart(title, points, " ".join(f"{p.x},{p.y}" for p in points), y_ticks, x_ticks)
