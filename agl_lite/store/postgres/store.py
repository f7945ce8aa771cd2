"""The PostgreSQL store: writes in serializable transactions with group commit, retried when the server finds them
in conflict with another replica's, and reads on connections of their own.

Every write is one operation of the store's rules (`store.rules`), run on `PostgresRepo` inside a transaction at
`SERIALIZABLE` isolation. The rules read and then write (the next enqueue position is the largest plus one, a
claim takes the oldest queuing rollouts, a rollout's next event number...): under `SERIALIZABLE`, PostgreSQL
guarantees that transactions of several gateways that commit could have run one after the other, and aborts one
of any pair that could not (SQLSTATE 40001). That one is run again, whole, on fresh data. So no rollout is claimed
twice, and no transition is lost, whichever replica makes it. A write is acknowledged only after its transaction
committed.

A writer thread per process runs the transactions (psycopg's connections are blocking; the loop never waits on the
server). It takes what queued while the previous transaction ran, up to `batch` operations in one transaction
(group commit). A batch that the server aborts for a conflict runs again up to `RETRIES` times; a batch failing
otherwise is rolled back and its operations are run one transaction each, so that only the failing one fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import queue
import random
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar, cast

import orjson
import psycopg
import structlog
from psycopg import errors as pg_errors

from agl_lite.errors import ConfigError, HttpError, InternalError, ServiceUnavailable
from agl_lite.store.packed_ids import PrefixIndex
from agl_lite.store.postgres.repo import PostgresRepo
from agl_lite.store.postgres.schema import _safe, migrate, scrub
from agl_lite.store.records import ModelRecord, RolloutStatus
from agl_lite.store.rules import Serial, Store
from agl_lite.store.sqlite.store import admit, closing_error, settle_all

__all__ = ["PostgresStore"]

log = structlog.get_logger("agl_lite.store.postgres")

T = TypeVar("T")

_Item = tuple[Callable[[PostgresRepo], Any], asyncio.Future[Any], asyncio.AbstractEventLoop]

HEARTBEAT_S = 5.0
"""How often a store says its gateway is alive (`gateway_replicas`), paused or not."""
LIVE_S = 3 * HEARTBEAT_S
"""A gateway not heard of for this long is gone: the others' drains stop waiting for it."""
LOCK_WAIT_S = 5.0
"""Longest wait of a write for a lock another gateway holds (`Serial`'s, a row's)."""
UNREACHABLE_S = 5.0
"""How long a write waits for an unreachable server (reconnecting) before it fails with 503."""
RETRIES = 20
"""Runs of a transaction that the server aborted for a conflict with another's, before its writes fail (503)."""
RETRY_AFTER_S = 1
_CONFLICTS = (pg_errors.SerializationFailure, pg_errors.DeadlockDetected, pg_errors.UniqueViolation)
"""What a transaction meets when another replica's ran beside it (a read-then-insert of the same next number
included): run again on fresh data."""
_TERMINAL = frozenset(s.value for s in RolloutStatus if s.terminal)


def _lock_of(item: _Item) -> str | None:
    return item[0].key if isinstance(item[0], Serial) else None


def _lock_key(name: str) -> int:
    """A `Serial` lock's name as PostgreSQL's advisory lock key (64 bits, the same in every replica)."""
    return int.from_bytes(
        hashlib.blake2b(f"agl-lite/{name}".encode(), digest_size=8).digest(), "big", signed=True
    )


class _Split(Exception):
    """A batch conflicted with another gateway's: its operations run again one transaction each."""


class _Lost(Exception):
    """The connection to the server broke. Before the commit was sent its transaction rolled back; during the
    commit (`xid` set) the server alone knows: `results` and `added` are what the batch did, should it have."""

    def __init__(
        self, xid: str | None = None, results: list[Any] | None = None, added: list[Any] | None = None
    ):
        super().__init__(xid)
        self.xid = xid
        self.results = results or []
        self.added = added or []


