"""The daemon's `Batch` as VERL's `DataProto`: each flat array viewed as a torch tensor of its shape (no copy),
`uid` and `rollout_id` as non-tensor (object) arrays. Needs verl, torch, tensordict and numpy (`make verl`).
"""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from verl.protocol import DataProto

from agl_lite.integrations.batch import Batch

__all__ = ["to_dataproto"]


def _view(flat: array[Any], rows: int, width: int, dtype: torch.dtype) -> torch.Tensor:
    if rows == 0 or width == 0:
        return torch.zeros((rows, width), dtype=dtype)
    return torch.frombuffer(flat, dtype=dtype).view(rows, width)


def to_dataproto(batch: Batch, meta_info: dict[str, Any] | None = None) -> DataProto:
    """The fields VERL's PPO step reads: `prompts`, `responses`, `input_ids`, `attention_mask`,
    `position_ids`, `response_mask`, `token_level_scores`, `is_drop_mask`, `rollout_log_probs` when the batch has
    them; non-tensor `uid` (the GRPO group) and `rollout_id`."""
    b, p, r = batch.size, batch.prompt_length, batch.response_length
    tensors = {
        "prompts": _view(batch.prompts, b, p, torch.int64),
        "responses": _view(batch.responses, b, r, torch.int64),
        "input_ids": _view(batch.input_ids, b, p + r, torch.int64),
        "attention_mask": _view(batch.attention_mask, b, p + r, torch.int64),
        "position_ids": _view(batch.position_ids, b, p + r, torch.int64),
        "response_mask": _view(batch.response_mask, b, r, torch.int64),
        "token_level_scores": _view(batch.token_level_scores, b, r, torch.float32),
        "is_drop_mask": _view(batch.is_drop_mask, b, 1, torch.bool).view(b),
    }
    if batch.rollout_log_probs is not None:
        tensors["rollout_log_probs"] = _view(batch.rollout_log_probs, b, r, torch.float32)
    non_tensor = {
        "uid": np.array(batch.uid, dtype=object),
        "rollout_id": np.array(batch.rollout_ids, dtype=object),
    }
    return DataProto(
        batch=TensorDict(tensors, batch_size=[b]),
        non_tensor_batch=non_tensor,
        meta_info=dict(meta_info or {}),
    )
