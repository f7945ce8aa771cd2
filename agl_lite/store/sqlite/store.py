"""The SQLite store: one writer with group commit (on the loop, or on its thread when it must), readers on their own
connections, and the WAL kept bounded.

A write is acknowledged only after the transaction holding it committed; each operation runs in a savepoint, so a
rejected one changes nothing while the rest of its batch commits. `synchronous=NORMAL` survives a crash of the
process; `FULL` also survives power loss, at a cost.
"""

from __future__ import annotations

import asyncio
import queue
import sqlite3
import threading
import time
from array import array
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, TypeVar

import structlog

from agl_lite.errors import ConfigError, HttpError, InsufficientStorage, InternalError, ServiceUnavailable
from agl_lite.store.packed_ids import PrefixIndex
from agl_lite.store.rules import Store
from agl_lite.store.sqlite.repo import SQLiteRepo, connect
from agl_lite.store.sqlite.schema import migrate

__all__ = ["SQLiteStore", "admit", "closing_error", "commit_error", "settle_all"]

log = structlog.get_logger("agl_lite.store.sqlite")

T = TypeVar("T")

_Item = tuple[Callable[[SQLiteRepo], Any], asyncio.Future[Any], asyncio.AbstractEventLoop]
_CHECKPOINT = "checkpoint"
_Job = list[_Item] | str | None

CHECKPOINT_EVERY = 256
"""Commits between two WAL checkpoints (about what SQLite's own 1000-page default gives when commits are small), or
`CHECKPOINT_EVERY_WRITES` writes if those come first."""
CHECKPOINT_EVERY_WRITES = 2048
"""Writes between two WAL checkpoints, whatever the commits: a commit holds one write or dozens (`_flush`), and 256
commits of dozens let the WAL grow past `WAL_LIMIT` between checkpoints (86 MB under the gateway bench)."""
TRUNCATE_WAIT_S = 0.5
"""How long a WAL truncation waits for reads in flight (writes queue meanwhile) before it gives up until the next."""
WAL_LIMIT = 64 * 1024 * 1024
"""WAL bytes past which a checkpoint waits for the readers and truncates it. A passive checkpoint never waits, and
with reads always in flight the WAL never restarts: it grew to 2.1 GB beside a 0.5 GB database under load."""
LINGER_ITERATIONS = 3
"""Loop iterations a batch may wait for more writes when the writes come in bursts (see `SQLiteStore._flush`)."""
LOCK_WAIT_S = 10.0
"""How long the writer thread waits for a database locked by another process before it fails the writes (503)."""


class _Locked(Exception):
    """Another connection holds the database's write lock."""


RETRY_AFTER_S = 5
"""What a write refused for want of disk (507) or of a writable database (503) tells its client to wait."""

_UNWRITABLE = frozenset(
    {sqlite3.SQLITE_READONLY, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PROTOCOL}
)


def closing_error() -> ServiceUnavailable:
    """What a read or a write asked once the store began to close gets (a write then would wait for good)."""
    return ServiceUnavailable("the store is closing; retry later", headers={"Retry-After": "1"})


def commit_error(exc: BaseException) -> HttpError:
    """The client's answer for a write the database could not commit. A full disk (507) and a database that cannot
    be written (read-only, I/O errors: 503) are conditions of the machine that pass: each says when to retry, and
    the next write tries again (nothing stays broken). Anything else is a 500."""
    retry = {"Retry-After": str(RETRY_AFTER_S)}
    if isinstance(exc, _Locked):
        return ServiceUnavailable(
            "the store's database is locked by another process; retry later", headers=retry
        )
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    if primary == sqlite3.SQLITE_FULL:
        return InsufficientStorage(
            "the store's disk is full; nothing was written, retry later", headers=retry
        )
    if primary in _UNWRITABLE:
        name = getattr(exc, "sqlite_errorname", "error")
        return ServiceUnavailable(
            f"the store cannot write its database ({name}); nothing was written, retry later", headers=retry
        )
    return InternalError("the store could not commit the write")


