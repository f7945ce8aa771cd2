"""The batch VERL trains on, to the token: every expected tensor below is written out by hand."""

from __future__ import annotations

import pytest

from agl_lite.integrations.batch import BatchBuilder, BatchConfig
from agl_lite.integrations.rewards import RowRewards
from agl_lite.integrations.trajectory import merge_trajectories, single_rows
from tests.integrations.conftest import tri

PAD = 0


def build(rows_rewards, p: int = 4, r: int = 6):  # type: ignore[no-untyped-def]
    builder = BatchBuilder(BatchConfig(p, r, PAD))
    for row, rewards, uid in rows_rewards:
        builder.add(row, rewards, uid=uid, rollout_id="r-" + uid)
    return builder.build()


def test_a_merged_two_turn_row_and_a_single_call_row() -> None:
    (merged,), _ = merge_trajectories(
        [
            tri(1, [11, 12], [21, 22], logprobs=[-0.5, -0.25]),
            tri(2, [11, 12, 21, 22, 31], [41], logprobs=[-2.0]),
        ]
    )
    (single,), _ = single_rows([tri(1, [13, 14, 15], [23], logprobs=[-1.0], rollout="r2")])
    b = build([(merged, RowRewards(outcome=1.0), "g1"), (single, RowRewards(outcome=-1.0), "g1")])
    assert (b.size, b.prompt_length, b.response_length) == (2, 4, 6)
    assert b.rows("prompts") == [[0, 0, 11, 12], [0, 13, 14, 15]]
    assert b.rows("responses") == [[21, 22, 31, 41, 0, 0], [23, 0, 0, 0, 0, 0]]
    assert b.rows("input_ids") == [[0, 0, 11, 12, 21, 22, 31, 41, 0, 0], [0, 13, 14, 15, 23, 0, 0, 0, 0, 0]]
    assert b.rows("attention_mask") == [[0, 0, 1, 1, 1, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 0, 0, 0, 0, 0]]
    assert b.rows("position_ids") == [[0, 0, 0, 1, 2, 3, 4, 5, 5, 5], [0, 0, 1, 2, 3, 3, 3, 3, 3, 3]]
    assert b.rows("response_mask") == [[1, 1, 0, 1, 0, 0], [1, 0, 0, 0, 0, 0]]
    assert b.rows("token_level_scores") == [[0, 0, 0, 1.0, 0, 0], [-1.0, 0, 0, 0, 0, 0]]
    assert b.rows("rollout_log_probs") == [[-0.5, -0.25, 0, -2.0, 0, 0], [-1.0, 0, 0, 0, 0, 0]]
    assert b.is_drop_mask.tolist() == [0, 0]
    assert b.uid == ["g1", "g1"]
    assert (b.stats.prompt_tokens, b.stats.response_tokens, b.stats.trained_tokens) == (5, 5, 4)


def test_an_over_long_prompt_keeps_its_last_tokens_and_is_marked_for_dropping() -> None:
    (row,), _ = single_rows([tri(1, [1, 2, 3, 4, 5, 6], [7, 8])])
    b = build([(row, RowRewards(outcome=0.5), "g")], p=4, r=3)
    assert b.rows("prompts") == [[3, 4, 5, 6]]
    assert b.rows("attention_mask") == [[1, 1, 1, 1, 1, 1, 0]]
    assert b.rows("position_ids") == [[0, 1, 2, 3, 4, 5, 5]]
    assert b.rows("token_level_scores") == [[0, 0.5, 0]]
    assert b.is_drop_mask.tolist() == [1]
    assert b.stats.dropped_prompts == 1


def test_an_over_long_response_is_cut_with_the_reward_on_its_last_kept_token() -> None:
    (row,), _ = merge_trajectories(
        [tri(1, [1], [2, 3], logprobs=[-1.0, -1.0]), tri(2, [1, 2, 3, 4, 5], [6, 7, 8], logprobs=[-2.0] * 3)]
    )
    steps = [(1, 0.25), (6, 0.75)]  # step rewards at the ends of both steps; the second is cut off
    b = build([(row, RowRewards(outcome=1.0, steps=steps), "g")], p=2, r=5)
    assert b.rows("responses") == [[2, 3, 4, 5, 6]]
    assert b.rows("response_mask") == [[1, 1, 0, 0, 1]]
    assert b.rows("token_level_scores") == [[0, 0.25, 0, 0, 1.0]]
    assert b.rows("rollout_log_probs") == [[-1.0, -1.0, 0, 0, -2.0]]
    assert b.rows("position_ids") == [[0, 0, 1, 2, 3, 4, 5]]
    assert (b.stats.truncated_responses, b.stats.lost_step_rewards) == (1, 1)


def test_logprobs_are_left_out_when_a_row_has_none_or_versions_differ() -> None:
    (with_lp,), _ = single_rows([tri(1, [1], [2], logprobs=[-1.0])])
    (without,), _ = single_rows([tri(1, [1], [2])])
    (other_version,), _ = single_rows([tri(1, [1], [2], logprobs=[-1.0], version="v9")])
    assert build([(with_lp, RowRewards(), "g")]).rollout_log_probs is not None
    assert build([(with_lp, RowRewards(), "g"), (without, RowRewards(), "g")]).rollout_log_probs is None
    assert build([(with_lp, RowRewards(), "g"), (other_version, RowRewards(), "g")]).rollout_log_probs is None


def test_a_row_without_response_tokens_cannot_carry_its_reward_and_says_so() -> None:
    (row,), _ = single_rows([tri(1, [1, 2], [])])
    b = build([(row, RowRewards(outcome=1.0), "g")])
    assert b.rows("token_level_scores") == [[0, 0, 0, 0, 0, 0]]
    assert b.rows("position_ids") == [[0, 0, 0, 1, 1, 1, 1, 1, 1, 1]]
    assert b.stats.unplaced_rewards == 1


def test_lengths_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        BatchConfig(0, 4, PAD)


def test_merging_and_batching_need_no_verl_nor_torch() -> None:
    import subprocess
    import sys

    blocked = ["verl", "torch", "tensordict", "numpy", "transformers", "ray"]
    code = (
        "import sys\n"
        f"for name in {blocked!r}: sys.modules[name] = None\n"
        "import agl_lite.integrations.batch, agl_lite.integrations.trajectory, agl_lite.integrations.rewards\n"
        "import agl_lite.integrations.verl.daemon, agl_lite.integrations.verl.blocking, agl_lite.store.triplets\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
