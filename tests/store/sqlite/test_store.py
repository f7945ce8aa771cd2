"""What only the SQLite store promises: durability, group commit, a bounded WAL, waiting out a lock."""

from __future__ import annotations

import asyncio
import os
import random
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Literal

import pytest

from agl_lite.errors import Conflict, Forbidden, ServiceUnavailable
from agl_lite.store import rules
from agl_lite.store.records import AttemptStatus, RolloutStatus
from agl_lite.store.rules import EventSpec, RolloutSpec
from agl_lite.store.sqlite import SQLiteStore
from agl_lite.store.sqlite import store as store_module
from tests.store.sqlite.conftest import TurnCall
from tests.store.test_rules import running_rollout


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


class _ThreadCommitsOnce:
    """The database locked by another process for one inline commit: that batch goes to the writer thread. The
    loop is then kept busy until the thread committed it, so that the next batch is flushed on the loop right
    after, before the thread's notes ran there."""

    def __init__(self, store: SQLiteStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.committed = threading.Event()
        self._locked = False
        begin, commit = store._begin, store._commit_batch

        def begin_locked_once(wait: bool) -> None:
            if not wait and not self._locked:
                self._locked = True
                raise store_module._Locked
            begin(wait)

        def commit_batch(batch: Any, *, wait: bool) -> bool:
            done = commit(batch, wait=wait)
            if wait:  # (only the thread waits)
                self.committed.set()
            return done

        monkeypatch.setattr(store, "_begin", begin_locked_once)
        monkeypatch.setattr(store, "_commit_batch", commit_batch)

    def busy_loop(self) -> None:
        assert self.committed.wait(10)


async def test_a_gate_committed_on_the_thread_does_not_reopen_an_attempt_that_ended_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`settle_all` runs the writes' notes in commit order. A batch the thread committed used to count as done
    before its notes ran on the loop; the loop then committed the next batch inline and ran its notes first: the
    gate's note put back an attempt that the later write had ended, and its key worked again."""
    store = await SQLiteStore.open(tmp_path / "store.db")
    try:
        await running_rollout(store, max_attempts=2)
        held = _ThreadCommitsOnce(store, monkeypatch)
        gate = asyncio.ensure_future(store.agent_gate("r1", "pod-1"))  # first sight of pod-1: a write
        await asyncio.sleep(0)  # its write queued; its flush comes next on the loop
        ended = asyncio.ensure_future(store.update_attempt("r1", "pod-1", AttemptStatus.FAILED))
        asyncio.get_running_loop().call_soon(held.busy_loop)
        await gate
        await ended
        with pytest.raises(Forbidden, match="failed"):
            await store.agent_gate("r1", "pod-1")
    finally:
        await store.close()


async def test_a_first_token_total_read_on_the_thread_does_not_drop_a_call_committed_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, turn_call: TurnCall
) -> None:
    store = await SQLiteStore.open(tmp_path / "store.db")
    try:
        await running_rollout(store, "r", token_budget=5)
        await store.start_attempt("r", "a")
        held = _ThreadCommitsOnce(store, monkeypatch)
        total = asyncio.ensure_future(store.tokens_used("r"))  # the tokens addon's first look at r
        await asyncio.sleep(0)
        await asyncio.sleep(0)  # its read queued on the writer; its flush comes next on the loop
        adding = asyncio.ensure_future(store.add_call(turn_call(1, [1, 2, 3], [4, 5])))
        asyncio.get_running_loop().call_soon(held.busy_loop)
        assert await total == 0  # read before the call committed
        await adding
        assert await store.tokens_used("r") == 5  # what the budget compares
    finally:
        await store.close()


async def test_a_claim_and_an_end_in_one_commit_leave_the_end_known_though_the_caches_were_dropped_between(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim and the trainer's cancel of the rollout in one group commit, claim first, and a third write whose
    state takes the caches past their bound. The claim kept `running` after the caches were dropped (the cancel's
    end with them): the rollout's grader key (auth asks `rollout_status`) worked for good."""
    store = await SQLiteStore.open(tmp_path / "store.db")
    try:
        await store.enqueue([RolloutSpec(input={}, id=r) for r in ("r0", "r2")])
        await store.claim("runner", 10)
        del store._status["r2"]
        await store.enqueue([RolloutSpec(input={}, id="r1")])
        monkeypatch.setattr(rules, "_KEPT", len(store._status))  # the caches full
        claiming = asyncio.ensure_future(store.claim("runner", 10))  # takes r1
        cancelling = asyncio.ensure_future(store.cancel("r1"))  # in the same commit, after the claim
        forgetting = asyncio.ensure_future(store.cancel("r2"))  # too: one past the bound
        assert [r.id for r in await claiming] == ["r1"]
        await cancelling
        await forgetting
        assert await store.rollout_status("r1") is RolloutStatus.CANCELLED
    finally:
        await store.close()


@pytest.mark.parametrize("synchronous", ["NORMAL", "FULL"])
async def test_a_write_or_read_asked_while_the_store_closes_is_refused_not_left_waiting(
    tmp_path: Path, synchronous: Literal["NORMAL", "FULL"]
) -> None:
    """A write that came while `close` waited for the writer thread queued behind its stop (always under FULL,
    where every commit is the thread's) and never settled: its caller waited for good."""
    store = await SQLiteStore.open(tmp_path / "s.db", synchronous=synchronous)
    await store.enqueue([RolloutSpec(input=0, id="r")])
    closing = asyncio.ensure_future(store.close())
    await asyncio.sleep(0)  # `close` runs up to its wait for the writer thread
    assert not closing.done()
    with pytest.raises(ServiceUnavailable, match="closing"):
        await asyncio.wait_for(store.add_events("r", [EventSpec("note", 1)]), 10)
    with pytest.raises(ServiceUnavailable, match="closing"):
        await asyncio.wait_for(store.events("r"), 10)
    await closing
