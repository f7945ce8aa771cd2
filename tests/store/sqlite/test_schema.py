"""What the SQLite store's schema promises: its version recorded, a newer one refused, every earlier one migrated."""

from __future__ import annotations

import sqlite3
from array import array
from pathlib import Path

import orjson
import pytest

from agl_lite.errors import ConfigError
from agl_lite.store.rules import EventSpec, RolloutFilter, RolloutSpec
from agl_lite.store.sqlite import SCHEMA_VERSION, SQLiteStore
from agl_lite.store.sqlite import repo as repo_module
from agl_lite.store.sqlite import schema as schema_module
from tests.store.sqlite.conftest import TurnCall


async def test_schema_version_is_recorded_and_a_newer_one_refused(tmp_path: Path) -> None:
    store = await SQLiteStore.open(tmp_path / "s.db")
    await store.close()
    conn = sqlite3.connect(tmp_path / "s.db")
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(ConfigError, match="newer than this agl-lite"):
        await SQLiteStore.open(tmp_path / "s.db")


V1_CALL_ROWS = """
INSERT INTO token_seqs (id, parent, parent_len, tail) VALUES (1, NULL, 0, ?);
INSERT INTO token_seqs (id, parent, parent_len, tail) VALUES (2, 1, 20, ?);
INSERT INTO token_seqs (id, parent, parent_len, tail) VALUES (3, 2, 23, ?);
INSERT INTO token_seqs (id, parent, parent_len, tail) VALUES (4, 3, 25, ?);
"""


async def test_a_v1_store_is_migrated_with_its_calls(tmp_path: Path, turn_call: TurnCall) -> None:
    """Schema v1 kept token sequences in their own table; v2 keeps them in the call's row. A v1 file (written here
    the way v1 wrote it: turn 1's prompt, prompt + completion, then turn 2's prompt extending it, and its
    completion) opens with every call's ids and logprobs intact."""
    from agl_lite.store.codec import call_to_json
    from agl_lite.store.packed_ids import pack
    from agl_lite.store.sqlite import MIGRATIONS

    db = tmp_path / "v1.db"
    prompt1, completion1 = list(range(100, 120)), [1, 2, 3]
    prompt2 = [*prompt1, *completion1, 7, 8]
    completion2 = [4, 5]
    calls = [turn_call(1, prompt1, completion1), turn_call(2, prompt2, completion2)]
    calls[1].choices[0].logprobs = array("f", [-0.5, -0.25])
    conn = sqlite3.connect(db, isolation_level=None)
    conn.executescript(MIGRATIONS[0] + "\nPRAGMA user_version = 1;")
    tails = [prompt1, completion1, [7, 8], completion2]
    for sql, tail in zip(V1_CALL_ROWS.strip().splitlines(), tails, strict=True):
        conn.execute(sql, (pack(array("I", tail)),))
    for call, prompt_seq, choice_seq in ((calls[0], 1, 2), (calls[1], 3, 4)):
        conn.execute(
            "INSERT INTO calls (id, rollout_id, attempt_id, order_key, prompt_seq, body) VALUES (?, ?, ?, ?, ?, ?)",
            (call.id, "r", "a", call.order_key, prompt_seq, orjson.dumps(call_to_json(call))),
        )
        logprobs = call.choices[0].logprobs
        conn.execute(
            "INSERT INTO call_choices (call_id, idx, seq, logprobs) VALUES (?, 0, ?, ?)",
            (call.id, choice_seq, logprobs.tobytes() if logprobs is not None else None),
        )
    conn.close()

    store = await SQLiteStore.open(db)
    try:
        assert await store.calls("r") == calls
        assert await store.tokens_used("r") == sum(sum(c.tokens()) for c in calls) > 0  # v3 filled them in
        await store.add_call(turn_call(3, [*prompt2, *completion2, 9], [6]))
        assert (await store.calls("r"))[2].prompt_token_ids == array("I", [*prompt2, *completion2, 9])
    finally:
        await store.close()
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 9
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert not tables & {"token_seqs", "call_choices", "calls_v2"}
    conn.close()


async def test_a_v3_stores_call_events_read_on_in_one_sequence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, turn_call: TurnCall
) -> None:
    """v3 kept a call's `llm_call` event as an `events` row; v4 keeps it in the call's row. A v3 file (its rows
    written here as v3 wrote them) reads as before, and the sequence goes on after its events."""
    from agl_lite.store.codec import call_to_json
    from agl_lite.store.packed_ids import pack
    from agl_lite.store.records import Event, Rollout

    db = tmp_path / "v3.db"
    with monkeypatch.context() as m:
        m.setattr(schema_module, "SCHEMA_VERSION", 3)
        store = await SQLiteStore.open(db)
        await store.close()
    rollout = Rollout(id="r", input=1, enqueue_seq=1, created_at=1.0)
    old = turn_call(1, [1, 2], [3])
    event = Event("r", 1, "llm_call", {"call_id": "c1", "order_key": 1}, "a", "gateway", 1.0)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute(
        "INSERT INTO rollouts (id, enqueue_seq, status, mode, body) VALUES ('r', 1, 'queuing', 'train', ?)",
        (orjson.dumps(rollout.to_json()),),
    )
    conn.execute(
        "INSERT INTO calls (id, rollout_id, attempt_id, order_key, prompt_shared, prompt_tail, choice_meta,"
        " choice_ids, body, tokens) VALUES ('c1', 'r', 'a', 1, 0, ?, ?, ?, ?, 1)",
        (
            pack(array("I", [1, 2])),
            pack(array("I", [0, 1, repo_module.NO_LOGPROBS])),
            pack(array("I", [3])),
            orjson.dumps(call_to_json(old)),
        ),
    )
    conn.execute(
        "INSERT INTO events (rollout_id, seq, kind, body) VALUES ('r', 1, 'llm_call', ?)",
        (orjson.dumps(event.to_json()),),
    )
    conn.close()

    store = await SQLiteStore.open(db)
    try:
        assert await store.calls("r") == [old]
        (reward,) = await store.add_events("r", [EventSpec("reward", 1.0)])
        await store.add_call(turn_call(2, [1, 2, 3, 4], [5]))
        assert [(e.seq, e.kind) for e in await store.events("r")] == [
            (1, "llm_call"),
            (2, "reward"),
            (3, "llm_call"),
        ]
        assert [e.data["call_id"] for e in await store.events("r", kind="llm_call")] == ["c1", "c2"]
        assert reward.seq == 2
    finally:
        await store.close()
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 9
    # The v3 call's event row and the reward: the new call's event is in the call's row.
    assert conn.execute("SELECT COUNT(*) FROM events").fetchone() == (2,)
    conn.close()


