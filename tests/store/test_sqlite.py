"""What only the SQLite backend promises: durability, group commit, migrations, prefix-shared token storage."""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import sqlite3
import subprocess
import sys
from array import array
from pathlib import Path

import orjson
import pytest

from agl_lite.errors import ConfigError, Conflict
from agl_lite.store import sqlite as sqlite_module
from agl_lite.store.base import EventSpec, RolloutSpec
from agl_lite.store.records import CallOutcome, ChoiceRecord, LLMCall, RolloutStatus
from agl_lite.store.sqlite import SCHEMA_VERSION, SQLiteStore


async def test_data_survives_close_and_reopen(tmp_path: Path) -> None:
    store = await SQLiteStore.open(tmp_path / "s.db")
    await store.enqueue([RolloutSpec(input={"q": "x"}, id="r1", metadata={"answer": 3})])
    await store.add_events("r1", [EventSpec("note", [1, 2])])
    await store.close()
    store = await SQLiteStore.open(tmp_path / "s.db")
    try:
        rollout = await store.get_rollout("r1")
        assert (rollout.input, rollout.metadata) == ({"q": "x"}, {"answer": 3})
        assert [e.data for e in await store.events("r1")] == [[1, 2]]
    finally:
        await store.close()


async def test_schema_version_is_recorded_and_a_newer_one_refused(tmp_path: Path) -> None:
    store = await SQLiteStore.open(tmp_path / "s.db")
    await store.close()
    conn = sqlite3.connect(tmp_path / "s.db")
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(ConfigError, match="newer than this agl-lite"):
        await SQLiteStore.open(tmp_path / "s.db")


async def test_concurrent_writes_share_commits(tmp_path: Path) -> None:
    store = await SQLiteStore.open(tmp_path / "s.db")
    try:
        await store.enqueue([RolloutSpec(input=i, id=f"r{i}") for i in range(50)])
        before = store.commits
        await asyncio.gather(*(store.add_events(f"r{i}", [EventSpec("e")]) for i in range(50)))
        assert store.commits - before < 50  # group commit: fewer transactions than acknowledged writes
    finally:
        await store.close()


async def test_a_rejected_operation_does_not_spoil_its_batch(tmp_path: Path) -> None:
    store = await SQLiteStore.open(tmp_path / "s.db")
    try:
        await store.enqueue([RolloutSpec(input=1, id="ok"), RolloutSpec(input=2, id="done")])
        await store.claim("runner", 2)
        await store.finish("done", RolloutStatus.SUCCEEDED)
        results = await asyncio.gather(
            store.finish("done", RolloutStatus.FAILED),  # illegal: rolled back alone
            store.add_events("ok", [EventSpec("e")]),
            store.finish("ok", RolloutStatus.SUCCEEDED),
            return_exceptions=True,
        )
        assert isinstance(results[0], Conflict)
        assert (await store.get_rollout("ok")).status is RolloutStatus.SUCCEEDED
        assert len(await store.events("ok")) == 1
        assert (await store.get_rollout("done")).status is RolloutStatus.SUCCEEDED
    finally:
        await store.close()


def turn_call(i: int, prompt: list[int], completion: list[int]) -> LLMCall:
    return LLMCall(
        id=f"c{i}",
        order_key=i,
        outcome=CallOutcome.OK,
        api="chat",
        rollout_id="r",
        attempt_id="a",
        prompt_token_ids=array("I", prompt),
        choices=[ChoiceRecord(index=0, token_ids=array("I", completion))],
    )


async def test_thirty_turn_agent_stores_only_new_tokens(tmp_path: Path) -> None:
    rng = random.Random(0)
    store = await SQLiteStore.open(tmp_path / "s.db")
    try:
        await store.enqueue([RolloutSpec(input=1, id="r")])
        context = [rng.randrange(50_000) for _ in range(300)]  # system prompt + task
        new_tokens = len(context)
        calls = []
        for turn in range(30):
            completion = [rng.randrange(50_000) for _ in range(rng.randrange(20, 80))]
            calls.append(turn_call(turn, list(context), completion))
            observation = [rng.randrange(50_000) for _ in range(rng.randrange(10, 60))]
            context += completion + observation  # the next prompt extends prompt + completion exactly
            new_tokens += len(completion) + len(observation)
        for c in calls:
            await store.add_call(c)
        stored = store.token_bytes()
        naive = 4 * sum(len(c.prompt_token_ids or []) + len(c.choices[0].token_ids) for c in calls)
        assert stored <= 4 * new_tokens  # O(new tokens) ...
        assert stored * 8 < naive  # ... not O(turns x context)
        assert await store.calls("r") == calls  # and every call's full ids read back exactly
    finally:
        await store.close()


