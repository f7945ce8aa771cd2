"""The SQLite backend (embedded default): WAL, one writer thread with group commit, readers on their own connections.

A write is acknowledged only after the transaction holding it committed; each operation runs in a savepoint, so a
rejected one changes nothing while the rest of its batch commits. `synchronous=NORMAL` survives a crash of the
process; `FULL` also survives power loss, at a cost. The schema is versioned and migrated at start.
"""

from __future__ import annotations

import asyncio
import queue
import sqlite3
import threading
import zlib
from array import array
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, TypeVar

import orjson
import structlog

from agl_lite.errors import ConfigError, HttpError, InternalError, ServiceUnavailable
from agl_lite.store import codec
from agl_lite.store.base import RolloutFilter, Store
from agl_lite.store.records import (
    Attempt,
    Event,
    LLMCall,
    ModelRecord,
    Resource,
    Rollout,
    RolloutStatus,
)
from agl_lite.store.tokens import PrefixIndex, SeqRow, pack, resolve, unpack

__all__ = ["SCHEMA_VERSION", "SQLiteRepo", "SQLiteStore"]

log = structlog.get_logger("agl_lite.store.sqlite")

T = TypeVar("T")

MIGRATIONS: list[str] = [
    """
    CREATE TABLE rollouts (
        id TEXT PRIMARY KEY, enqueue_seq INTEGER NOT NULL UNIQUE, status TEXT NOT NULL, mode TEXT NOT NULL,
        group_id TEXT, completion_seq INTEGER UNIQUE, body BLOB NOT NULL
    );
    CREATE INDEX rollouts_status ON rollouts (status, enqueue_seq);
    CREATE INDEX rollouts_group ON rollouts (group_id, enqueue_seq);
    CREATE TABLE attempts (
        rollout_id TEXT NOT NULL, id TEXT NOT NULL, seq INTEGER NOT NULL, body BLOB NOT NULL,
        PRIMARY KEY (rollout_id, id)
    ) WITHOUT ROWID;
    CREATE TABLE events (
        rollout_id TEXT NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL, body BLOB NOT NULL,
        PRIMARY KEY (rollout_id, seq)
    ) WITHOUT ROWID;
    CREATE TABLE token_seqs (
        id INTEGER PRIMARY KEY, parent INTEGER REFERENCES token_seqs (id), parent_len INTEGER NOT NULL,
        tail BLOB NOT NULL
    );
    CREATE TABLE calls (
        id TEXT PRIMARY KEY, rollout_id TEXT, attempt_id TEXT, order_key INTEGER NOT NULL,
        prompt_seq INTEGER REFERENCES token_seqs (id), body BLOB NOT NULL
    );
    CREATE INDEX calls_rollout ON calls (rollout_id, order_key);
    CREATE TABLE call_choices (
        call_id TEXT NOT NULL, idx INTEGER NOT NULL, seq INTEGER REFERENCES token_seqs (id), logprobs BLOB,
        PRIMARY KEY (call_id, idx)
    ) WITHOUT ROWID;
    CREATE TABLE resources (
        name TEXT NOT NULL, version INTEGER NOT NULL, body BLOB NOT NULL, PRIMARY KEY (name, version)
    ) WITHOUT ROWID;
    CREATE TABLE models (name TEXT PRIMARY KEY, body BLOB NOT NULL);
    """,
]
SCHEMA_VERSION = len(MIGRATIONS)

_COMPRESS_OVER = (
    8192  # bytes; smaller bodies are stored as plain JSON (compressing them costs more than it saves)
)


def _dump(obj: Any) -> bytes:
    raw = orjson.dumps(obj)
    return b"z" + zlib.compress(raw, 1) if len(raw) > _COMPRESS_OVER else raw


def _load(blob: bytes) -> Any:
    return orjson.loads(zlib.decompress(blob[1:]) if blob[:1] == b"z" else blob)


def _rollout_row(r: Rollout) -> tuple[Any, ...]:
    return (r.id, r.enqueue_seq, r.status.value, r.mode, r.group_id, r.completion_seq, _dump(r.to_json()))


