"""VERL's dataset rows as samples, and the `agl_lite:` config section as the daemon's config."""

from __future__ import annotations

import pytest

np = pytest.importorskip("numpy")
omegaconf = pytest.importorskip("omegaconf")

from agl_lite.integrations.verl.dataset import daemon_config, samples_of  # noqa: E402
from agl_lite.store.triplets import RewardPolicy  # noqa: E402


def test_rows_become_inputs_with_the_reference_answer_in_metadata() -> None:
    non_tensor = {
        "prompt": np.array(["2+3?", "3+4?"], dtype=object),
        "reward_model": np.array(
            [{"ground_truth": np.int64(5)}, {"ground_truth": np.int64(7)}], dtype=object
        ),
        "extra_info": np.array([{"index": np.int64(0)}, {"index": np.int64(1)}], dtype=object),
    }
    samples = samples_of(non_tensor)
    assert [(s.input, s.metadata) for s in samples] == [
        ({"prompt": "2+3?", "extra_info": {"index": 0}}, {"reward_model": {"ground_truth": 5}}),
        ({"prompt": "3+4?", "extra_info": {"index": 1}}, {"reward_model": {"ground_truth": 7}}),
    ]
    assert len({s.group_id for s in samples}) == 2


def test_the_config_section_and_verls_lengths_make_the_daemons_config() -> None:
    config = omegaconf.OmegaConf.create(
        {
            "agl_lite": {"model": "qwen", "merge": "none", "reward_policy": "broadcast", "timeout_s": 60},
            "data": {"max_prompt_length": 512, "max_response_length": 1024},
            "actor_rollout_ref": {"rollout": {"n": 8}},
        }
    )
    got = daemon_config(config)
    assert (got.model, got.n, got.merge, got.reward_policy, got.timeout_s) == (
        "qwen",
        8,
        "none",
        RewardPolicy.BROADCAST,
        60,
    )
    assert (got.max_prompt_length, got.max_response_length) == (512, 1024)
