"""Where rewards land in a rollout's rows: the outcome per policy, a step's own reward on that step."""

from __future__ import annotations

from agl_lite.integrations.rewards import row_rewards
from agl_lite.integrations.trajectory import merge_trajectories, single_rows
from agl_lite.store.triplets import RewardPolicy
from tests.integrations.conftest import rollout_of, tri

CALLS = [tri(1, [1], [2, 3]), tri(2, [1, 2, 3, 4], [5]), tri(3, [1, 2, 3, 4, 5, 6], [7, 8])]


def placed(policy: RewardPolicy, reward: float | None, triplets=CALLS, missing: float = 0.0):  # type: ignore[no-untyped-def]
    rows, _ = single_rows(triplets)
    return [(r.outcome, r.steps) for r in row_rewards(rows, rollout_of(triplets, reward), policy, missing)]


def test_last_puts_the_reward_on_the_latest_call_only() -> None:
    assert placed(RewardPolicy.LAST, 1.0) == [(None, []), (None, []), (1.0, [])]


def test_broadcast_puts_it_on_every_row() -> None:
    assert placed(RewardPolicy.BROADCAST, 1.0) == [(1.0, []), (1.0, []), (1.0, [])]


def test_a_rollout_without_reward_gets_the_fill_value() -> None:
    assert placed(RewardPolicy.LAST, None, missing=-1.0) == [(None, []), (None, []), (-1.0, [])]


def test_a_step_reward_goes_on_its_step_and_replaces_the_outcome_there() -> None:
    steps = [
        tri(1, [1], [2, 3], step_reward=0.5),
        CALLS[1],
        tri(3, [1, 2, 3, 4, 5, 6], [7, 8], step_reward=2.0),
    ]
    assert placed(RewardPolicy.LAST, 1.0, steps) == [(None, [(1, 0.5)]), (None, []), (None, [(1, 2.0)])]


def test_in_a_merged_row_step_rewards_sit_at_their_steps_ends_and_the_outcome_at_the_row_end() -> None:
    steps = [tri(1, [1], [2, 3], step_reward=0.5), *CALLS[1:]]
    rows, _ = merge_trajectories(steps)
    (only,) = row_rewards(rows, rollout_of(steps, 1.0), RewardPolicy.LAST, 0.0)
    assert rows[0].response_ids.tolist() == [2, 3, 4, 5, 6, 7, 8]
    assert (only.outcome, only.steps) == (1.0, [(1, 0.5)])


def test_with_last_a_side_branch_ending_earlier_gets_no_outcome() -> None:
    main1, side, main2 = tri(1, [1], [2]), tri(2, [50], [51]), tri(3, [1, 2, 3], [4])
    rows, _ = merge_trajectories([main1, side, main2])
    got = row_rewards(rows, rollout_of([main1, side, main2], 1.0), RewardPolicy.LAST, 0.0)
    assert [(r.last.order_key, g.outcome) for r, g in zip(rows, got, strict=True)] == [(2, None), (3, 1.0)]
