"""The math PoC's RL loop: enqueue → wait on the completion cursor → read the captured calls → score → reward.

It drives a running gateway (whose runner starts `agent.py` for each rollout) with `AglLiteClient` and the admin
key. Each iteration enqueues every problem `--samples` times as one group (GRPO style), waits for the group
rollouts on the completion cursor with a progress bar, reads each rollout's captured LLM calls (token ids
included), scores the final answer against the reference kept in the rollout's metadata (the agent never saw it),
posts the reward with the admin key, and prints a table. Between iterations it calls the trainer hook: a no-op
where VERL would train, with the gateway paused around it as a real weight sync would be.

    AGL_URL=http://127.0.0.1:8100 AGL_KEY=... python algorithm.py --iterations 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from agl_lite.client import AglLiteClient
from agl_lite.store.records import LLMCall, Rollout, RolloutConfig, RolloutStatus

HERE = Path(__file__).resolve().parent
_MARKED = re.compile(r"####\s*\$?\s*(-?[\d,]*\.?\d+)")
_NUMBER = re.compile(r"-?\$?\s*[\d,]*\.?\d+")

console = Console(stderr=True)
out = Console(width=None if sys.stdout.isatty() else 120)  # pipes and CI logs get the whole table


# --- data and scoring ----------------------------------------------------------------------------------------


def load_problems(path: Path, limit: int) -> list[dict[str, str]]:
    """GSM8K JSONL (`question`, `answer` ending in `#### N`) → [{question, answer: N}], the first `limit`."""
    problems = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            answer = parse_number(row["answer"].rsplit("####", 1)[-1])
            if answer is None:
                raise SystemExit(f"{path}: a problem's answer has no number after '####': {row['answer']!r}")
            problems.append({"question": row["question"].strip(), "answer": answer})
            if len(problems) == limit:
                break
    return problems


def parse_number(text: str) -> str | None:
    """The first number in `text` as a canonical string: `$1,234.50` → `1234.5`, `42.` → `42`, `-3` → `-3`."""
    m = _NUMBER.search(text)
    if m is None:
        return None
    raw = m.group(0).replace("$", "").replace(",", "").replace(" ", "")
    try:
        value = float(raw)
    except ValueError:
        return None
    if not math.isfinite(value):
        return None
    return str(int(value)) if value == int(value) else repr(value)


def final_answer(text: str | None) -> str | None:
    """GSM8K convention: the number after the last `####`; failing that, the last number in the text."""
    if not text:
        return None
    marked = _MARKED.findall(text)
    if marked:
        return parse_number(marked[-1])
    numbers = _NUMBER.findall(text)
    return parse_number(numbers[-1]) if numbers else None


def score(calls: list[LLMCall], reference: str) -> float:
    """1.0 when the last successful call's first choice ends with the reference answer, else 0.0."""
    ok = [c for c in calls if c.outcome.value == "ok" and c.choices]
    if not ok:
        return 0.0
    return 1.0 if final_answer(ok[-1].choices[0].text) == reference else 0.0


# --- one iteration -------------------------------------------------------------------------------------------


@dataclass
class IterationStats:
    iteration: int
    rollouts: int
    succeeded: int
    solved: int
    mean_reward: float
    prompt_tokens: int
    completion_tokens: int
    calls: int
    calls_with_token_ids: int
    wall_s: float
    rollouts_per_s: float
    rewards: dict[str, float]


