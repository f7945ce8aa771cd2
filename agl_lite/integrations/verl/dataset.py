"""VERL's side of a step, as the daemon wants it: the dataset's rows as samples (reference answers kept out of the
agents' reach, in the rollout's metadata) and the `agl_lite:` section of VERL's config as a `DaemonConfig`.
"""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np
from omegaconf import DictConfig

from agl_lite.integrations.verl.daemon import DaemonConfig, Sample
from agl_lite.store.triplets import RewardPolicy

__all__ = ["daemon_config", "samples_of"]


def _native(value: Any) -> Any:
    """Dataset values (numpy arrays and scalars from parquet) as plain JSON-able Python."""
    if isinstance(value, np.ndarray):
        return [_native(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {str(k): _native(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_native(v) for v in value]
    return value


def samples_of(
    non_tensor: dict[str, Any], metadata_keys: tuple[str, ...] = ("reward_model",)
) -> list[Sample]:
    """One sample per dataset row: `metadata_keys` (reference answers) go to the rollout's metadata, which agents
    cannot read; every other column is the agent's input."""
    rows = len(next(iter(non_tensor.values())))
    out = []
    for i in range(rows):
        row = {k: _native(v[i]) for k, v in non_tensor.items()}
        meta = {k: row.pop(k) for k in metadata_keys if k in row}
        out.append(Sample(row, meta, f"grp-{uuid.uuid4().hex[:16]}"))
    return out


def daemon_config(config: DictConfig) -> DaemonConfig:
    agl = config.agl_lite
    return DaemonConfig(
        model=agl.model,
        max_prompt_length=config.data.max_prompt_length,
        max_response_length=config.data.max_response_length,
        pad_token_id=agl.get("pad_token_id", 0),
        n=config.actor_rollout_ref.rollout.n,
        merge=agl.get("merge", "trajectory"),
        reward_policy=RewardPolicy(agl.get("reward_policy", "last")),
        missing_reward=agl.get("missing_reward", 0.0),
        timeout_s=agl.get("timeout_s", 1800.0),
    )
