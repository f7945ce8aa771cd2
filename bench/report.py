"""The bench's report: the table (text or markdown), the validity check and the budget verdict (DESIGN.md §8).

Only figures within one run are compared: req/s as a ratio to the bare relay, latency as a difference to direct.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import math
import os
import platform
from dataclasses import dataclass
from pathlib import Path

from loadgen import Cell
from servers import MODES, Target

__all__ = ["CONCURRENCY", "Row", "build_rows", "machine", "markdown_table", "text_table", "verdict"]

CONCURRENCY = (1, 32)
# Budgets (DESIGN.md §8): ratios and differences within one run.
MIN_RATIO_VS_RELAY = 0.75  # agl-lite req/s / relay req/s at c=32
MAX_ADDED_P50_MS = 1.0  # vs direct, c=1
MAX_ADDED_P99_MS = 3.0  # vs direct, c=1
MIN_DIRECT_OVER_RELAY = 2.0  # validity: the upstream must not be the bottleneck

Cells = dict[tuple[str, str, int], Cell]
"""(target name, mode, concurrency) -> its pooled requests."""


@dataclass
class Row:
    target: str
    mode: str
    c: int
    cell: Cell
    added_p50: float = math.nan
    added_p99: float = math.nan
    vs_relay: float = math.nan


def build_rows(cells: Cells, targets: list[Target]) -> list[Row]:
    rows = []
    for mode in MODES:
        for c in CONCURRENCY:
            direct, relay = cells[("direct", mode, c)], cells[("bare relay", mode, c)]
            for t in targets:
                cell = cells[(t.name, mode, c)]
                row = Row(t.name, mode, c, cell)
                if t.name != "direct":
                    row.added_p50 = cell.percentile(50) - direct.percentile(50)
                    row.added_p99 = cell.percentile(99) - direct.percentile(99)
                row.vs_relay = cell.rps / relay.rps if relay.rps else math.nan
                rows.append(row)
    return rows


def _f(x: float, fmt: str) -> str:
    return "—" if math.isnan(x) else format(x, fmt)


HEADER = (
    "target",
    "mode",
    "c",
    "req/s",
    "CPU µs/req",
    "p50 ms",
    "p99 ms",
    "added p50 ms",
    "added p99 ms",
    "req/s vs relay",
)


def row_cells(r: Row) -> tuple[str, ...]:
    return (
        r.target,
        r.mode,
        str(r.c),
        f"{r.cell.rps:,.0f}",
        _f(r.cell.cpu_us_per_request, ",.0f"),
        _f(r.cell.percentile(50), ".1f"),
        _f(r.cell.percentile(99), ".1f"),
        _f(r.added_p50, "+.1f"),
        _f(r.added_p99, "+.1f"),
        _f(r.vs_relay, ".2f"),
    )


def text_table(rows: list[Row]) -> str:
    table = [HEADER, *(row_cells(r) for r in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(HEADER))]
    return "\n".join(
        "  ".join(
            f"{v:<{w}}" if i < 2 else f"{v:>{w}}" for i, (v, w) in enumerate(zip(line, widths, strict=True))
        )
        for line in table
    )


def markdown_table(rows: list[Row]) -> str:
    lines = [
        "| " + " | ".join(HEADER) + " |",
        "|" + "|".join(["---"] * 2 + ["---:"] * (len(HEADER) - 2)) + "|",
    ]
    lines += ["| " + " | ".join(row_cells(r)) + " |" for r in rows]
    return "\n".join(lines)


def _div(a: float, b: float) -> float:
    return a / b if b else math.nan


def verdict(cells: Cells, has_litellm: bool) -> tuple[list[str], bool]:
    """The validity check and the budget lines; the bool says whether the bench is valid."""
    lines, valid = [], True
    top = max(CONCURRENCY)
    for mode in MODES:
        direct, relay = cells[("direct", mode, top)].rps, cells[("bare relay", mode, top)].rps
        ok = relay > 0 and direct >= MIN_DIRECT_OVER_RELAY * relay
        valid &= ok
        status = "ok" if ok else "INVALID: the upstream is the bottleneck, these figures mean nothing"
        if not ok and mode == "stream":
            status += " (try fewer --stream-writes)"
        lines.append(
            f"validity {mode:<6} c={top}: direct {direct:,.0f} req/s = {_div(direct, relay):.1f}x relay "
            f"(needs >= {MIN_DIRECT_OVER_RELAY:g}x) {status}"
        )
    for mode in MODES:
        agl, relay_cell = cells[("agl-lite", mode, top)], cells[("bare relay", mode, top)]
        ratio = _div(agl.rps, relay_cell.rps)
        paired = [a / r for a, r in zip(agl.rounds_rps, relay_cell.rounds_rps, strict=True) if r]
        spread = f" (rounds {min(paired):.2f}-{max(paired):.2f})" if len(paired) > 1 else ""
        lines.append(
            f"budget   {mode:<6} c={top}: agl-lite req/s = {ratio:.2f}x relay{spread} (>= {MIN_RATIO_VS_RELAY}x) "
            f"{'PASS' if ratio >= MIN_RATIO_VS_RELAY else 'MISS'}"
        )
        cpu_ratio = _div(agl.cpu_us_per_request, relay_cell.cpu_us_per_request)
        if cpu_ratio > 0:  # False for nan
            lines.append(
                f"         {mode:<6} c={top}: agl-lite CPU per request = {cpu_ratio:.2f}x relay's "
                f"(when CPU-bound, {_div(1, cpu_ratio):.2f}x its req/s)"
            )
        agl1, relay1, direct1 = (cells[(t, mode, 1)] for t in ("agl-lite", "bare relay", "direct"))
        p50 = agl1.percentile(50) - direct1.percentile(50)
        p99 = agl1.percentile(99) - direct1.percentile(99)
        relay_p50 = relay1.percentile(50) - direct1.percentile(50)
        relay_p99 = relay1.percentile(99) - direct1.percentile(99)
        lines.append(
            f"budget   {mode:<6} c=1 : added p50 {p50:+.1f} ms (<= {MAX_ADDED_P50_MS:g}) "
            f"{'PASS' if p50 <= MAX_ADDED_P50_MS else 'MISS'}; added p99 {p99:+.1f} ms "
            f"(<= {MAX_ADDED_P99_MS:g}) {'PASS' if p99 <= MAX_ADDED_P99_MS else 'MISS'}  "
            f"[bare relay: {relay_p50:+.1f} / {relay_p99:+.1f}]"
        )
        if has_litellm:
            lite = cells[("litellm", mode, top)].rps
            lines.append(f"         {mode:<6} c={top}: agl-lite = {_div(agl.rps, lite):.1f}x LiteLLM's req/s")
    failed = sum(c.failed for c in cells.values())
    if failed:
        lines.append(f"WARNING: {failed} responses were not 200; see the logs (--keep-logs)")
    return lines, valid


def machine() -> dict[str, str]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    nproc = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": str(nproc),
        "cpu": cpu,
        "python": platform.python_version(),
        "os": platform.platform(terse=True),
        "aiohttp": importlib.metadata.version("aiohttp"),
        "agl-lite": f"{importlib.metadata.version('agl-lite')} ({scans()})",
    }


def scans() -> str:
    """Which byte scans the installed agl-lite's capture runs (agl_lite/capture/native.py): the servers the benches
    start from it inherit this environment, AGL_NATIVE included (a baseline checkout: `servers.scans_of`)."""
    from agl_lite.capture import native  # (the benches run in agl-lite's venv)

    return "C scans" if native.NATIVE else "Python scans"
