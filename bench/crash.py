"""Crash figures (issue #9, point 2): SIGKILL of the gateway at random moments during mixed ingest, 20 trials.

The engine is the one the CI test runs (bench/harness/crash_load.py, 3 trials there): workers drive a gateway
process on SQLite with enqueues, claims, attempts, admin events and rewards, agents' events, LLM calls and rewards,
graders' rewards, attempt outcomes, verdicts and cancels, logging every acknowledged write; the gateway is killed
after a seeded random number of acknowledgements and restarted on the same file. Then the local runner is started
on that store and must take back what the kills left running. Prints one row per trial and the totals.
Run: `.venv/bin/python bench/crash.py [--trials 20] [--seed N] [--markdown]` (also part of `make soak`).
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

from agl_lite.testing import MockVLLM, running_mock  # noqa: E402
from bench.harness.crash_load import Ledger, TrialFigures, recover, run_trials  # noqa: E402
from bench.harness.gateway_process import gateway_processes  # noqa: E402


def row(cells: list[str], markdown: bool) -> str:
    return "| " + " | ".join(cells) + " |" if markdown else "  ".join(f"{c:>12}" for c in cells)


async def run(args: argparse.Namespace, tmp: Path) -> int:
    key = secrets.token_hex(32)
    ledger = Ledger()
    head = ["trial", "killed after", "in flight", "restart s", "rollouts", "check s", "lost", "impossible"]
    print(row(head, args.markdown))
    if args.markdown:
        print(row(["---"] * len(head), True))

    def show(f: TrialFigures) -> None:
        cells = [
            str(f.index + 1),
            f"{f.kill_after} acks",
            str(f.writes_in_flight_at_kill),
            f"{f.restart_s:.2f}",
            str(f.check.rollouts),
            f"{f.check.seconds:.2f}",
            str(len(f.check.missing)),
            str(len(f.check.bad)),
        ]
        print(row(cells, args.markdown), flush=True)

    t0 = time.monotonic()
    async with running_mock(MockVLLM(("smollm2",))) as mock_url, gateway_processes() as started:
        figures = await run_trials(
            tmp,
            mock_url,
            admin_key=key,
            seed=args.seed,
            trials=args.trials,
            ledger=ledger,
            started=started,
            on_trial=show,
        )
        recovery = await recover(tmp, mock_url, admin_key=key, started=started)
    problems = [p for f in figures for p in f.check.missing + f.check.bad] + recovery.problems
    restarts = sorted(f.restart_s for f in figures)
    print()
    print(
        f"seed {args.seed}; {len(figures)} kills in {time.monotonic() - t0:.0f} s; load average now "
        f"{os.getloadavg()[0]:.1f} on {machine()['nproc']} CPUs ({machine()['cpu']})"
    )
    print(
        f"acknowledged writes: {ledger.count()} (rollouts {len(ledger.rollouts)}, events "
        f"{sum(map(len, ledger.events.values()))}, LLM calls {sum(map(len, ledger.calls.values()))}, "
        f"attempts {len(ledger.attempts)}, verdicts {len(ledger.finished)}); lost: "
        f"{sum(len(f.check.missing) for f in figures)}; impossible states: {sum(len(f.check.bad) for f in figures)}"
    )
    print(f"restart to listening: median {restarts[len(restarts) // 2]:.2f} s, max {restarts[-1]:.2f} s")
    print(
        f"runner recovery: {recovery.taken_back} running rollouts taken back and {recovery.queued} queued ones "
        f"run to the end in {recovery.seconds:.1f} s; problems: {len(recovery.problems)}"
    )
    for p in problems[:20]:
        print("PROBLEM:", p)
    return 1 if problems or len(figures) < args.trials else 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=int.from_bytes(os.urandom(4), "big"))
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--keep-logs", action="store_true", help="keep the store and configs")
    args = parser.parse_args()
    return process_frame("crash", lambda a, tmp: asyncio.run(run(a, tmp)), args, "agl-crash-")


if __name__ == "__main__":
    sys.exit(main())