class PostgresStore(Store):
    """`await PostgresStore.open(dsn)`: the store on a PostgreSQL server, shared by every gateway given the DSN."""

    shared = True

    def __init__(self, dsn: str, *, batch: int = 256, queue_size: int = 10_000, readers: int = 4) -> None:
        super().__init__()
        self.dsn = dsn
        self.batch = batch
        self._queue: queue.Queue[_Item | None] = queue.Queue()
        self._queue_size = queue_size
        self._submitted = 0  # (the loop's)
        self.ops = 0  # (the writer thread's)
        self.commits = 0
        self.conflicts = 0
        """Transactions the server aborted for a conflict with another's (and that ran again)."""
        self._notes: dict[asyncio.Future[Any], Callable[[Any], object]] = {}
        self._index = PrefixIndex()
        self._writer: threading.Thread | None = None
        self._readers = ThreadPoolExecutor(max_workers=readers, thread_name_prefix="agl-pg-read")
        self._local = threading.local()
        self._reader_conns: list[psycopg.Connection[Any]] = []
        self._conn: psycopg.Connection[Any] | None = None
        self._listener: threading.Thread | None = None
        self._closing = threading.Event()
        self._listening = threading.Event()
        self._pause_listeners: list[Callable[[dict[str, Any]], None]] = []
        self.origin = secrets.token_hex(8)
        """This store's id in its notifications (it has heard of its own writes already)."""

    @classmethod
    async def open(cls, dsn: str, **kwargs: Any) -> PostgresStore:
        store = cls(dsn, **kwargs)
        await asyncio.to_thread(store._prepare)
        store._writer = threading.Thread(target=store._write_loop, name="agl-pg-writer", daemon=True)
        store._writer.start()
        loop = asyncio.get_running_loop()
        store._listener = threading.Thread(
            target=store._listen, args=(loop,), name="agl-pg-listen", daemon=True
        )
        store._listener.start()
        # Listening before it is used: a store that `open` returned hears every commit made after it.
        if not await asyncio.to_thread(store._listening.wait, 10.0):
            await store.close()
            raise ConfigError(f"cannot listen for the store's notifications on {_safe(dsn)}")
        return store

    def _listen(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wake this process's waiters (long polls, runners) when any replica enqueues or ends a rollout: LISTEN
        on the channel the repository notifies as it commits. A notification is a hint to read again, never the
        data: one missed while the connection was down costs a waiter its timeout, not a completion."""
        while not self._closing.is_set():
            try:
                with psycopg.connect(self.dsn, autocommit=True, connect_timeout=10) as conn:
                    conn.execute("LISTEN agl_store")
                    beat = PostgresRepo(conn, origin=self.origin)
                    beat.put_replica(None, 0)
                    last_beat = time.monotonic()
                    if self._listening.is_set():  # listening again: what it missed meanwhile, read
                        asyncio.run_coroutine_threadsafe(self._caught_up(), loop)
                    self._listening.set()
                    while not self._closing.is_set():
                        if time.monotonic() - last_beat >= HEARTBEAT_S:  # (the others' drains count this one)
                            beat.put_replica(None, 0)
                            last_beat = time.monotonic()
                        for note in conn.notifies(timeout=0.5):
                            try:
                                self._heard(loop, note.payload)
                            except RuntimeError:  # the loop closed: the store is going too
                                return
                            except Exception as exc:  # another version's, or garbage: this one only is lost
                                log.warning(
                                    "unreadable store notification",
                                    payload=note.payload[:200],
                                    error=repr(exc),
                                )
            except psycopg.Error as exc:
                log.warning("store notifications lost; listening again", error=repr(exc))
                self._closing.wait(1.0)

    def _connect(self) -> psycopg.Connection[Any]:
        """The writer's connection. A lock it waits for longer than `LOCK_WAIT_S` (another gateway frozen while it
        held it) fails the batch with 503 rather than stalling every write of this gateway behind it; TCP
        keepalives notice a server that went away without a word."""
        conn = psycopg.connect(
            self.dsn,
            connect_timeout=10,
            keepalives=1,
            keepalives_idle=30,
            keepalives_interval=10,
            keepalives_count=3,
        )
        conn.execute(f"SET lock_timeout = '{int(LOCK_WAIT_S * 1000)}ms'".encode())
        conn.commit()
        conn.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
        return conn

    def _prepare(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True, connect_timeout=10) as conn:
                migrate(conn, self.dsn)
            self._conn = self._connect()
        except psycopg.Error as exc:
            raise ConfigError(
                f"cannot open the store {_safe(self.dsn)}: {scrub(str(exc), self.dsn)}"
            ) from exc

    @property
    def queue_depth(self) -> int:
        return self._submitted - self.ops

    def _heard(self, loop: asyncio.AbstractEventLoop, payload: str) -> None:
        """A notification, handed to the loop: `enqueued` wakes the runners; from another replica, `ended ORIGIN
        STATUS ROLLOUT` does here what ending it here does (the status known, its calls in flight cut, the long
        polls woken), `attempt ORIGIN ROLLOUT ATTEMPT` closes an ended attempt's key here, `model` / `unmodel ORIGIN
        NAME` tell this replica's routes of a (de)registration, and `pause ORIGIN STATE` of a shared pause."""
        if payload == "enqueued":
            loop.call_soon_threadsafe(self._notify_enqueued)
            return
        kind, _, rest = payload.partition(" ")
        origin, _, rest = rest.partition(" ")
        if origin == self.origin:
            return
        if kind == "ended":
            status, _, rollout_id = rest.partition(" ")
            if status in _TERMINAL:
                loop.call_soon_threadsafe(self._ended, rollout_id, RolloutStatus(status))
        elif kind == "pause":
            pause = orjson.loads(rest)
            for listener in self._pause_listeners:
                loop.call_soon_threadsafe(listener, pause)
        elif kind == "attempt":
            rollout_id, _, attempt_id = rest.partition(" ")
            loop.call_soon_threadsafe(self._attempt_ended, rollout_id, attempt_id)
        elif kind in ("model", "unmodel"):
            asyncio.run_coroutine_threadsafe(self._model_heard(kind == "model", rest), loop)

    async def _caught_up(self) -> None:
        """After notifications were lost (the listening connection broke): the shared pause and the models read
        again, the rollouts' states forgotten (read again when next asked), every waiter woken to read again."""
        log.info("store notifications resumed; reading what they may have missed")
        self._forget()  # the rollout states and the attempts seen: an end may have been missed
        self._notify_completion()
        self._notify_enqueued()
        try:
            state = await self.shared_pause()
            models = await self.models()
        except HttpError as exc:
            log.warning("the store could not be read after notifications resumed", error=exc.message)
            return
        for listener in self._pause_listeners:
            listener(state)  # type: ignore[arg-type]
        for model in models:
            for model_listener in self._model_listeners:
                model_listener(model)

    async def _model_heard(self, registered: bool, name: str) -> None:
        """Another replica (de)registered `name`: its record as the store has it now, to this replica's routes (a
        removal that a later registration already undid is one)."""
        try:
            record = next((m for m in await self.models() if m.name == name), None)
        except HttpError as exc:
            log.warning("a model registration could not be read", model=name, error=exc.message)
            return
        if record is not None:
            for listener in self._model_listeners:
                listener(record)
        elif not registered:
            for listener in self._model_removed:
                listener(ModelRecord(name, [], ""))

    # --- each rollout's totals ---------------------------------------------------------------------------------

    async def tokens_used(self, rollout_id: str) -> int:
        """Read each time (one row): other replicas add to it too, so no count of this process's is the total."""
        return await self._read(lambda repo: repo.rollout_tokens(rollout_id))

    async def rollout_bytes(self, rollout_id: str) -> int:
        return await self._read(lambda repo: repo.rollout_bytes(rollout_id))

    # --- the gateways sharing this store ---------------------------------------------------------------------------

    async def share_pause(self, pause: dict[str, Any] | None) -> dict[str, Any] | None:
        return await self._write(Serial(lambda repo: cast(PostgresRepo, repo).put_pause(pause), "pause"))

    async def shared_pause(self) -> dict[str, Any] | None:
        return await self._read(lambda repo: repo.get_pause())

    def on_pause(self, listener: Callable[[dict[str, Any]], None]) -> None:
        self._pause_listeners.append(listener)

    async def report_drain(self, pause_id: str, in_flight: int) -> None:
        await self._write(lambda repo: repo.put_replica(pause_id, in_flight))

    async def others_drained(self, pause_id: str) -> bool:
        return await self._read(lambda repo: repo.undrained(pause_id, LIVE_S)) == 0

    # --- writes --------------------------------------------------------------------------------------------------

    async def _write(self, fn: Callable[[PostgresRepo], T]) -> T:
        return await self._submit(fn)

    def _submit(
        self, fn: Callable[[PostgresRepo], T], note: Callable[[T], object] | None = None
    ) -> asyncio.Future[T]:
        if self._writer is None:
            raise RuntimeError("PostgresStore.open() was not awaited")
        if self._closing.is_set():
            raise closing_error()  # (it would queue behind the writer's stop and never settle)
        fut, loop = admit(self._submitted - self.ops, self._queue_size, self._notes, note)
        self._submitted += 1
        self._queue.put_nowait((fn, fut, loop))
        return fut

    def _write_loop(self) -> None:
        stop = False
        while not stop:
            item = self._queue.get()
            if item is None:
                break
            batch = [item]
            while len(batch) < self.batch:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                batch.append(nxt)
            # In submission order, one transaction per run of operations under the same lock (or none).
            for lock, run in itertools.groupby(batch, key=_lock_of):
                self._commit_batch(list(run), lock)

    def _commit_batch(self, batch: list[_Item], lock: str | None = None) -> None:
        try:
            try:
                results = self._run_retrying(batch, lock)
            except _Split:
                results = []
                for item in batch:  # in order, each its own transaction (and its own retries)
                    try:
                        results += self._run_retrying([item], lock)
                    except HttpError as exc:
                        results.append((item[1], item[2], None, exc))
        except HttpError as exc:  # the server unreachable, or conflicts without end: the same for each write
            log.error("store commit failed", error=exc.message, size=len(batch))
            results = [(fut, loop, None, exc) for _, fut, loop in batch]
        except Exception as exc:
            log.warning(
                "store batch failed; retrying its writes one by one", error=repr(exc), size=len(batch)
            )
            results = []
            for item in batch:
                try:
                    results += self._run_retrying([item], lock)
                except Exception as exc_one:
                    log.error("store commit failed", error=repr(exc_one))
                    results.append((item[1], item[2], None, _commit_error(exc_one)))
        self.ops += len(batch)
        by_loop: dict[asyncio.AbstractEventLoop, list[Any]] = {}
        for fut, loop, value, error in results:
            by_loop.setdefault(loop, []).append((fut, value, error, self._notes.pop(fut, None)))
        for loop, settled in by_loop.items():
            loop.call_soon_threadsafe(settle_all, settled)

    def _run_retrying(self, batch: list[_Item], lock: str | None) -> list[tuple[Any, ...]]:
        """The batch, run again after a conflict (up to `RETRIES` times) or a lost connection (for up to
        `UNREACHABLE_S`). A connection lost while committing is asked about first: a transaction the server did
        commit is done, and running it again would write it twice."""
        lost_since: float | None = None
        for attempt in range(RETRIES):
            try:
                return self._run_batch(batch, lock)
            except _CONFLICTS as exc:
                self.conflicts += 1
                if (
                    len(batch) > 1
                ):  # a group's reads and writes span many pages: alone, each conflicts far less
                    raise _Split from exc
                time.sleep(random.uniform(0, min(0.1, 0.002 * 2**attempt)))  # apart, so the next run differs
            except pg_errors.LockNotAvailable as exc:  # (the same for each of its writes: not one by one)
                raise _commit_error(exc) from exc
            except _Lost as lost:
                if lost.xid is not None and self._committed(lost.xid):
                    for scope, ref, ids in lost.added:
                        self._index.add(scope, ref, ids)
                    return lost.results
                lost_since = lost_since or time.monotonic()
                if time.monotonic() - lost_since > UNREACHABLE_S:
                    raise ServiceUnavailable(
                        "the store's server is unreachable; nothing was written, retry later",
                        headers={"Retry-After": str(RETRY_AFTER_S)},
                    ) from lost
                time.sleep(min(1.0, 0.05 * 2**attempt))
        raise ServiceUnavailable(
            "the store's transaction kept conflicting with other gateways'; retry later",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )

    def _committed(self, xid: str) -> bool:
        """Whether the transaction `xid` committed, asked on a new connection (for up to `UNREACHABLE_S`); a
        server that cannot say leaves the write failed (503), never run twice."""
        deadline = time.monotonic() + UNREACHABLE_S
        while True:
            try:
                with psycopg.connect(self.dsn, autocommit=True, connect_timeout=5) as conn:
                    row = conn.execute("SELECT pg_xact_status(%s::xid8)", (xid,)).fetchone()
                status = row[0] if row else None
                if status != "in progress":
                    return status == "committed"
            except psycopg.Error as exc:
                if time.monotonic() > deadline:
                    raise ServiceUnavailable(
                        "the store lost its connection while committing and cannot tell whether it did; retry "
                        "later (an enqueue with its ids is safe to repeat)",
                        headers={"Retry-After": str(RETRY_AFTER_S)},
                    ) from exc
            time.sleep(0.1)

    def _run_batch(self, batch: list[_Item], lock: str | None = None) -> list[tuple[Any, ...]]:
        conn = self._conn
        if conn is None or conn.closed:
            try:
                conn = self._conn = self._connect()
            except psycopg.OperationalError as exc:
                log.warning("store server unreachable", error=repr(exc))
                raise _Lost from exc
        if lock is None:
            return self._run_in_transaction(conn, batch)
        # `Serial` operations: the lock (of the session, every replica's) before the transaction, so that its
        # snapshot is taken once the replica before it committed.
        key = _lock_key(lock)
        try:
            conn.execute("SELECT pg_advisory_lock(%s)", (key,))
            conn.commit()
            try:
                return self._run_in_transaction(conn, batch)
            finally:
                if not conn.closed:
                    conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
                    conn.commit()
        except psycopg.OperationalError as exc:
            if conn.closed:  # (a session's locks go with it)
                raise _Lost from exc
            conn.rollback()  # (a lock that timed out left its transaction aborted)
            raise

    def _run_in_transaction(self, conn: psycopg.Connection[Any], batch: list[_Item]) -> list[tuple[Any, ...]]:
        repo = PostgresRepo(conn, self._index, self.origin)  # (the writer's)
        results: list[tuple[Any, ...]] = []
        added: list[Any] = []
        try:
            for fn, fut, loop in batch:
                try:
                    value = fn(repo)
                except HttpError as exc:  # the rules refuse before an operation's first write
                    repo.end_op(False)
                    results.append((fut, loop, None, exc))
                    continue
                except psycopg.Error:
                    raise
                except Exception as exc:  # a bug: its partial writes must not be committed with the batch
                    raise RuntimeError(f"operation failed: {exc!r}") from exc
                added += repo.end_op(True)
                results.append((fut, loop, value, None))
            xid = str(conn.execute("SELECT pg_current_xact_id()").fetchone()[0])  # type: ignore[index]
            try:
                conn.commit()
            except psycopg.OperationalError as exc:
                if conn.closed:  # committed or not: the server knows (`_committed`)
                    raise _Lost(xid, results, added) from exc
                raise
        except _Lost:
            repo.end_op(False)
            raise
        except BaseException as exc:
            repo.end_op(False)
            if not conn.closed:
                try:
                    conn.rollback()
                except psycopg.Error:
                    conn.close()
            if isinstance(exc, psycopg.OperationalError) and conn.closed:
                raise _Lost from exc
            raise
        self.commits += 1
        for scope, ref, ids in added:
            self._index.add(scope, ref, ids)
        return results

    # --- reads ---------------------------------------------------------------------------------------------------

    async def _read(self, fn: Callable[[PostgresRepo], T]) -> T:
        if self._closing.is_set():
            raise closing_error()
        return await asyncio.get_running_loop().run_in_executor(self._readers, self._run_read, fn)

    def _run_read(self, fn: Callable[[PostgresRepo], T]) -> T:
        """`fn` in a read-only snapshot (REPEATABLE READ): what several queries of one read see agrees. A
        connection the server dropped (a restart, a failover) is opened again once."""
        for attempt in (1, 2):
            conn = self._reader()
            try:
                return fn(PostgresRepo(conn, origin=self.origin))
            except psycopg.OperationalError:
                if not conn.closed or attempt == 2:
                    raise
            finally:
                if not conn.closed:
                    conn.rollback()  # (read only: nothing to keep; ends the snapshot)
        raise AssertionError("unreachable")

    def _reader(self) -> psycopg.Connection[Any]:
        conn: psycopg.Connection[Any] | None = getattr(self._local, "conn", None)
        if conn is None or conn.closed:
            try:
                conn = self._local.conn = psycopg.connect(self.dsn, connect_timeout=10)
            except psycopg.OperationalError as exc:
                raise ServiceUnavailable(
                    "the store's server is unreachable; retry later",
                    headers={"Retry-After": str(RETRY_AFTER_S)},
                ) from exc
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            conn.read_only = True
            self._reader_conns.append(conn)
        return conn

    async def close(self) -> None:
        if self._writer is not None:  # gone: the others' drains need not wait for it to be forgotten
            with contextlib.suppress(HttpError):
                await self._write(lambda repo: repo.drop_replica())
        self._closing.set()
        if self._listener is not None:
            await asyncio.to_thread(self._listener.join)
            self._listener = None
        if self._writer is not None:
            self._queue.put(None)
            await asyncio.to_thread(self._writer.join)
            self._writer = None
        self._readers.shutdown(wait=True)
        for conn in self._reader_conns:
            conn.close()
        self._reader_conns.clear()
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _commit_error(exc: BaseException) -> HttpError:
    if isinstance(exc, HttpError):
        return exc
    if isinstance(exc, pg_errors.LockNotAvailable):
        return ServiceUnavailable(
            "the store is busy: another gateway held a lock this write needs for too long; retry later",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    if isinstance(exc, _Lost | psycopg.OperationalError):
        return ServiceUnavailable(
            "the store's server is unreachable; nothing was written, retry later",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    return InternalError("the store could not commit the write")
