"""Where a rollout's rewards land in its rows: the outcome on a row's last response token (on the last row only,
or on every row), a step's own reward on that step's last token. A step reward replaces the outcome on its step.

The rewards themselves (the last authoritative one, trusted agents only, step rewards) are resolved by the store
side (`agl_lite.store.triplets`); this only places them. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from agl_lite.integrations.trajectory import Row
from agl_lite.store.triplets import RewardPolicy, RolloutTriplets

__all__ = ["RowRewards", "row_rewards"]


@dataclass(slots=True)
class RowRewards:
    outcome: float | None = None
    """The rollout's reward, for the row's last valid response token (None: not on this row)."""
    steps: list[tuple[int, float]] = field(default_factory=list)
    """(index in the row's response of a step's last token, that step's reward)."""


def row_rewards(
    rows: Sequence[Row], rollout: RolloutTriplets, policy: RewardPolicy, missing: float
) -> list[RowRewards]:
    """One `RowRewards` per row. The last row(s) are those ending with the latest call of their attempt; a
    rollout without a reward gets `missing` (the caller counts it: `rollout.reward is None`)."""
    outcome = rollout.reward if rollout.reward is not None else missing
    latest: dict[str | None, int] = {}
    for t in rollout.triplets:
        latest[t.attempt_id] = max(latest.get(t.attempt_id, t.order_key), t.order_key)
    out = []
    for row in rows:
        placed = RowRewards()
        for span in row.spans:
            step = span.triplet.step_reward
            if step is not None and span.trained and span.end > span.start:
                placed.steps.append((span.end - 1, step))
        last = row.last
        is_last = last.order_key == latest.get(last.attempt_id, last.order_key)
        if last.step_reward is None and (policy is RewardPolicy.BROADCAST or is_last):
            placed.outcome = outcome
        out.append(placed)
    return out