async def test_parallel_side_call_shares_the_common_prefix(tmp_path: Path) -> None:
    store = await SQLiteStore.open(tmp_path / "s.db")
    try:
        await store.enqueue([RolloutSpec(input=1, id="r")])
        main = list(range(1000, 1400))
        await store.add_call(turn_call(1, main, [1, 2, 3]))
        before = store.token_bytes()
        side = [*main[:350], 7, 7, 7]  # a summariser call that forks the conversation
        await store.add_call(turn_call(2, side, [9]))
        assert store.token_bytes() - before <= 4 * (3 + 1)
        assert (await store.calls("r"))[1].prompt_token_ids == array("I", side)
    finally:
        await store.close()


WRITER = """
import asyncio, sys
from agl_lite.core.logs import configure_logging
from agl_lite.store.base import EventSpec, RolloutSpec
from agl_lite.store.sqlite import SQLiteStore

async def main():
    configure_logging("warning")  # stdout carries only acknowledgements
    store = await SQLiteStore.open(sys.argv[1])
    await store.enqueue([RolloutSpec(input=0, id="r")])
    async def one(i):
        await store.add_events("r", [EventSpec("n", i)])
        print(i, flush=True)   # acknowledged: committed
    i = 0
    while True:
        await asyncio.gather(*(one(i + k) for k in range(8)))
        i += 8

asyncio.run(main())
"""


def write_until_killed(db: Path, target: int) -> list[int]:
    """Run WRITER, SIGKILL it after `target` acknowledgements; the acknowledged values."""
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(db)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    acked = []
    for line in proc.stdout:
        acked.append(int(line))
        if len(acked) >= target:
            proc.kill()  # SIGKILL, mid-flight: more writes are queued and half-committed
            break
    proc.wait()
    return acked


@pytest.mark.parametrize("trial", range(3))
async def test_sigkill_loses_no_acknowledged_write(tmp_path: Path, trial: int) -> None:
    db = tmp_path / "s.db"
    acked = await asyncio.to_thread(write_until_killed, db, random.Random(trial).randrange(50, 400))
    store = await SQLiteStore.open(db)
    try:
        present = {e.data for e in await store.events("r", limit=100_000)}
        assert set(acked) <= present
    finally:
        await store.close()


V1_CALL_ROWS = """
INSERT INTO token_seqs (id, parent, parent_len, tail) VALUES (1, NULL, 0, ?);
INSERT INTO token_seqs (id, parent, parent_len, tail) VALUES (2, 1, 20, ?);
INSERT INTO token_seqs (id, parent, parent_len, tail) VALUES (3, 2, 23, ?);
INSERT INTO token_seqs (id, parent, parent_len, tail) VALUES (4, 3, 25, ?);
"""


async def test_a_v1_store_is_migrated_with_its_calls(tmp_path: Path) -> None:
    """Schema v1 kept token sequences in their own table; v2 keeps them in the call's row. A v1 file (written here
    the way v1 wrote it: turn 1's prompt, prompt + completion, then turn 2's prompt extending it, and its
    completion) opens with every call's ids and logprobs intact."""
    from agl_lite.store.codec import call_to_json
    from agl_lite.store.sqlite import MIGRATIONS
    from agl_lite.store.tokens import pack

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
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert not tables & {"token_seqs", "call_choices", "calls_v2"}
    conn.close()