async def test_a_response_is_found_by_its_id_through_an_index_that_holds_no_chat_call(
    tmp_path: Path, turn_call: TurnCall
) -> None:
    """v7: a Responses API call by its id is one index search, not a scan, and the index holds only those ids: a
    chat call's random id costs its insert no index page (v6 indexed every id)."""
    store = await SQLiteStore.open(tmp_path / "s.db")
    try:
        await store.enqueue([RolloutSpec(input=1, id="r")])
        chat, response = turn_call(0, [1, 2], [3]), turn_call(1, [1, 2, 3, 4], [5])
        response.id = "resp_0001"
        for c in (chat, response):
            await store.add_call(c)
        statements: list[str] = []
        reader = sqlite3.connect(tmp_path / "s.db")
        reader.set_trace_callback(statements.append)
        assert repo_module.SQLiteRepo(reader).response_call("resp_0001") == response
        (sql,) = [s for s in statements if s.startswith("SELECT")]
        plan = " ".join(str(r) for r in reader.execute("EXPLAIN QUERY PLAN " + sql))
        assert "USING INDEX calls_response_id" in plan
        indexed = reader.execute(
            "SELECT COUNT(*) FROM calls INDEXED BY calls_response_id WHERE substr(id, 1, 5) = 'resp_'"
        )
        assert indexed.fetchone() == (1,)
        reader.close()
    finally:
        await store.close()


async def test_a_v8_store_gets_v9s_filters_filled_and_pages_them_on_indexes(
    tmp_path: Path, turn_call: TurnCall
) -> None:
    """v9 adds the list's reward, time and model-version filters: a v8 file (v9's, its additions taken out by
    hand) has them filled from its rollouts and calls, and each filter reads a page on an index, never a sort of
    every match."""
    db = tmp_path / "v8.db"
    store = await SQLiteStore.open(db)
    await store.enqueue([RolloutSpec(input=i, id=f"r{i}") for i in range(4)])
    await store.claim("runner", 4)
    for i, version in [(1, "v1"), (2, "v2"), (3, "v1")]:
        c = turn_call(i, [1, 2], [3])
        c.rollout_id, c.model_version = f"r{i}", version
        await store.add_call(c)
    await store.add_events("r2", [EventSpec("reward", 1.0)])
    await store.add_events("r3", [EventSpec("reward", 0.0)])
    expected = {r.id: r for r in await store.list_rollouts()}
    await store.close()
    conn = sqlite3.connect(db, isolation_level=None)
    for statement in (
        "DROP INDEX rollouts_scan",
        "DROP INDEX rollouts_created",
        "DROP TABLE rollout_versions",
        "ALTER TABLE rollouts DROP COLUMN reward",
        "ALTER TABLE rollouts DROP COLUMN created_at",
        "PRAGMA user_version = 8",
    ):
        conn.execute(statement)
    conn.close()

    store = await SQLiteStore.open(db)
    try:
        assert {r.id: r for r in await store.list_rollouts()} == expected
        assert [r.id for r in await store.list_rollouts(RolloutFilter(model_version="v1"))] == ["r1", "r3"]
        assert [r.id for r in await store.list_rollouts(RolloutFilter(reward_min=0.5))] == ["r2"]
        assert [r.id for r in await store.list_rollouts(RolloutFilter(reward_max=0.5))] == ["r3"]
        since = expected["r2"].created_at
        assert [r.id for r in await store.list_rollouts(RolloutFilter(created_after=since))] == [
            r.id for r in expected.values() if r.created_at >= since
        ]
    finally:
        await store.close()
    reader = sqlite3.connect(db)
    assert reader.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    for flt, index in (
        (RolloutFilter(reward_min=0.5), "rollouts_scan"),
        (RolloutFilter(model_version="v1", reward_min=0.5), "PRIMARY KEY"),
        (RolloutFilter(created_after=since, created_before=since + 60), "rollouts_scan"),
    ):
        statements: list[str] = []
        reader.set_trace_callback(statements.append)
        repo_module.SQLiteRepo(reader).list_rollouts(flt)
        reader.set_trace_callback(None)
        page = statements[-1]
        args = [
            a
            for a in (flt.model_version, flt.reward_min, flt.created_after, flt.created_before)
            if a is not None
        ]
        plan = " ".join(str(r) for r in reader.execute("EXPLAIN QUERY PLAN " + page.split(" LIMIT ")[0]))
        assert index in plan, (flt, plan)
        assert "TEMP B-TREE" not in plan, (flt, plan)  # no sort: the page is read in enqueue order
        assert "SCAN r " not in plan + " ", (flt, plan)  # no walk of the table itself
        assert args  # (the statement traced is the page's, with its filters inlined by the trace)
    reader.close()
