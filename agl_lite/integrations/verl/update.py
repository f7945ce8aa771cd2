"""What the driver does with the daemon's batch once VERL computed advantages, before the actor update (as Agent
Lightning's bridge does): drop the rows marked for an over-long prompt, then keep a whole number of PPO mini-batches
(shuffled first, so the remainder left out is random). Advantages come first so that group statistics still
count every row. Needs verl (`make verl`).
"""

from __future__ import annotations

import torch
from verl.protocol import DataProto

__all__ = ["drop_and_fit"]


def drop_and_fit(
    data: DataProto, mini_batch_size: int, *, seed: int = 0
) -> tuple[DataProto, dict[str, float]]:
    """The rows to train on, and metrics: rows dropped for their prompt and for the mini-batch remainder."""
    if mini_batch_size < 1:
        raise ValueError("mini_batch_size must be at least 1")
    keep = (~data.batch["is_drop_mask"]).nonzero(as_tuple=True)[0]
    dropped_prompts = len(data) - len(keep)
    data = data[keep]
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed))
    fitted = len(data) // mini_batch_size * mini_batch_size
    remainder = len(data) - fitted
    data = data[order[:fitted]]
    return data, {
        "agl_lite/rows_dropped_for_prompt": float(dropped_prompts),
        "agl_lite/rows_dropped_for_minibatch": float(remainder),
    }
