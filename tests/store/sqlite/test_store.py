"""What only the SQLite store promises: durability, group commit, a bounded WAL, waiting out a lock."""

from __future__ import annotations

import asyncio
import os
import random
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from agl_lite.errors import Conflict
from agl_lite.store.records import RolloutStatus
from agl_lite.store.rules import EventSpec, RolloutSpec
from agl_lite.store.sqlite import SQLiteStore
from agl_lite.store.sqlite import store as store_module


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


async def test_concurrent_writes_share_commits(tmp_path: Path) -> None:
    store = await SQLiteStore.open(tmp_path / "s.db")
    try:
        await store.enqueue([RolloutSpec(input=i, id=f"r{i}") for i in range(50)])
        before = store.commits
        await asyncio.gather(*(store.add_events(f"r{i}", [EventSpec("e")]) for i in range(50)))
        assert store.commits - before < 50  # group commit: fewer transactions than acknowledged writes
    finally:
        await store.close()


def _noop(repo: object) -> None:
    return None


async def test_a_lone_write_commits_at_once_and_writes_in_bursts_wait_for_company(tmp_path: Path) -> None:
    """Group commit across loop iterations: a lone writer (one agent) never waits for one; after a commit of several
    writes, writes that keep coming, one per iteration, share commits (fewer commits: less CPU per write), a batch
    waiting LINGER_ITERATIONS iterations at most."""
    store = await SQLiteStore.open(tmp_path / "s.db")

    async def burst() -> None:
        await asyncio.gather(*(store._submit(_noop) for _ in range(3)))  # one commit of three

    try:
        alone = store._submit(_noop)
        await asyncio.sleep(0)  # one loop iteration: the flush scheduled before this task's wake-up ran
        assert alone.done()
        await burst()
        # After a burst, a lone write waits one iteration for company that does not come; the ones after it (their
        # last commit held one write) none.
        after = store._submit(_noop)
        await asyncio.sleep(0)
        assert not after.done()
        await asyncio.sleep(0)
        assert after.done()
        alone = store._submit(_noop)
        await asyncio.sleep(0)
        assert alone.done()
        await burst()
        before = store.commits
        spread = []
        # One write per iteration, as flows end one by one: the first LINGER_ITERATIONS + 1 share a commit (no more:
        # a batch waits that many iterations at most), the one after starts the next.
        for _ in range(store_module.LINGER_ITERATIONS + 2):
            spread.append(store._submit(_noop))
            await asyncio.sleep(0)
        await asyncio.gather(*spread)
        assert store.commits - before == 2
    finally:
        await store.close()


async def test_big_commits_checkpoint_the_wal_by_their_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With writes batched by the dozen, a checkpoint every 256 commits let the WAL grow to 86 MB between two.
    monkeypatch.setattr(store_module, "CHECKPOINT_EVERY", 10**9)
    monkeypatch.setattr(store_module, "CHECKPOINT_EVERY_WRITES", 64)
    store = await SQLiteStore.open(tmp_path / "s.db")
    try:
        for _ in range(10):  # ten commits of 32 writes
            await asyncio.gather(*(store._submit(_noop) for _ in range(32)))
            for _ in range(500):  # (bounded) the writer thread's checkpoint, if one was asked, is done
                if store._checkpoints_done == store._checkpoints_asked:
                    break
                await asyncio.sleep(0.01)
        assert store.commits == 10
        assert store._checkpoints_asked == 5  # 320 writes: one checkpoint every 64
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


WRITER = """
import asyncio, sys
from agl_lite.core.logs import configure_logging
from agl_lite.store.rules import EventSpec, RolloutSpec
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
    monkeypatch.setattr(store_module, "WAL_LIMIT", 256 * 1024)
    monkeypatch.setattr(store_module, "CHECKPOINT_EVERY", 8)
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
        sizes: list[int] = []
        truncations = 0
        # Until the WAL was cut twice: a few hundred writes alone, more in a process that ran the whole suite
        # before (bounded: 6,000 writes, a few seconds).
        for _ in range(6000):
            await store.add_events("r", [EventSpec("note", os.urandom(2048).hex())])
            size = wal.stat().st_size
            # A WAL file only shrinks when a checkpoint truncates it: without one it grew all along (10 MB here).
            truncations += bool(sizes) and size < sizes[-1]
            sizes.append(size)
            if truncations >= 2:
                break
        writing = False
        await asyncio.gather(*reads)
        assert truncations >= 2, sizes[::100]
    finally:
        writing = False
        await store.close()
    assert not wal.exists() or wal.stat().st_size == 0
