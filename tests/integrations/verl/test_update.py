"""After advantages: rows marked for an over-long prompt go, then a whole number of mini-batches stays."""

from __future__ import annotations

import pytest

pytest.importorskip("verl.protocol")

from agl_lite.integrations.batch import BatchBuilder, BatchConfig
from agl_lite.integrations.rewards import RowRewards
from agl_lite.integrations.trajectory import single_rows
from agl_lite.integrations.verl.dataproto import to_dataproto
from agl_lite.integrations.verl.update import drop_and_fit
from tests.integrations.conftest import tri


def batch_of(prompt_lengths: list[int]):  # type: ignore[no-untyped-def]
    builder = BatchBuilder(BatchConfig(3, 2, 0))
    for k, n in enumerate(prompt_lengths):
        (row,), _ = single_rows([tri(1, list(range(1, n + 1)), [100 + k], rollout=f"r{k}")])
        builder.add(row, RowRewards(outcome=1.0), uid="g", rollout_id=f"r{k}")
    return to_dataproto(builder.build())


def test_marked_rows_go_then_a_whole_number_of_mini_batches_stays() -> None:
    data, metrics = drop_and_fit(batch_of([1, 5, 2, 3, 9, 1, 2]), mini_batch_size=2, seed=1)
    assert metrics == {"agl_lite/rows_dropped_for_prompt": 2.0, "agl_lite/rows_dropped_for_minibatch": 1.0}
    assert len(data) == 4
    kept = {r[0] - 100 for r in data.batch["responses"].tolist()}
    assert kept < {0, 2, 3, 5, 6}  # four of the five rows with a prompt that fits
    assert not data.batch["is_drop_mask"].any()


def test_a_mini_batch_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="mini_batch_size"):
        drop_and_fit(batch_of([1]), mini_batch_size=0)