class SQLiteStore(Store):
    """`await SQLiteStore.open(path)`. One writer with group commit: the writes made during one event-loop iteration
    commit together, in one transaction of up to `batch` operations.

    With `synchronous = "NORMAL"` (the default) a commit is a write into the WAL, without fsync, so the transaction
    runs right on the loop, where the writes were made: no thread hand-off, and no GIL convoy. (A writer thread
    behind a busy loop waits for the GIL after every SQLite call, up to the 5 ms switch interval each time: that made
    commits take 14-30 ms with 32 calls in flight.) The writer thread does what must not stall the loop: every
    transaction under `synchronous = "FULL"` (an fsync per commit), a batch that found the database locked by another
    process (it waits up to `LOCK_WAIT_S`, the writes made meanwhile queue behind it), and the WAL checkpoints (they
    fsync; on their own connection, without blocking the writer).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
        batch: int = 256,
        queue_size: int = 10_000,
        readers: int = 2,
    ) -> None:
        super().__init__()
        self.path = str(path)
        self.synchronous = synchronous
        self.batch = batch
        self._inline = synchronous != "FULL"
        self._queue: queue.Queue[_Job] = queue.Queue()
        self._queue_size = queue_size
        self._pending: list[_Item] = []
        # Counters with one writer each, so that no update is lost between the loop and the thread.
        self._submitted = 0  # writes made (the loop's)
        self._handed = 0  # batches handed to the writer thread (the loop's)
        self._thread_done = 0  # batches the writer thread finished whose notes ran on the loop (the loop's)
        self._checkpoints_asked = 0  # (the loop's)
        self._checkpoints_done = 0  # (the thread's)
        self._since_checkpoint = 0  # commits (the loop's)
        self._writes_since_checkpoint = 0  # (the loop's)
        self._last_batch = 0  # writes in the last batch that left `_pending` (committed here or handed over)
        # One transaction at a time on the writer's connection (the loop's or the thread's); guards `ops`, `commits`.
        self._lock = threading.Lock()
        self._writer: threading.Thread | None = None
        self._closing = False  # from the start of `close`: reads and writes are refused (503)
        self._local = threading.local()
        self._readers = ThreadPoolExecutor(max_workers=readers, thread_name_prefix="agl-sqlite-read")
        self._reader_conns: list[sqlite3.Connection] = []  # closed with the store, so that its WAL goes too
        self._read_gate = threading.Lock()
        self._notes: dict[asyncio.Future[Any], Callable[[Any], object]] = {}  # (`_submit`, `settle_all`)
        self._index = PrefixIndex()
        self._repo: SQLiteRepo  # the writer's, on the writer connection (`open`)
        self.commits = 0
        self.ops = 0

    @classmethod
    async def open(cls, path: str | Path, **kwargs: Any) -> SQLiteStore:
        store = cls(path, **kwargs)
        await asyncio.to_thread(store._prepare)
        store._repo = SQLiteRepo(store._conn, store._index)
        store._writer = threading.Thread(target=store._write_loop, name="agl-sqlite-writer", daemon=True)
        store._writer.start()
        return store

    def _prepare(self) -> None:
        try:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            self._conn = connect(self.path, self.synchronous)
            self._conn.execute("PRAGMA busy_timeout = 0")  # a locked database goes to the thread (`_begin`)
            version = int(self._conn.execute("PRAGMA user_version").fetchone()[0])
        except sqlite3.Error as exc:
            raise ConfigError(f"cannot open the store {self.path}: {exc}") from exc
        migrate(self._conn, self.path, version)
        if self._inline:
            # Checkpoints run on the writer thread, off the loop (see `_flush`).
            self._conn.execute("PRAGMA wal_autocheckpoint = 0")
        # A WAL that a checkpoint restarted is cut back to this size, not kept at its largest.
        self._conn.execute(f"PRAGMA journal_size_limit = {WAL_LIMIT}")

    @property
    def queue_depth(self) -> int:
        return self._submitted - self.ops

    async def _write(self, fn: Callable[[SQLiteRepo], T]) -> T:
        return await self._submit(fn)

    def _submit(
        self, fn: Callable[[SQLiteRepo], T], note: Callable[[T], object] | None = None
    ) -> asyncio.Future[T]:
        if self._writer is None:
            raise RuntimeError("SQLiteStore.open() was not awaited")
        if self._closing:
            raise closing_error()
        fut, loop = admit(self._submitted - self.ops, self._queue_size, self._notes, note)
        pending = self._pending
        if not pending:
            loop.call_soon(self._flush, 0, 0)
        pending.append((fn, fut, loop))
        self._submitted += 1
        return fut

    def _flush(self, seen: int = -1, lingered: int = 0) -> None:
        """Commit the writes made so far: here, or on the writer thread when it must or is busy (order kept).

        A commit costs about as much again as the inserts it holds (BEGIN, the WAL frames of every page it touched,
        and later their checkpoint), so under load more writes per commit is less CPU per write: 28 -> 19 us of
        CPU per captured call from 3 to 8 calls a commit, checkpoints included (measured off-line). So when the
        last batch held more than one write (writes come in bursts: many flows in flight), the batch waits one
        more loop iteration, up to `LINGER_ITERATIONS`, for as long as each iteration brought more writes. A lone
        writer (one agent, c=1) does not wait: its batches hold one write (only the first write after a burst
        waits one iteration, for company that does not come). Nor does a batch wait while the writer thread is
        busy: it goes there, where it joins whatever queued behind it anyway. `seen` is how many writes were
        pending when the last iteration scheduled this (-1: commit now, as `close` asks), `lingered` how many
        iterations the batch has waited so far.
        """
        pending = self._pending
        if (
            seen >= 0
            and self._last_batch > 1
            and lingered < LINGER_ITERATIONS
            and len(pending) > seen
            and len(pending) < self.batch
            and self._inline
            and self._handed == self._thread_done
        ):
            asyncio.get_running_loop().call_soon(self._flush, len(pending), lingered + 1)
            return
        batch, self._pending = pending, []
        self._last_batch = len(batch)
        while batch:
            chunk, batch = batch[: self.batch], batch[self.batch :]
            if not (
                self._inline and self._handed == self._thread_done and self._lock.acquire(blocking=False)
            ):
                self._hand_over(chunk)
                continue
            try:
                committed = self._commit_batch(chunk, wait=False)
            finally:
                self._lock.release()
            if not committed:
                self._hand_over(chunk)
                continue
            self._since_checkpoint += 1
            self._writes_since_checkpoint += len(chunk)
            if (
                _checkpoint_due(self._since_checkpoint, self._writes_since_checkpoint)
                and self._checkpoints_asked == self._checkpoints_done
            ):
                self._since_checkpoint = self._writes_since_checkpoint = 0
                self._checkpoints_asked += 1
                self._queue.put_nowait(_CHECKPOINT)

    def _hand_over(self, batch: list[_Item]) -> None:
        self._handed += 1
        self._queue.put_nowait(batch)

    async def _read(self, fn: Callable[[SQLiteRepo], T]) -> T:
        if self._closing:
            raise closing_error()
        return await asyncio.get_running_loop().run_in_executor(self._readers, self._run_read, fn)

    def _run_read(self, fn: Callable[[SQLiteRepo], T]) -> T:
        repo = getattr(self._local, "repo", None)
        if repo is None:
            repo = self._local.repo = SQLiteRepo(connect(self.path, self.synchronous))
            self._reader_conns.append(repo.conn)
        with self._read_gate:  # (held by a WAL truncation only, for as long as the reads in flight take)
            repo.conn.execute("BEGIN")
        try:
            return fn(repo)
        finally:
            repo.conn.execute("COMMIT")

    def _write_loop(self) -> None:
        checkpointer: sqlite3.Connection | None = None
        stop = False
        thread_commits = thread_writes = 0  # since the last look at the WAL's size
        while not stop:
            job = self._queue.get()
            if job is None:
                break
            if isinstance(job, str):
                if checkpointer is None:
                    checkpointer = connect(self.path, self.synchronous)
                try:
                    checkpointer.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                    if _wal_bytes(self.path) > WAL_LIMIT:
                        self._truncate_wal(checkpointer)
                except sqlite3.Error as exc:
                    log.warning("WAL checkpoint failed", error=repr(exc))
                self._checkpoints_done += 1
                continue
            batch, handed = job, 1
            while len(batch) < self.batch:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                if isinstance(nxt, str):
                    self._queue.put_nowait(nxt)  # after this batch
                    break
                batch += nxt
                handed += 1
            with self._lock:
                self._commit_batch(batch, wait=True)
                # Commits made here count for the WAL's bound too: every one under FULL, and under NORMAL those
                # handed over (a lock, a busy writer). Counted on the loop only, a loaded box whose commits stayed
                # on the thread never checkpointed again, and its WAL grew without bound.
                thread_commits += 1
                thread_writes += len(batch)
                if _checkpoint_due(thread_commits, thread_writes):
                    thread_commits = thread_writes = 0
                    if _wal_bytes(self.path) > WAL_LIMIT:
                        self._truncate_wal(self._conn)
            # Counted on the loop, after the notes this batch sent there (`call_soon_threadsafe` keeps their order).
            batch[0][2].call_soon_threadsafe(self._thread_settled, handed)
        if checkpointer is not None:
            checkpointer.close()

    def _thread_settled(self, handed: int) -> None:
        """On the loop: the thread's batches done, their notes run. Counted on the thread, the loop committed its
        next batch inline before these notes ran, and that batch's notes ran first: a gate's note put back an
        attempt whose end committed after it, a first read of a rollout's token total overwrote a call counted after
        it (`settle_all` promises commit order). (A closed loop never gets here: the notes' hand-off fails first.)"""
        self._thread_done += handed

    def _truncate_wal(self, conn: sqlite3.Connection) -> None:
        """Checkpoint the whole WAL and cut it to nothing. That needs a moment when no read holds an older
        snapshot: this store's own reads wait at the gate meanwhile (those in flight finish), and another
        process's reads get `TRUNCATE_WAIT_S` before the next try."""
        with self._read_gate:
            conn.execute(f"PRAGMA busy_timeout = {int(TRUNCATE_WAIT_S * 1000)}")
            try:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            except sqlite3.Error as exc:
                log.warning("WAL checkpoint failed", error=repr(exc))
            finally:
                conn.execute(f"PRAGMA busy_timeout = {0 if conn is self._conn else 10000}")

    def _commit_batch(self, batch: list[_Item], *, wait: bool) -> bool:
        """Run a batch in one transaction and settle its futures; False if the database was locked and `wait` is
        False (nothing was done). The store's rules raise an HttpError only before an operation's first write (they
        validate first), so a rejected operation leaves nothing to undo and needs no savepoint. Any other failure
        rolls the batch back and runs its operations again one transaction each, so only the failing one fails."""
        repo = self._repo
        try:
            results, added = self._run_batch(repo, batch, wait)
        except _Locked:
            if not wait:
                return False
            log.error("store database locked by another connection", path=self.path, waited_s=LOCK_WAIT_S)
            locked = ServiceUnavailable(
                "the store's database is locked by another process; retry later", headers={"Retry-After": "1"}
            )
            results, added = [(fut, loop, None, locked) for _, fut, loop in batch], []
        except sqlite3.Error as exc:
            log.warning(
                "store batch failed; retrying its writes one by one", error=repr(exc), size=len(batch)
            )
            results, added = [], []
            for item in batch:
                try:
                    one, one_added = self._run_batch(repo, [item], True)
                except (sqlite3.Error, _Locked) as exc_one:
                    log.error("store commit failed", error=repr(exc_one))
                    one = [(item[1], item[2], None, commit_error(exc_one))]
                    one_added = []
                results += one
                added += one_added
        self.commits += 1
        self.ops += len(batch)
        for scope, ref, ids in added:
            self._index.add(scope, ref, ids)
        by_loop: dict[asyncio.AbstractEventLoop, list[_Settled]] = {}
        notes = self._notes
        for fut, loop, value, error in results:
            by_loop.setdefault(loop, []).append((fut, value, error, notes.pop(fut, None)))
        running = asyncio._get_running_loop()
        for loop, settled in by_loop.items():  # one hand-off per batch and loop, not one per write
            if loop is running:
                settle_all(settled)
            else:
                loop.call_soon_threadsafe(settle_all, settled)
        return True

    def _begin(self, wait: bool) -> None:
        """BEGIN IMMEDIATE; a database locked by another connection raises `_Locked`, at once or after waiting."""
        deadline: float | None = None
        while True:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorcode not in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
                    raise
            if not wait:
                raise _Locked
            now = time.monotonic()
            deadline = deadline or now + LOCK_WAIT_S
            if now >= deadline:
                raise _Locked
            time.sleep(0.005)

    def _run_batch(
        self, repo: SQLiteRepo, batch: list[_Item], wait: bool
    ) -> tuple[
        list[tuple[asyncio.Future[Any], asyncio.AbstractEventLoop, Any, BaseException | None]], list[Any]
    ]:
        results: list[tuple[asyncio.Future[Any], asyncio.AbstractEventLoop, Any, BaseException | None]] = []
        added: list[tuple[str, int, array[int]]] = []
        conn = self._conn
        self._begin(wait)
        try:
            for fn, fut, loop in batch:
                try:
                    value = fn(repo)
                except HttpError as exc:
                    repo.end_op(False)
                    results.append((fut, loop, None, exc))
                    continue
                except sqlite3.Error:
                    raise
                except Exception as exc:  # a bug: its partial writes must not be committed with the batch
                    raise sqlite3.OperationalError(f"operation failed: {exc!r}") from exc
                added += repo.end_op(True)
                results.append((fut, loop, value, None))
            conn.execute("COMMIT")
        except BaseException:
            repo.end_op(False)
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return results, added

    async def close(self) -> None:
        """Commit what is pending, then close every connection: the last one checkpoints and removes the WAL (a
        clean exit leaves the database file alone, and the next start has no log to replay). What is asked from
        here on is refused (503): a write would queue behind the writer's stop and never settle."""
        self._closing = True
        self._readers.shutdown(wait=True)
        for conn in self._reader_conns:
            conn.close()
        self._reader_conns.clear()
        if self._writer is not None:
            self._flush()  # writes of this loop iteration not committed yet go first
            self._queue.put(None)
            await asyncio.to_thread(self._writer.join)
            self._writer = None
            try:
                self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error as exc:
                log.warning("final WAL checkpoint failed", error=repr(exc))
            self._conn.close()

    def token_bytes(self) -> int:
        repo = SQLiteRepo(connect(self.path, self.synchronous))
        try:
            return repo.token_bytes()
        finally:
            repo.conn.close()


def _checkpoint_due(commits: int, writes: int) -> bool:
    """Whether the WAL is due a look (a checkpoint; on the thread, its size) after these commits and writes."""
    return commits >= CHECKPOINT_EVERY or writes >= CHECKPOINT_EVERY_WRITES


def _wal_bytes(path: str) -> int:
    try:
        return Path(path + "-wal").stat().st_size
    except OSError:
        return 0


_Settled = tuple[asyncio.Future[Any], Any, BaseException | None, Callable[[Any], object] | None]


def admit(
    depth: int,
    limit: int,
    notes: dict[asyncio.Future[Any], Callable[[Any], object]],
    note: Callable[[T], object] | None,
) -> tuple[asyncio.Future[T], asyncio.AbstractEventLoop]:
    """A queued write's future (and its loop), its note kept for `settle_all`; 503 past `limit` writes waiting."""
    if depth >= limit:
        raise ServiceUnavailable("the store's write queue is full; retry later", headers={"Retry-After": "1"})
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[T] = loop.create_future()
    if note is not None:
        notes[fut] = note
    return fut, loop


def settle_all(settled: list[_Settled]) -> None:
    """Each write's note (`Store._then_note`: what the store keeps of it), in commit order and before any waiter
    resumes, also for a write whose caller stopped waiting; then the waiters' results."""
    for fut, value, error, note in settled:
        if note is not None and error is None:
            try:
                note(value)
            except Exception as exc:  # a bug in a note must not keep the other writes' callers waiting
                log.error("a store write's note failed", error=repr(exc), exc_info=exc)
        if fut.cancelled():
            continue
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(value)