async def test_a_v3_stores_call_events_read_on_in_one_sequence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """v3 kept a call's `llm_call` event as an `events` row; v4 keeps it in the call's row. A v3 file (its rows
    written here as v3 wrote them) reads as before, and the sequence goes on after its events."""
    from agl_lite.store.codec import call_to_json
    from agl_lite.store.records import Event
    from agl_lite.store.tokens import pack

    db = tmp_path / "v3.db"
    with monkeypatch.context() as m:
        m.setattr(sqlite_module, "SCHEMA_VERSION", 3)
        store = await SQLiteStore.open(db)
        await store.enqueue([RolloutSpec(input=1, id="r")])
        await store.close()
    old = turn_call(1, [1, 2], [3])
    event = Event("r", 1, "llm_call", {"call_id": "c1", "order_key": 1}, "a", "gateway", 1.0)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute(
        "INSERT INTO calls (id, rollout_id, attempt_id, order_key, prompt_shared, prompt_tail, choice_meta,"
        " choice_ids, body, tokens) VALUES ('c1', 'r', 'a', 1, 0, ?, ?, ?, ?, 1)",
        (
            pack(array("I", [1, 2])),
            pack(array("I", [0, 1, sqlite_module._NO_LOGPROBS])),
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
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4
    # The v3 call's event row and the reward: the new call's event is in the call's row.
    assert conn.execute("SELECT COUNT(*) FROM events").fetchone() == (2,)
    conn.close()


async def test_the_sequence_goes_on_after_a_call_event_when_the_store_reopens(tmp_path: Path) -> None:
    """The writer remembers each rollout's last seq; a reopened store reads it from both tables."""
    db = tmp_path / "s.db"
    store = await SQLiteStore.open(db)
    try:
        await store.enqueue([RolloutSpec(input=1, id="r")])
        await store.add_events("r", [EventSpec("note")])
        await store.add_call(turn_call(1, [1], [2]))
    finally:
        await store.close()
    store = await SQLiteStore.open(db)
    try:
        (note,) = await store.add_events("r", [EventSpec("note")])
        assert note.seq == 3
    finally:
        await store.close()


async def test_a_batch_that_finds_the_database_locked_waits_on_the_writer_thread(tmp_path: Path) -> None:
    """The loop never waits for a lock: the batch goes to the writer thread, later writes queue behind it (in
    order), and all commit once the other connection lets go."""
    store = await SQLiteStore.open(tmp_path / "s.db")
    try:
        await store.enqueue([RolloutSpec(input=0, id="r")])
        blocker = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        first = asyncio.ensure_future(store.add_events("r", [EventSpec("n", 1)]))
        await asyncio.sleep(0)  # the first batch is tried on the loop and handed over
        await asyncio.sleep(0)
        second = asyncio.ensure_future(store.add_events("r", [EventSpec("n", 2)]))
        done, _ = await asyncio.wait({first, second}, timeout=0.2)
        assert not done  # the loop went on ...
        assert store.queue_depth == 2  # ... and both writes wait
        blocker.execute("ROLLBACK")
        blocker.close()
        await asyncio.wait_for(asyncio.gather(first, second), 10)
        assert [e.data for e in await store.events("r")] == [1, 2]
    finally:
        await store.close()


async def test_the_wal_stays_bounded_under_overlapping_reads_and_goes_on_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue #15: with reads always in flight, passive checkpoints never let the WAL restart: 2.1 GB of WAL beside a
    # 0.5 GB database after 8.5 minutes, and left behind on a clean exit.
    monkeypatch.setattr(sqlite_module, "WAL_LIMIT", 256 * 1024)
    monkeypatch.setattr(sqlite_module, "CHECKPOINT_EVERY", 8)
    db = tmp_path / "s.db"
    wal = tmp_path / "s.db-wal"
    store = await SQLiteStore.open(db, readers=4)
    writing = True

    async def read_on() -> None:
        while writing:  # bounded: the writes below end it
            await store.events("r", limit=50)

    try:
        await store.enqueue([RolloutSpec(input=0, id="r")])
        reads = [asyncio.ensure_future(read_on()) for _ in range(8)]  # more reads than threads: they overlap
        sizes = []
        for _ in range(1200):  # (enough turns of the checkpoint for a loaded CI box)
            await store.add_events("r", [EventSpec("note", os.urandom(2048).hex())])
            sizes.append(wal.stat().st_size)
        writing = False
        await asyncio.gather(*reads)
        # A WAL file only shrinks when a checkpoint truncates it: without one it grew all along (10 MB here).
        truncations = sum(1 for a, b in itertools.pairwise(sizes) if b < a)
        assert truncations >= 2, sizes[::20]
    finally:
        writing = False
        await store.close()
    assert not wal.exists() or wal.stat().st_size == 0