async def run_iteration(
    client: AglLiteClient,
    problems: list[dict[str, str]],
    *,
    iteration: int,
    samples: int,
    cursor: int,
    timeout_s: float,
    config: RolloutConfig,
) -> tuple[IterationStats, int]:
    t0 = time.monotonic()
    groups = await client.enqueue_group(
        [{"question": p["question"]} for p in problems],
        n=samples,
        config=config,
        metadata={"iteration": iteration},
        metadata_per_input=[{"answer": p["answer"]} for p in problems],
    )
    ids = [r.id for group in groups for r in group]
    with Progress(
        TextColumn(f"iteration {iteration}: rollouts"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    ) as bar:
        task = bar.add_task("wait", total=len(ids))
        result = await client.wait(
            ids,
            timeout_s,
            after=cursor,
            poll_s=5.0,
            progress=lambda done, total: bar.update(task, completed=done),
        )
    if result.pending:
        console.print(f"[yellow]{len(result.pending)} rollouts still pending after {timeout_s:.0f} s[/]")

    rewards: dict[str, float] = {}
    stats = IterationStats(iteration, len(ids), 0, 0, 0.0, 0, 0, 0, 0, 0.0, 0.0, rewards)
    for rollout in result.rollouts:
        reward = await grade(client, rollout, stats)
        rewards[rollout.id] = reward
    stats.wall_s = time.monotonic() - t0
    stats.solved = sum(1 for r in rewards.values() if r > 0)
    stats.mean_reward = sum(rewards.values()) / len(rewards) if rewards else 0.0
    stats.rollouts_per_s = len(result.rollouts) / stats.wall_s if stats.wall_s else 0.0
    return stats, result.cursor


async def grade(client: AglLiteClient, rollout: Rollout, stats: IterationStats) -> float:
    """Score one terminal rollout from its captured calls and post the reward (admin key)."""
    calls = [c async for c in client.iter_calls(rollout.id)]
    stats.calls += len(calls)
    for call in calls:
        usage = call.usage or {}
        stats.prompt_tokens += int(usage.get("prompt_tokens") or 0)
        stats.completion_tokens += int(usage.get("completion_tokens") or 0)
        if call.prompt_token_ids and all(len(ch.token_ids) for ch in call.choices) and call.choices:
            stats.calls_with_token_ids += 1
    reward = 0.0
    if rollout.status is RolloutStatus.SUCCEEDED:
        stats.succeeded += 1
        reward = score(calls, str(rollout.metadata["answer"]))
    await client.reward(rollout.id, reward)
    return reward


# --- the trainer hook ----------------------------------------------------------------------------------------


async def trainer_step(client: AglLiteClient, iteration: int) -> None:
    """Where VERL would train on this iteration's trajectories and sync the new weights to vLLM.

    The sync is what needs the gateway paused: new LLM calls are held (not failed) and the calls in flight drain,
    so no trajectory mixes two model versions. Here the training is a no-op; the pause is real.
    """
    async with client.paused(drain_timeout_s=30, hold_timeout_s=120):
        console.print(
            f"[dim]iteration {iteration}: trainer hook (no-op here; VERL trains and syncs weights)[/]"
        )


# --- main ----------------------------------------------------------------------------------------------------


def table(rows: list[IterationStats]) -> Table:
    t = Table(title="math PoC")
    for col in (
        "iter",
        "rollouts",
        "solved",
        "mean reward",
        "tokens (prompt+completion)",
        "captured calls (with ids)",
        "wall s",
        "rollouts/s",
    ):
        t.add_column(col, justify="right")
    for s in rows:
        t.add_row(
            str(s.iteration),
            f"{s.succeeded}/{s.rollouts}",
            str(s.solved),
            f"{s.mean_reward:.3f}",
            f"{s.prompt_tokens:,}+{s.completion_tokens:,}",
            f"{s.calls} ({s.calls_with_token_ids})",
            f"{s.wall_s:.1f}",
            f"{s.rollouts_per_s:.1f}",
        )
    return t


async def main(args: argparse.Namespace) -> int:
    problems = load_problems(args.data, args.problems)
    config = RolloutConfig(max_attempts=args.max_attempts, timeout_s=args.attempt_timeout)
    rows: list[IterationStats] = []
    async with AglLiteClient(args.url) as client:
        health = await client.health()
        console.print(
            f"gateway {client.url}: {health.get('status', health)}; {len(problems)} problems × {args.samples}"
        )
        cursor = 0
        for iteration in range(1, args.iterations + 1):
            stats, cursor = await run_iteration(
                client,
                problems,
                iteration=iteration,
                samples=args.samples,
                cursor=cursor,
                timeout_s=args.timeout,
                config=config,
            )
            rows.append(stats)
            out.print(table(rows))
            if iteration < args.iterations:
                await trainer_step(client, iteration)
    if args.summary_json is not None:
        args.summary_json.write_text(json.dumps([asdict(r) for r in rows], indent=2))
    return 0 if all(r.succeeded == r.rollouts for r in rows) else 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default=None, help="Gateway URL (default: $AGL_URL or http://127.0.0.1:8100).")
    p.add_argument(
        "--data",
        type=Path,
        default=HERE / "problems.jsonl",
        help="GSM8K-format JSONL (default: the example's own 30 problems).",
    )
    p.add_argument("--problems", type=int, default=30, help="Problems per iteration (the first N of --data).")
    p.add_argument("--samples", type=int, default=2, help="Rollouts per problem, as one group (GRPO n).")
    p.add_argument("--iterations", type=int, default=2)
    p.add_argument(
        "--timeout", type=float, default=600.0, help="Seconds to wait for one iteration's rollouts."
    )
    p.add_argument("--attempt-timeout", type=float, default=120.0, help="Seconds one agent attempt may run.")
    p.add_argument("--max-attempts", type=int, default=2, help="Attempts per rollout (the runner retries).")
    p.add_argument(
        "--summary-json", type=Path, default=None, help="Also write the per-iteration figures here."
    )
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
