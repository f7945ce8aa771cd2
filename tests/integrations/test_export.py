"""`agl-client export --rows trajectories`: one row per merged training sequence, with the reward placed as the
daemon places it and VERL's GRPO advantage within each group, in JSONL and Parquet alike."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson
import pytest

from agl_lite.client import AglLiteClient
from agl_lite.client.writers import open_writer
from agl_lite.core.server import Gateway
from agl_lite.integrations.export import export_trajectories, grpo_advantages
from agl_lite.store.records import RolloutStatus
from agl_lite.store.rules import EventSpec, RolloutSpec
from tests.client.conftest import make_call, store_of


async def _populate(gateway: Gateway) -> None:
    """Groups g1 (3 rollouts, rewards 1, 0, 0.5) and g2 (1 rollout, reward 2); two calls each, the second
    continuing the first (one merged row per rollout)."""
    store = store_of(gateway)
    rewards = {"a": 1.0, "b": 0.0, "c": 0.5, "d": 2.0}
    specs = [RolloutSpec({"q": r}, id=r, group_id="g1" if r != "d" else "g2") for r in "abcd"]
    await store.enqueue(specs)
    await store.claim("test-runner", 4)
    for rid, value in rewards.items():
        await store.add_call(make_call(rid, "a1", 0, [1, 2, 3], [[10, 11]]))
        await store.add_call(make_call(rid, "a1", 1, [1, 2, 3, 10, 11, 7], [[12]]))
        await store.add_events(rid, [EventSpec("reward", {"value": value})])
        await store.finish(rid, RolloutStatus.SUCCEEDED)


async def _export(client: AglLiteClient, path: Path, fmt: str) -> list[dict[str, Any]]:
    writer = open_writer(path, fmt, rows="trajectories")
    stats = await export_trajectories(client, writer, page_size=2)
    writer.close(ok=True)
    assert (stats.rollouts, stats.rows, stats.groups, stats.split_groups) == (4, 4, 2, 0)
    if fmt == "jsonl":
        return [orjson.loads(line) for line in path.read_bytes().splitlines()]  # noqa: ASYNC240 (a test's file)
    pq = pytest.importorskip("pyarrow.parquet")
    return [dict(r) for r in pq.read_table(path).to_pylist()]


async def test_each_rollout_is_one_merged_row_with_its_mask_reward_and_group_advantage(
    client: AglLiteClient, gateway: Gateway, tmp_path: Path
) -> None:
    await _populate(gateway)
    rows = await _export(client, tmp_path / "t.jsonl", "jsonl")
    by_id = {r["rollout_id"]: r for r in rows}
    a = by_id["a"]
    assert a["prompt_ids"] == [1, 2, 3]
    assert a["response_ids"] == [10, 11, 7, 12]  # the reply, the observation, the next reply
    assert a["response_mask"] == [1, 1, 0, 1]
    assert a["logprobs"] == [-0.5, -0.25, 0.0, -0.5]
    assert a["calls"] == ["chatcmpl-a-0", "chatcmpl-a-1"]
    assert (a["reward"], a["rollout_reward"], a["group_id"], a["model_version"]) == (1.0, 1.0, "g1", "v1")
    expected = grpo_advantages([1.0, 0.0, 0.5])
    assert [by_id[r]["advantage"] for r in "abc"] == pytest.approx(expected)
    assert expected == pytest.approx([1.0, -1.0, 0.0], abs=1e-5)  # (r - 0.5) / std, std = 0.5
    assert by_id["d"]["advantage"] == 2.0  # a group of one keeps its score, as in VERL


async def test_parquet_holds_the_same_rows(client: AglLiteClient, gateway: Gateway, tmp_path: Path) -> None:
    await _populate(gateway)
    jsonl = await _export(client, tmp_path / "t.jsonl", "jsonl")
    parquet = await _export(client, tmp_path / "t.parquet", "parquet")
    for j, p in zip(jsonl, parquet, strict=True):
        assert p["logprobs"] == pytest.approx(j["logprobs"])
        assert {k: v for k, v in p.items() if k != "logprobs"} == {
            k: v for k, v in j.items() if k != "logprobs"
        }


def test_the_advantage_is_verls() -> None:
    torch = pytest.importorskip("torch")
    np = pytest.importorskip("numpy")
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    rng = random.Random(3)
    sizes = [1, 2, 5, 8]
    scores = [[rng.choice([0.0, 1.0, rng.random()]) for _ in range(n)] for n in sizes]
    flat = [s for group in scores for s in group]
    index = np.array([str(g) for g, group in enumerate(scores) for _ in group], dtype=object)
    rewards = torch.zeros(len(flat), 3)
    rewards[:, 2] = torch.tensor(flat)
    for norm in (True, False):
        theirs, _ = core_algos.compute_grpo_outcome_advantage(
            rewards, torch.ones(len(flat), 3), index, norm_adv_by_std_in_grpo=norm
        )
        ours = [a for group in scores for a in grpo_advantages(group, norm_by_std=norm)]
        assert theirs[:, 0].tolist() == pytest.approx(ours, abs=1e-5)
