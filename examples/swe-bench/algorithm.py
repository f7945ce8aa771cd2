"""The SWE-bench RL loop: load instances → enqueue groups → wait on the completion cursor → read rewards and calls.

It drives a running gateway whose runner starts `agent.py` (Claude Code) for each rollout and `grade.py` after it,
with `AglLiteClient` and the admin key. Unlike the math PoC, the algorithm does not score anything itself: the
grading step posts each rollout's reward with its grader key before the rollout finishes, so a rollout on the
completion cursor already has it. Per iteration it prints, per instance, how many samples resolved the issue and
how many captured calls carry token ids (what VERL trains on), then calls the trainer hook (a no-op here, with the
gateway paused around it as a weight sync would be).

    AGL_URL=http://127.0.0.1:8100 AGL_KEY=... python algorithm.py --data instances.jsonl --repos .run/repos
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

# Run as a script from anywhere: the loader is the module beside it.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from loader import DEFAULT_TEST_CMD, Instance, TaskOptions, load_instances, rollout_specs

from agl_lite.client import AglLiteClient
from agl_lite.store.records import CallOutcome, Rollout, RolloutStatus

HERE = Path(__file__).resolve().parent
console = Console(stderr=True)
out = Console(width=None if sys.stdout.isatty() else 140)


@dataclass
class RolloutResult:
    rollout_id: str
    instance_id: str
    status: str
    reward: float | None
    calls: int
    calls_with_token_ids: int
    tool_result_turns: int
    report: dict[str, object] = field(default_factory=dict)


async def inspect(client: AglLiteClient, rollout: Rollout) -> RolloutResult:
    """What one finished rollout did: its reward (the grader's), its captured calls and the grader's report."""
    calls = [c async for c in client.iter_calls(rollout.id)]
    ok = [c for c in calls if c.outcome is CallOutcome.OK]
    with_ids = [c for c in ok if c.prompt_token_ids is not None and c.choices and len(c.choices[0].token_ids)]
    # A turn that answers a tool call: Claude Code's tool_result blocks become `tool` messages upstream.
    tool_turns = [
        c for c in ok if any(m.get("role") == "tool" for m in (c.upstream_request or {}).get("messages", []))
    ]
    reports = await client.events(rollout.id, kind="swe_bench_report")
    return RolloutResult(
        rollout.id,
        str(rollout.input.get("instance_id")),
        rollout.status.value,
        rollout.reward,
        len(calls),
        len(with_ids),
        len(tool_turns),
        dict(reports[-1].data) if reports else {},
    )


async def run_iteration(
    client: AglLiteClient,
    args: argparse.Namespace,
    instances: list[Instance],
    options: TaskOptions,
    *,
    iteration: int,
    cursor: int,
) -> tuple[list[RolloutResult], int]:
    specs = rollout_specs(instances, options, samples=args.samples, tag=f"-it{iteration}")
    for spec in specs:
        spec.metadata["iteration"] = iteration
    rollouts = await client.enqueue(specs)
    console.print(f"iteration {iteration}: {len(rollouts)} rollouts of {len(instances)} instances enqueued")
    result = await client.wait([r.id for r in rollouts], args.wait_s, after=cursor, poll_s=5.0)
    if result.pending:
        console.print(f"[yellow]{len(result.pending)} rollouts still pending after {args.wait_s:.0f} s[/]")
    return [await inspect(client, r) for r in result.rollouts], result.cursor


async def trainer_step(client: AglLiteClient, iteration: int) -> None:
    """Where VERL would train on the iteration's trajectories and sync the new weights to vLLM (gateway paused)."""
    async with client.paused(drain_timeout_s=60, hold_timeout_s=600):
        console.print(
            f"[dim]iteration {iteration}: trainer hook (no-op here; VERL trains and syncs weights)[/]"
        )


def table(iteration: int, results: list[RolloutResult]) -> Table:
    t = Table(title=f"SWE-bench, iteration {iteration}")
    for col in ("instance", "rollouts", "resolved", "mean reward", "calls (with ids)", "tool_result turns"):
        t.add_column(col, justify="right")
    by_instance: dict[str, list[RolloutResult]] = defaultdict(list)
    for r in results:
        by_instance[r.instance_id].append(r)
    for instance_id, rs in sorted(by_instance.items()):
        rewards = [r.reward or 0.0 for r in rs]
        t.add_row(
            instance_id,
            f"{sum(r.status == RolloutStatus.SUCCEEDED.value for r in rs)}/{len(rs)}",
            str(sum(x > 0 for x in rewards)),
            f"{sum(rewards) / len(rewards):.3f}",
            f"{sum(r.calls for r in rs)} ({sum(r.calls_with_token_ids for r in rs)})",
            str(sum(r.tool_result_turns for r in rs)),
        )
    return t


async def main_async(args: argparse.Namespace) -> int:
    url, key = os.environ.get("AGL_URL", "http://127.0.0.1:8100"), os.environ.get("AGL_KEY")
    if not key:
        console.print("[red]AGL_KEY (the admin key) is not set[/]")
        return 2
    # Everything that can be wrong with the data is found before anything is enqueued.
    instances = load_instances(args.data, ids=args.instance or None, limit=args.limit)
    options = TaskOptions(
        repos=args.repos,
        test_cmd=args.test_cmd,
        image_template=args.image_template,
        timeout_s=args.timeout_s,
        max_attempts=args.max_attempts,
    )
    if options.image_template:
        rollout_specs(instances, options)  # a bad template fails here, naming the image
    summary: list[dict[str, object]] = []
    async with AglLiteClient(url, key) as client:
        _, cursor = await client.completed(after=0, limit=0)  # the head: only what this run finishes
        for iteration in range(1, args.iterations + 1):
            t0 = time.monotonic()
            results, cursor = await run_iteration(
                client, args, instances, options, iteration=iteration, cursor=cursor
            )
            out.print(table(iteration, results))
            summary += [{"iteration": iteration, **asdict(r)} for r in results]
            console.print(f"[dim]iteration {iteration}: {time.monotonic() - t0:.1f} s[/]")
            if iteration < args.iterations:
                await trainer_step(client, iteration)
    if args.summary:
        args.summary.write_text(json.dumps(summary, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=HERE / "instances.jsonl", help="SWE-bench JSONL.")
    p.add_argument("--instance", action="append", help="Only this instance id (repeatable).")
    p.add_argument("--limit", type=int, default=0, help="At most this many instances (0: all).")
    p.add_argument(
        "--repos", type=Path, help="Local clones as REPOS/owner/name (omit where images hold /testbed)."
    )
    p.add_argument("--test-cmd", default=DEFAULT_TEST_CMD, help="How the grader runs the tests (shell).")
    p.add_argument(
        "--image-template", default="", help="Kubernetes: per-instance image, e.g. 'reg/agl-swe.{key}:0.1'."
    )
    p.add_argument("--samples", type=int, default=1, help="Rollouts per instance (one GRPO group).")
    p.add_argument("--iterations", type=int, default=1)
    p.add_argument("--timeout-s", type=float, default=3600.0, help="Per attempt.")
    p.add_argument("--max-attempts", type=int, default=1)
    p.add_argument("--wait-s", type=float, default=7200.0, help="How long one iteration may take.")
    p.add_argument("--summary", type=Path, help="Write every rollout's result here as JSON.")
    args = p.parse_args(argv)
    try:
        return asyncio.run(main_async(args))
    except ValueError as exc:  # a bad JSONL row or option: one line, not a traceback
        console.print(f"[red]{exc}[/]")
        return 2


if __name__ == "__main__":
    sys.exit(main())