class SQLiteRepo:
    """Row access on one connection. The writer's instance also maintains the prefix index."""

    def __init__(self, conn: sqlite3.Connection, index: PrefixIndex | None = None) -> None:
        self.conn = conn
        self.index = index
        self._pending: list[tuple[str, int, array[int]]] = []  # index entries of the running operation

    # --- operation boundaries (writer only) ----------------------------------------------------------------------

    def end_op(self, ok: bool) -> list[tuple[str, int, array[int]]]:
        pending, self._pending = self._pending, []
        return pending if ok else []

    # --- rollouts ------------------------------------------------------------------------------------------------

    def get_rollout(self, rollout_id: str) -> Rollout | None:
        row = self.conn.execute("SELECT body FROM rollouts WHERE id = ?", (rollout_id,)).fetchone()
        return codec.rollout_from_json(_load(row[0])) if row else None

    def put_rollout(self, rollout: Rollout, *, new: bool) -> None:
        self.conn.execute(
            "INSERT OR REPLACE INTO rollouts (id, enqueue_seq, status, mode, group_id, completion_seq, body)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            _rollout_row(rollout),
        )

    def list_rollouts(self, flt: RolloutFilter) -> list[Rollout]:
        where, args = ["enqueue_seq > ?"], [flt.after]
        if flt.status is not None:
            where.append("status = ?")
            args.append(flt.status.value)  # type: ignore[arg-type]
        if flt.mode is not None:
            where.append("mode = ?")
            args.append(flt.mode)  # type: ignore[arg-type]
        if flt.group_id is not None:
            where.append("group_id = ?")
            args.append(flt.group_id)  # type: ignore[arg-type]
        sql = f"SELECT body FROM rollouts WHERE {' AND '.join(where)} ORDER BY enqueue_seq LIMIT ?"
        return [codec.rollout_from_json(_load(b)) for (b,) in self.conn.execute(sql, (*args, flt.limit))]

    def queued(self, limit: int) -> list[Rollout]:
        return self.list_rollouts(RolloutFilter(status=RolloutStatus.QUEUING, limit=limit))

    def running(self) -> list[Rollout]:
        rows = self.conn.execute("SELECT body FROM rollouts WHERE status = 'running' ORDER BY enqueue_seq")
        return [codec.rollout_from_json(_load(b)) for (b,) in rows]

    def last_enqueue_seq(self) -> int:
        return int(self.conn.execute("SELECT COALESCE(MAX(enqueue_seq), 0) FROM rollouts").fetchone()[0])

    def last_completion_seq(self) -> int:
        return int(self.conn.execute("SELECT COALESCE(MAX(completion_seq), 0) FROM rollouts").fetchone()[0])

    def completed_after(self, after: int, limit: int) -> list[Rollout]:
        rows = self.conn.execute(
            "SELECT body FROM rollouts WHERE completion_seq > ? ORDER BY completion_seq LIMIT ?",
            (after, limit),
        )
        return [codec.rollout_from_json(_load(b)) for (b,) in rows]

    # --- attempts and events -------------------------------------------------------------------------------------

    def get_attempt(self, rollout_id: str, attempt_id: str) -> Attempt | None:
        row = self.conn.execute(
            "SELECT body FROM attempts WHERE rollout_id = ? AND id = ?", (rollout_id, attempt_id)
        ).fetchone()
        return codec.attempt_from_json(_load(row[0])) if row else None

    def attempts(self, rollout_id: str) -> list[Attempt]:
        rows = self.conn.execute("SELECT body FROM attempts WHERE rollout_id = ? ORDER BY seq", (rollout_id,))
        return [codec.attempt_from_json(_load(b)) for (b,) in rows]

    def put_attempt(self, attempt: Attempt, *, new: bool) -> None:
        self.conn.execute(
            "INSERT OR REPLACE INTO attempts (rollout_id, id, seq, body) VALUES (?, ?, ?, ?)",
            (attempt.rollout_id, attempt.id, attempt.seq, _dump(attempt.to_json())),
        )

    def last_event_seq(self, rollout_id: str) -> int:
        row = self.conn.execute("SELECT MAX(seq) FROM events WHERE rollout_id = ?", (rollout_id,)).fetchone()
        return int(row[0] or 0)

    def add_event(self, event: Event) -> None:
        self.conn.execute(
            "INSERT INTO events (rollout_id, seq, kind, body) VALUES (?, ?, ?, ?)",
            (event.rollout_id, event.seq, event.kind, _dump(event.to_json())),
        )

    def events(self, rollout_id: str, kind: str | None, after_seq: int, limit: int) -> list[Event]:
        sql = "SELECT body FROM events WHERE rollout_id = ? AND seq > ?"
        args: list[Any] = [rollout_id, after_seq]
        if kind is not None:
            sql += " AND kind = ?"
            args.append(kind)
        rows = self.conn.execute(sql + " ORDER BY seq LIMIT ?", (*args, limit))
        return [codec.event_from_json(_load(b)) for (b,) in rows]

    # --- calls and token ids -------------------------------------------------------------------------------------

    def _store_seq(self, scope: str | None, ids: array[int], parent: tuple[int, int] | None) -> int:
        """Insert a sequence as `parent[:shared] + tail`; `parent` defaults to the index's best candidate."""
        if parent is None and scope is not None and self.index is not None:
            parent = self.index.best_parent(scope, ids)
        parent_id, shared = parent if parent is not None else (None, 0)
        cur = self.conn.execute(
            "INSERT INTO token_seqs (parent, parent_len, tail) VALUES (?, ?, ?)",
            (parent_id, shared, pack(ids[shared:] if shared else ids)),
        )
        seq_id = int(cur.lastrowid or 0)
        if scope is not None:
            self._pending.append((scope, seq_id, ids))
        return seq_id

    def add_call(self, call: LLMCall) -> None:
        scope = f"{call.rollout_id}/{call.attempt_id}" if call.rollout_id is not None else None
        prompt = call.prompt_token_ids
        prompt_seq = self._store_seq(scope, prompt, None) if prompt is not None else None
        self.conn.execute(
            "INSERT INTO calls (id, rollout_id, attempt_id, order_key, prompt_seq, body) VALUES (?, ?, ?, ?, ?, ?)",
            (
                call.id,
                call.rollout_id,
                call.attempt_id,
                call.order_key,
                prompt_seq,
                _dump(codec.call_to_json(call)),
            ),
        )
        for choice in call.choices:
            seq: int | None = None
            if prompt_seq is not None and prompt is not None and scope is None:
                # unattributed: nothing will share this sequence, so only its tail is built
                cur = self.conn.execute(
                    "INSERT INTO token_seqs (parent, parent_len, tail) VALUES (?, ?, ?)",
                    (prompt_seq, len(prompt), pack(choice.token_ids)),
                )
                seq = int(cur.lastrowid or 0)
            elif prompt_seq is not None and prompt is not None:
                full = array("I", prompt)  # the whole sequence: a later prompt of this attempt may extend it
                full.extend(choice.token_ids)
                seq = self._store_seq(scope, full, (prompt_seq, len(prompt)))
            elif choice.token_ids:
                seq = self._store_seq(None, choice.token_ids, None)
            lps = choice.logprobs.tobytes() if choice.logprobs is not None else None
            self.conn.execute(
                "INSERT INTO call_choices (call_id, idx, seq, logprobs) VALUES (?, ?, ?, ?)",
                (call.id, choice.index, seq, lps),
            )

    def _load_seq(self, seq_id: int) -> SeqRow:
        parent, parent_len, tail = self.conn.execute(
            "SELECT parent, parent_len, tail FROM token_seqs WHERE id = ?", (seq_id,)
        ).fetchone()
        return SeqRow(parent, parent_len, unpack(tail))

    def calls(
        self, rollout_id: str | None, attempt_id: str | None, after_order_key: int, limit: int
    ) -> list[LLMCall]:
        sql = "SELECT id, prompt_seq, body FROM calls WHERE rollout_id IS ? AND order_key > ?"
        args: list[Any] = [rollout_id, after_order_key]
        if attempt_id is not None:
            sql += " AND attempt_id = ?"
            args.append(attempt_id)
        rows = self.conn.execute(sql + " ORDER BY order_key LIMIT ?", (*args, limit)).fetchall()
        memo: dict[int, array[int]] = {}
        out = []
        for call_id, prompt_seq, body in rows:
            prompt = resolve(prompt_seq, self._load_seq, memo) if prompt_seq is not None else None
            ids, lps = [], []
            for seq, logprobs in self.conn.execute(
                "SELECT seq, logprobs FROM call_choices WHERE call_id = ? ORDER BY idx", (call_id,)
            ):
                full = resolve(seq, self._load_seq, memo) if seq is not None else array("I")
                ids.append(
                    array("I", full[len(prompt) :]) if prompt is not None and seq is not None else full
                )
                lp = None
                if logprobs is not None:
                    lp = array("f")
                    lp.frombytes(logprobs)
                lps.append(lp)
            out.append(codec.call_from_json(_load(body), prompt, ids, lps))
        return out

    def token_bytes(self) -> int:
        """Bytes of packed token ids stored (for the storage test and the docs)."""
        return int(self.conn.execute("SELECT COALESCE(SUM(LENGTH(tail)), 0) FROM token_seqs").fetchone()[0])

    # --- resources and models ------------------------------------------------------------------------------------

    def last_resource_version(self, name: str) -> int:
        row = self.conn.execute("SELECT MAX(version) FROM resources WHERE name = ?", (name,)).fetchone()
        return int(row[0] or 0)

    def put_resource(self, resource: Resource) -> None:
        self.conn.execute(
            "INSERT INTO resources (name, version, body) VALUES (?, ?, ?)",
            (resource.name, resource.version, _dump(resource.to_json())),
        )

    def get_resource(self, name: str, version: int | None) -> Resource | None:
        if version is None:
            row = self.conn.execute(
                "SELECT body FROM resources WHERE name = ? ORDER BY version DESC LIMIT 1", (name,)
            ).fetchone()
        else:
            row = self.conn.execute(
                "SELECT body FROM resources WHERE name = ? AND version = ?", (name, version)
            ).fetchone()
        return codec.resource_from_json(_load(row[0])) if row else None

    def latest_resources(self) -> list[Resource]:
        rows = self.conn.execute(
            "SELECT body FROM resources r WHERE version = (SELECT MAX(version) FROM resources WHERE name = r.name)"
            " ORDER BY name"
        )
        return [codec.resource_from_json(_load(b)) for (b,) in rows]

    def put_model(self, model: ModelRecord) -> None:
        self.conn.execute(
            "INSERT OR REPLACE INTO models (name, body) VALUES (?, ?)", (model.name, _dump(model.to_json()))
        )

    def models(self) -> list[ModelRecord]:
        rows = self.conn.execute("SELECT body FROM models ORDER BY name")
        return [codec.model_from_json(_load(b)) for (b,) in rows]


