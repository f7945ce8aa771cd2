"""Line charts laid out as SVG numbers: one point per finite value, inside the plot, ticks labelled."""

from __future__ import annotations

import math

from agl_lite.dashboard.plots import HEIGHT, WIDTH, line_chart


def test_one_point_per_finite_value_in_order_within_the_plot() -> None:
    chart = line_chart("reward", [("v0", 0.1), ("v1", math.nan), ("v2", 0.5), ("v3", 0.9)])
    assert [p.label for p in chart.points] == ["v0: 0.1", "v2: 0.5", "v3: 0.9"]
    xs, ys = [p.x for p in chart.points], [p.y for p in chart.points]
    assert xs == sorted(xs)
    assert ys == sorted(ys, reverse=True)  # higher is up
    assert all(0 < x < WIDTH for x in xs)
    assert all(0 < y < HEIGHT for y in ys)
    assert chart.line.count(",") == 3
    assert [label for _, label in chart.y_ticks] == ["0.10", "0.30", "0.50", "0.70", "0.90"]
    assert [label for _, label in chart.x_ticks] == ["v0", "v1", "v2", "v3"]


def test_a_single_or_constant_series_still_draws() -> None:
    one = line_chart("x", [("a", 2.0)])
    assert len(one.points) == 1
    assert 0 < one.points[0].y < HEIGHT
    flat = line_chart("x", [("a", 1.0), ("b", 1.0)])
    assert flat.points[0].y == flat.points[1].y
    assert line_chart("x", []).points == []
