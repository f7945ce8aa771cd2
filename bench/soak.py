"""Soak (issue #9, point 1, the long variant): fault injection under load for many cycles, with figures.

The engine is the one the CI test runs (bench/harness/fault_load.py; 10 cycles of 210 calls there): a gateway
process with the default chain on SQLite in front of the mock vLLM; calls at concurrency 64 with agent keys, 1 %
mid-stream upstream errors, 1 % connection resets, 1 % stalls and 10 % client disconnects. After every cycle it
checks one record per call with the right outcome, the client's view, a clean log, both sides drained and the
gateway still serving, and notes RSS and the upstream connections open at the mock.
Run: `.venv/bin/python bench/soak.py [--cycles 30] [--calls 1000] [--concurrency 64] [--seed N] [--markdown]`
(`make soak` runs it, then bench/crash.py).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the engine: bench/harness/, which the CI test runs too

from procs import process_frame  # noqa: E402
from report import machine  # noqa: E402

from bench.harness.fault_load import Cycle, run_faults  # noqa: E402

RSS_GROWTH_LIMIT = 0.10
RSS_CYCLES = 10
"""The issue's bound: RSS after cycle 10 within 10 % of RSS after cycle 1 (later cycles are reported)."""


def row(cells: list[str], markdown: bool) -> str:
    return "| " + " | ".join(cells) + " |" if markdown else "  ".join(f"{c:>10}" for c in cells)


async def run(args: argparse.Namespace, tmp: Path) -> int:
    head = [
        "cycle",
        "calls",
        "seconds",
        "calls/s",
        "RSS MiB",
        "conns open",
        "conns peak",
        "conns made",
        "problems",
    ]
    print(row(head, args.markdown))
    if args.markdown:
        print(row(["---"] * len(head), True))

    def show(c: Cycle) -> None:
        cells = [
            str(c.index + 1),
            str(c.calls),
            f"{c.seconds:.1f}",
            f"{c.calls / c.seconds:.0f}",
            f"{c.rss_bytes / 2**20:.1f}",
            str(c.mock_connections),
            str(c.mock_connections_peak),
            str(c.mock_connections_made),
            str(len(c.problems)),
        ]
        print(row(cells, args.markdown), flush=True)

    load_before = os.getloadavg()[0]
    t0 = time.monotonic()
    report = await run_faults(
        tmp,
        admin_key=secrets.token_hex(32),
        seed=args.seed,
        cycles=args.cycles,
        calls_per_cycle=args.calls,
        concurrency=args.concurrency,
        on_cycle=show,
        same_rollouts=args.same_rollouts,
    )
    fates: dict[str, int] = {}
    for c in report.cycles:
        for fate, n in c.fates.items():
            fates[fate] = fates.get(fate, 0) + n
    rss = [c.rss_bytes / 2**20 for c in report.cycles]
    info = machine()
    print()
    print(
        f"seed {args.seed}; {report.calls} calls at concurrency {args.concurrency} in {time.monotonic() - t0:.0f} s; "
        f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after, on {info['nproc']} CPUs "
        f"({info['cpu']})"
    )
    print("fates: " + ", ".join(f"{k} {v}" for k, v in sorted(fates.items())))
    print(
        f"RSS: {rss[0]:.1f} MiB after cycle 1, {max(rss):.1f} max, {rss[-1]:.1f} after cycle {len(rss)} "
        f"({report.rss_growth():+.1%}); after cycle {min(RSS_CYCLES, len(rss))}: "
        f"{report.rss_growth(RSS_CYCLES):+.1%} (limit +{RSS_GROWTH_LIMIT:.0%})"
    )
    print(
        f"upstream connections at the mock: peak {max(c.mock_connections_peak for c in report.cycles)}, "
        f"{sum(c.mock_connections_made for c in report.cycles)} opened in all, "
        f"{report.connections_after_idle} once idle past the keep-alive timeout"
    )
    for p in report.problems[:20]:
        print("PROBLEM:", p)
    failed = (
        report.problems or report.connections_after_idle or report.rss_growth(RSS_CYCLES) > RSS_GROWTH_LIMIT
    )
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cycles", type=int, default=30)
    parser.add_argument("--calls", type=int, default=1000, help="calls per cycle")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seed", type=int, default=int.from_bytes(os.urandom(4), "big"))
    parser.add_argument(
        "--same-rollouts",
        action="store_true",
        help="one set of rollouts for every cycle (tells memory per rollout from memory per call)",
    )
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--keep-logs", action="store_true", help="keep the store and the config")
    args = parser.parse_args()
    return process_frame("soak", lambda a, tmp: asyncio.run(run(a, tmp)), args, "agl-soak-")


if __name__ == "__main__":
    sys.exit(main())