def _connect(path: str, synchronous: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    conn.execute("PRAGMA foreign_keys = OFF")
    conn.execute("PRAGMA busy_timeout = 10000")
    return conn


_Item = tuple[Callable[[SQLiteRepo], Any], asyncio.Future[Any], asyncio.AbstractEventLoop]


class SQLiteStore(Store):
    """`await SQLiteStore.open(path)`; writes go through one thread in batches of up to `batch` operations."""

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
        self._queue: queue.Queue[list[_Item] | None] = queue.Queue()
        self._queue_size = queue_size
        self._pending: list[_Item] = []
        self._submitted = 0  # writes handed over (the loop's count; `ops` is the writer's: no shared counter)
        self._writer: threading.Thread | None = None
        self._local = threading.local()
        self._readers = ThreadPoolExecutor(max_workers=readers, thread_name_prefix="agl-sqlite-read")
        self._index = PrefixIndex()
        self.commits = 0
        self.ops = 0

    @classmethod
    async def open(cls, path: str | Path, **kwargs: Any) -> SQLiteStore:
        store = cls(path, **kwargs)
        await asyncio.to_thread(store._prepare)
        store._writer = threading.Thread(target=store._write_loop, name="agl-sqlite-writer", daemon=True)
        store._writer.start()
        return store

    def _prepare(self) -> None:
        try:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            self._conn = _connect(self.path, self.synchronous)
            version = int(self._conn.execute("PRAGMA user_version").fetchone()[0])
        except sqlite3.Error as exc:
            raise ConfigError(f"cannot open the store {self.path}: {exc}") from exc
        if version > SCHEMA_VERSION:
            raise ConfigError(
                f"the store {self.path} has schema version {version}, newer than this agl-lite ({SCHEMA_VERSION})"
            )
        for target in range(version + 1, SCHEMA_VERSION + 1):
            self._conn.execute("BEGIN IMMEDIATE")
            self._conn.executescript(
                MIGRATIONS[target - 1].replace("\n    ", "\n") + f"\nPRAGMA user_version = {target};"
            )
            log.info("store schema migrated", path=self.path, version=target)

    @property
    def queue_depth(self) -> int:
        return self._submitted - self.ops

    async def _write(self, fn: Callable[[SQLiteRepo], T]) -> T:
        if self._writer is None:
            raise RuntimeError("SQLiteStore.open() was not awaited")
        if self._submitted - self.ops >= self._queue_size:
            raise ServiceUnavailable(
                "the store's write queue is full; retry later", headers={"Retry-After": "1"}
            )
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        pending = self._pending
        if not pending:
            loop.call_soon(self._flush)
        pending.append((fn, fut, loop))
        self._submitted += 1
        return await fut

    def _flush(self) -> None:
        """Hand this loop iteration's writes to the writer at once: one wake-up of its thread, not one per write."""
        batch, self._pending = self._pending, []
        if batch:
            self._queue.put_nowait(batch)

    async def _read(self, fn: Callable[[SQLiteRepo], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._readers, self._run_read, fn)

    def _run_read(self, fn: Callable[[SQLiteRepo], T]) -> T:
        repo = getattr(self._local, "repo", None)
        if repo is None:
            repo = self._local.repo = SQLiteRepo(_connect(self.path, self.synchronous))
        repo.conn.execute("BEGIN")
        try:
            return fn(repo)
        finally:
            repo.conn.execute("COMMIT")

    def _write_loop(self) -> None:
        repo = SQLiteRepo(self._conn, self._index)
        stop = False
        while not stop:
            item = self._queue.get()
            if item is None:
                return
            batch = item
            while len(batch) < self.batch:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                batch += nxt
            self._commit_batch(repo, batch)

    def _commit_batch(self, repo: SQLiteRepo, batch: list[_Item]) -> None:
        """Run a batch in one transaction. The store's rules raise an HttpError only before an operation's first
        write (they validate first), so a rejected operation leaves nothing to undo and needs no savepoint. Any
        other failure rolls the batch back and runs its operations again one transaction each, so only the
        failing one fails."""
        try:
            results, added = self._run_batch(repo, batch)
        except sqlite3.Error as exc:
            log.warning(
                "store batch failed; retrying its writes one by one", error=repr(exc), size=len(batch)
            )
            results, added = [], []
            for item in batch:
                try:
                    one, one_added = self._run_batch(repo, [item])
                except sqlite3.Error as exc_one:
                    log.error("store commit failed", error=repr(exc_one))
                    one = [(item[1], item[2], None, InternalError("the store could not commit the write"))]
                    one_added = []
                results += one
                added += one_added
        self.commits += 1
        self.ops += len(batch)
        for scope, seq_id, ids in added:
            self._index.add(scope, seq_id, ids)
        by_loop: dict[
            asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any, BaseException | None]]
        ] = {}
        for fut, loop, value, error in results:
            by_loop.setdefault(loop, []).append((fut, value, error))
        for loop, settled in by_loop.items():  # one hand-off per batch, not one per write
            loop.call_soon_threadsafe(_settle_all, settled)

    def _run_batch(
        self, repo: SQLiteRepo, batch: list[_Item]
    ) -> tuple[
        list[tuple[asyncio.Future[Any], asyncio.AbstractEventLoop, Any, BaseException | None]], list[Any]
    ]:
        results: list[tuple[asyncio.Future[Any], asyncio.AbstractEventLoop, Any, BaseException | None]] = []
        added: list[tuple[str, int, array[int]]] = []
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
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
        if self._writer is not None:
            self._flush()  # writes of this loop iteration not handed over yet go first
            self._queue.put(None)
            await asyncio.to_thread(self._writer.join)
            self._writer = None
            self._conn.close()
        self._readers.shutdown(wait=True)

    def token_bytes(self) -> int:
        repo = SQLiteRepo(_connect(self.path, self.synchronous))
        try:
            return repo.token_bytes()
        finally:
            repo.conn.close()


def _settle_all(settled: list[tuple[asyncio.Future[Any], Any, BaseException | None]]) -> None:
    for fut, value, error in settled:
        if fut.cancelled():
            continue
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(value)
