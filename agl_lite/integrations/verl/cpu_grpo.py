"""One GRPO update on the daemon's `DataProto`, on CPU, with VERL's own algorithm functions: the group-relative
advantage (`compute_grpo_outcome_advantage`) and the clipped policy loss (`compute_policy_loss_vanilla`, through
`agg_loss`) from `verl.trainer.ppo.core_algos`. What VERL's Ray trainer does around them (FSDP workers, micro-
batches across GPUs, vLLM's sleep and wake) is left out; the batch, the advantage and the loss are the same
(docs/learning.md says what differs on a GPU cluster).

It also measures the training-inference mismatch before the update: the log-probability of every trained token
recomputed under the weights that sampled it, against the one the server reported (`rollout_log_probs`).
Needs verl, torch and omegaconf (`make verl`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import OmegaConf
from verl.protocol import DataProto
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage, compute_policy_loss_vanilla

__all__ = ["GRPOConfig", "LogProbs", "grpo_update", "response_logprobs"]

LogProbs = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""`(input_ids, attention_mask) -> (B, T-1)`: each token's log-probability given the ones before it."""


@dataclass(frozen=True, slots=True)
class GRPOConfig:
    clip_ratio: float = 0.2
    loss_agg_mode: str = "token-mean"
    norm_adv_by_std_in_grpo: bool = True
    ppo_epochs: int = 1
    """Passes over the batch; with one, the update is on-policy (the ratio starts at 1)."""
    max_grad_norm: float = 1.0


def response_logprobs(logprobs: LogProbs, data: DataProto) -> torch.Tensor:
    """(B, R): the log-probability of each response token, aligned with `responses` and `response_mask`."""
    ids, mask = data.batch["input_ids"], data.batch["attention_mask"]
    width = data.batch["responses"].shape[1]
    return logprobs(ids, mask)[:, -width:]


def grpo_update(
    logprobs: LogProbs,
    parameters: Any,
    optimizer: torch.optim.Optimizer,
    data: DataProto,
    config: GRPOConfig | None = None,
) -> dict[str, float]:
    """Advantages, then `ppo_epochs` steps of the clipped loss over the whole batch. Returns metrics, among them
    `mismatch/mean_abs` (mean |recomputed − captured| over trained tokens, before any step) when the batch has
    `rollout_log_probs`."""
    cfg = config or GRPOConfig()
    batch = data.batch
    mask = batch["response_mask"].float()
    metrics: dict[str, float] = {}
    with torch.no_grad():
        old = response_logprobs(logprobs, data)
    if "rollout_log_probs" in set(batch.keys()):  # (a TensorDict refuses `in` itself)
        diff = (old - batch["rollout_log_probs"]).abs() * mask
        tokens = max(float(mask.sum()), 1.0)
        metrics["mismatch/mean_abs"] = float(diff.sum()) / tokens
        metrics["mismatch/max_abs"] = float(diff.max()) if diff.numel() else 0.0
    advantages, _returns = compute_grpo_outcome_advantage(
        batch["token_level_scores"],
        mask,
        data.non_tensor_batch["uid"],
        norm_adv_by_std_in_grpo=cfg.norm_adv_by_std_in_grpo,
    )
    batch["advantages"] = advantages  # as VERL's trainer keeps them: the export reads them
    actor = OmegaConf.create(
        {
            "clip_ratio": cfg.clip_ratio,
            "clip_ratio_low": None,
            "clip_ratio_high": None,
            "clip_ratio_c": 3.0,
            "global_batch_info": {},
        }
    )
    for _ in range(cfg.ppo_epochs):
        current = response_logprobs(logprobs, data)
        loss, pg = compute_policy_loss_vanilla(
            old, current, advantages, mask, loss_agg_mode=cfg.loss_agg_mode, config=actor
        )
        optimizer.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(parameters, cfg.max_grad_norm)
        optimizer.step()
        metrics.update(pg)
        metrics["actor/pg_loss"] = float(loss.detach())
        metrics["actor/grad_norm"] = float(grad_norm)
    metrics["critic/advantages/mean"] = float((advantages * mask).sum() / max(float(mask.sum()), 1.0))
    return metrics
