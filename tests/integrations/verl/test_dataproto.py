"""Real captures (the mock vLLM through the gateway, two-turn agents) → triplets → a real `DataProto`, checked
against VERL's own functions: its position ids and its GRPO outcome advantage on the built batch.

Skipped only where `make verl` has not installed verl (`make test` does)."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("verl.protocol")

import torch
from verl.protocol import DataProto
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage
from verl.utils.model import compute_position_id_with_mask

from agl_lite.integrations.verl.daemon import AglLiteDaemon, Sample
from agl_lite.integrations.verl.dataproto import to_dataproto
from tests.integrations.verl.conftest import Bench
from tests.integrations.verl.test_daemon import config


async def test_the_batch_is_a_dataproto_that_verls_own_functions_agree_with(bench: Bench) -> None:
    result = await AglLiteDaemon(bench.agents, config()).step(
        [Sample({"q": "What is 2+3?"}, group_id="g-a"), Sample({"q": "What is 3+4?"}, group_id="g-b")]
    )
    data = to_dataproto(result.batch, {"step": 1})
    assert isinstance(data, DataProto)
    b = result.batch
    assert len(data) == b.size == 4
    shapes = {k: (tuple(v.shape), v.dtype) for k, v in data.batch.items()}
    assert shapes == {
        "prompts": ((4, 64), torch.int64),
        "responses": ((4, 48), torch.int64),
        "input_ids": ((4, 112), torch.int64),
        "attention_mask": ((4, 112), torch.int64),
        "position_ids": ((4, 112), torch.int64),
        "response_mask": ((4, 48), torch.int64),
        "token_level_scores": ((4, 48), torch.float32),
        "rollout_log_probs": ((4, 48), torch.float32),
        "is_drop_mask": ((4,), torch.bool),
    }
    for name in ("prompts", "responses", "input_ids", "attention_mask", "position_ids", "response_mask"):
        assert data.batch[name].tolist() == b.rows(name)
    assert list(data.non_tensor_batch["uid"]) == ["g-a", "g-a", "g-b", "g-b"]
    assert data.meta_info == {"step": 1}

    # VERL's position ids from the attention mask are ours
    assert torch.equal(
        compute_position_id_with_mask(data.batch["attention_mask"]), data.batch["position_ids"]
    )

    # GRPO on the built batch: rewards 1 and 0 in each group → ±0.5 / (std + eps), on the trained tokens only
    advantages, _ = compute_grpo_outcome_advantage(
        token_level_rewards=data.batch["token_level_scores"],
        response_mask=data.batch["response_mask"],
        index=data.non_tensor_batch["uid"],
    )
    c = 0.5 / (math.sqrt(0.5) + 1e-6)
    mask = data.batch["response_mask"].float()
    expected = torch.stack([c * mask[0], -c * mask[1], c * mask[2], -c * mask[3]])
    assert torch.allclose(advantages, expected, atol=1e-6)
    assert int(mask.sum()) == b.stats.trained_tokens


async def test_rows_select_and_slice_as_verl_does_it(bench: Bench) -> None:
    result = await AglLiteDaemon(bench.agents, config()).step([Sample({"q": "Hi"})])
    data = to_dataproto(result.batch)
    kept = data[torch.tensor([1])]
    assert kept.batch["responses"].tolist() == [result.batch.rows("responses")[1]]
    assert list(kept.non_tensor_batch["rollout_id"]) == [result.batch.rollout_ids[1]]


def test_an_empty_batch_is_an_empty_dataproto() -> None:
    from agl_lite.integrations.batch import BatchBuilder, BatchConfig

    data = to_dataproto(BatchBuilder(BatchConfig(4, 3, 0)).build())
    assert len(data) == 0
    assert tuple(data.batch["input_ids"].shape) == (0, 7)
