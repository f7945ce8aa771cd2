"""Export: one row per call and choice, only the chosen rollouts and (by default) only calls that reached the agent;
JSONL and Parquet hold the same rows; a failed export leaves no file."""

from __future__ import annotations

import base64
import random
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from agl_lite.client import AglLiteClient
from agl_lite.client.errors import MissingDependency
from agl_lite.client.export import call_rows, export_calls
from agl_lite.client.writers import JsonlWriter, ParquetWriter, open_writer
from agl_lite.core.server import Gateway
from agl_lite.store.records import CallOutcome, RolloutStatus
from agl_lite.store.rules import EventSpec, Store
from tests.client.conftest import make_call, running, store_of


async def populate(store: Store) -> None:
    """r1, r2 succeeded (3 calls each, the last of r2 failed upstream), r3 failed; r1 rewarded."""
    await running(store, "r1", "r2", "r3")
    for rid in ("r1", "r2", "r3"):
        for k in range(3):
            outcome = CallOutcome.UPSTREAM_ERROR if (rid, k) == ("r2", 2) else CallOutcome.OK
            call = make_call(rid, "a1", k, [1, 2, 3, k], [[10 + k, 11], [20 + k]], outcome=outcome)
            call.labels = {"turn": str(k), "tool": "search"} if k else {}  # as an addon would set them
            await store.add_call(call)
    await store.finish("r1", RolloutStatus.SUCCEEDED)
    await store.finish("r2", RolloutStatus.SUCCEEDED)
    await store.finish("r3", RolloutStatus.FAILED)
    await store.add_events("r1", [EventSpec("reward", {"value": 0.75})])


async def expected_rows(store: Store, *rollout_ids: str, only_ok: bool = True) -> list[dict[str, Any]]:
    rows = []
    for rid in rollout_ids:
        rollout = await store.get_rollout(rid)
        for seq, call in enumerate(await store.calls(rid)):
            if only_ok and call.outcome is not CallOutcome.OK:
                continue
            rows += [orjson.loads(orjson.dumps(r, default=list)) for r in call_rows(rollout, call, seq)]
    return rows


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


async def export(client: AglLiteClient, path: Path, fmt: str = "jsonl", **kwargs: Any) -> None:
    writer = open_writer(path, fmt)
    await export_calls(client, writer, **kwargs)
    writer.close(ok=True)


async def test_rows_are_one_per_choice_with_the_training_fields(gateway: Gateway) -> None:
    store = store_of(gateway)
    await populate(store)
    rollout, (call, *_) = await store.get_rollout("r1"), await store.calls("r1")
    rows = list(call_rows(rollout, call, 0))
    assert [r["choice"] for r in rows] == [0, 1]
    first = rows[0]
    assert (first["rollout_id"], first["attempt_id"], first["seq"], first["order_key"]) == ("r1", "a1", 0, 0)
    assert (first["prompt_ids"].tolist(), first["response_ids"].tolist()) == ([1, 2, 3, 0], [10, 11])
    assert first["logprobs"].tolist() == [-0.5, -0.25]
    assert (first["reward"], first["model_version"], first["response_id"]) == (0.75, "v1", "chatcmpl-r1-0")
    assert first["messages"] == [{"role": "user", "content": "turn 0"}]


async def test_jsonl_has_the_succeeded_rollouts_ok_calls_exactly(
    client: AglLiteClient, gateway: Gateway, tmp_path: Path
) -> None:
    store = store_of(gateway)
    await populate(store)
    await export(client, tmp_path / "out.jsonl", page_size=1)
    assert read_jsonl(tmp_path / "out.jsonl") == await expected_rows(store, "r1", "r2")
    assert len(read_jsonl(tmp_path / "out.jsonl")) == 2 * 3 + 2 * 2


async def test_a_page_ended_by_the_gateways_byte_cap_is_not_the_last(
    client: AglLiteClient, gateway: Gateway, tmp_path: Path
) -> None:
    # Three calls of ~3.5 MiB stored each (incompressible): the gateway's first page holds two (PAGE_BYTES,
    # 8 MiB), fewer than page_size.
    store = store_of(gateway)
    await running(store, "big")
    for k in range(3):
        call = make_call("big", "a1", k, [1, 2, 3, k], [[10 + k]])
        noise = base64.b64encode(random.Random(k).randbytes(3 * 1024 * 1024)).decode()
        call.request = {"messages": [{"role": "user", "content": noise}]}
        await store.add_call(call)
    await store.finish("big", RolloutStatus.SUCCEEDED)
    await export(client, tmp_path / "big.jsonl", page_size=100)
    assert [row["order_key"] for row in read_jsonl(tmp_path / "big.jsonl")] == [0, 1, 2]


async def test_all_outcomes_and_another_status(
    client: AglLiteClient, gateway: Gateway, tmp_path: Path
) -> None:
    store = store_of(gateway)
    await populate(store)
    await export(client, tmp_path / "all.jsonl", only_ok=False)
    await export(client, tmp_path / "failed.jsonl", status=RolloutStatus.FAILED)
    assert read_jsonl(tmp_path / "all.jsonl") == await expected_rows(store, "r1", "r2", only_ok=False)
    assert read_jsonl(tmp_path / "failed.jsonl") == await expected_rows(store, "r3")


async def test_parquet_holds_the_same_rows_as_jsonl(
    client: AglLiteClient, gateway: Gateway, tmp_path: Path
) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    store = store_of(gateway)
    await populate(store)
    await export(client, tmp_path / "out.parquet", "parquet")
    rows = pq.read_table(tmp_path / "out.parquet").to_pylist()
    for row in rows:
        row["messages"] = orjson.loads(row["messages"])
        row["labels"] = dict(row["labels"])  # a parquet map<string, string> reads back as its pairs
    assert rows == await expected_rows(store, "r1", "r2")
    assert {r["labels"].get("turn") for r in rows} == {None, "1", "2"}


def test_parquet_without_pyarrow_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(MissingDependency, match=r"agl-lite\[parquet\]"):
        ParquetWriter(tmp_path / "out.parquet")
    assert list(tmp_path.iterdir()) == []


def test_a_failed_export_leaves_no_file(tmp_path: Path) -> None:
    writer = JsonlWriter(tmp_path / "out.jsonl")
    writer.write({"a": 1})
    writer.close(ok=False)
    assert list(tmp_path.iterdir()) == []


def test_a_finished_export_leaves_only_the_file(tmp_path: Path) -> None:
    writer = JsonlWriter(tmp_path / "out.jsonl")
    writer.write({"a": 1})
    writer.close(ok=True)
    assert [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]
