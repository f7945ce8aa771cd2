"""Export merged trajectories as a trainer sees them: one row per training sequence (the daemon's merge and reward
placement), with its response mask, the sampler's logprobs, its reward and its GRPO advantage, and the model
version that produced it. `agl-client export --rows trajectories` writes them (JSONL or Parquet).

The advantage is VERL's outcome advantage for GRPO (`compute_grpo_outcome_advantage`), computed here without
torch: a row's score is the sum of its placed rewards; within a group (the rollouts' group id) the score less the
group's mean, divided by the group's standard deviation (unbiased, + 1e-6) unless `norm_by_std` is off; a group
of one row gets its score. Rows are buffered one group at a time: groups are enqueued together and listed in
enqueue order, so memory holds one group.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agl_lite.client import AglLiteClient
from agl_lite.client.writers import RowWriter
from agl_lite.integrations.rewards import row_rewards
from agl_lite.integrations.trajectory import merge_trajectories, single_rows
from agl_lite.store.records import RolloutStatus
from agl_lite.store.triplets import RolloutTriplets, TripletOptions

__all__ = ["TrajectoryStats", "export_trajectories", "grpo_advantages"]

EPSILON = 1e-6
"""VERL's `epsilon` in `compute_grpo_outcome_advantage`."""


@dataclass(slots=True)
class TrajectoryStats:
    rollouts: int = 0
    rows: int = 0
    groups: int = 0
    split_groups: int = 0
    """Groups whose rollouts were not listed together: their advantages were computed per part."""


def grpo_advantages(scores: Sequence[float], *, norm_by_std: bool = True) -> list[float]:
    """The advantage of each row of one group from its score, as VERL computes it."""
    n = len(scores)
    if n == 1:
        return [float(scores[0])]
    mean = sum(scores) / n
    std = math.sqrt(sum((s - mean) ** 2 for s in scores) / (n - 1))
    return [(s - mean) / (std + EPSILON) if norm_by_std else s - mean for s in scores]


async def _groups(
    client: AglLiteClient,
    rollout_ids: AsyncIterator[tuple[str, str]],
    options: TripletOptions,
    stats: TrajectoryStats,
) -> AsyncIterator[list[RolloutTriplets]]:
    """The rollouts' triplets, one group at a time (a rollout without a group id is a group of its own)."""
    current: str | None = None
    ids: list[str] = []
    seen: set[str] = set()
    async for rid, gid in rollout_ids:
        if gid != current and ids:
            yield [rt async for rt in client.iter_triplets(ids, options)]
            ids = []
        if gid != current:
            if gid in seen:
                stats.split_groups += 1
            seen.add(gid)
            current = gid
        ids.append(rid)
    if ids:
        yield [rt async for rt in client.iter_triplets(ids, options)]


async def export_trajectories(
    client: AglLiteClient,
    writer: RowWriter,
    *,
    status: RolloutStatus | None = RolloutStatus.SUCCEEDED,
    mode: str | None = None,
    group_id: str | None = None,
    options: TripletOptions | None = None,
    merge: bool = True,
    norm_by_std: bool = True,
    page_size: int = 100,
    progress: Callable[[TrajectoryStats], None] | None = None,
) -> TrajectoryStats:
    """Write the matching rollouts' merged rows with rewards and GRPO advantages; returns what was written."""
    opts = options or TripletOptions()
    stats = TrajectoryStats()

    async def listed() -> AsyncIterator[tuple[str, str]]:
        async for rollout in client.iter_rollouts(
            status=status, mode=mode, group_id=group_id, page_size=page_size
        ):
            yield rollout.id, rollout.group_id or rollout.id

    async for group in _groups(client, listed(), opts, stats):
        rows: list[dict[str, Any]] = []
        for rt in group:
            stats.rollouts += 1
            merged, _ = merge_trajectories(rt.triplets) if merge else single_rows(rt.triplets)
            for row, placed in zip(
                merged, row_rewards(merged, rt, opts.reward_policy, opts.missing_reward), strict=True
            ):
                score = sum(v for _, v in placed.steps) + (placed.outcome or 0.0)
                rows.append(
                    {
                        "rollout_id": rt.rollout_id,
                        "group_id": rt.group_id,
                        "model_version": row.model_version,
                        "calls": [sp.triplet.response_id for sp in row.spans if sp.trained],
                        "prompt_ids": row.prompt_ids,
                        "response_ids": row.response_ids,
                        "response_mask": row.response_mask,
                        "logprobs": row.logprobs,
                        "reward": score,
                        "rollout_reward": rt.reward,
                    }
                )
        for row_json, adv in zip(
            rows,
            grpo_advantages([r["reward"] for r in rows], norm_by_std=norm_by_std) if rows else [],
            strict=True,
        ):
            row_json["advantage"] = adv
            writer.write(row_json)
        stats.rows += len(rows)
        stats.groups += 1
        if progress is not None:
            progress(stats)
    return stats
