"""The SQLite backend (embedded default): WAL, one writer thread with group commit, readers on their own connections.

A write is acknowledged only after the transaction holding it committed; each operation runs in a savepoint, so a
rejected one changes nothing while the rest of its batch commits. `synchronous=NORMAL` survives a crash of the
process; `FULL` also survives power loss, at a cost. The schema is versioned and migrated at start.
"""

from __future__ import annotations

import asyncio
import queue
import sqlite3
import sys
import threading
import time
import zlib
from array import array
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, TypeVar

import orjson
import structlog

from agl_lite.errors import ConfigError, HttpError, InsufficientStorage, InternalError, ServiceUnavailable
from agl_lite.store import codec
from agl_lite.store.base import LLM_CALL_KIND, RolloutFilter, Store, within_bytes
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
    # v2: a captured call is one row, its token ids included (one INSERT and two b-trees per call where v1 had four
    # and five); its prompt refers to an earlier sequence by ref (`_SLOTS`). `_migrate_v2` moves v1's calls.
    """
    CREATE TABLE calls_v2 (
        seq INTEGER PRIMARY KEY, id TEXT NOT NULL, rollout_id TEXT, attempt_id TEXT, order_key INTEGER NOT NULL,
        prompt_parent INTEGER, prompt_shared INTEGER NOT NULL, prompt_tail BLOB, choice_meta BLOB NOT NULL,
        choice_ids BLOB NOT NULL, logprobs BLOB, body BLOB NOT NULL
    );
    """,
    # v3: each call's tokens (usage, else the ids received) in a column, so that a rollout's total is one indexed
    # sum, not a decode of every call it made (`_migrate_v3` fills it for the calls already there).
    """
    ALTER TABLE calls ADD COLUMN tokens INTEGER NOT NULL DEFAULT 0;
    """,
    # v4: a captured call's `llm_call` event is kept in the call's own row (its seq, its JSON), not as an `events`
    # row of its own: one insert per call, and the seq's index entry is small where the event row held the JSON
    # (a commit writes fewer pages). `events()` reads both tables merged by seq, so the events of earlier versions
    # (rows in `events`) and later ones read alike: nothing to move.
    """
    ALTER TABLE calls ADD COLUMN event_seq INTEGER;
    ALTER TABLE calls ADD COLUMN event BLOB;
    CREATE INDEX calls_events ON calls (rollout_id, event_seq) WHERE event_seq IS NOT NULL;
    """,
]
SCHEMA_VERSION = len(MIGRATIONS)

_SLOTS = 1024
"""A token sequence is referred to as `ref = call seq * _SLOTS + slot`: slot 0 is the call's prompt, slot c + 1 the
prompt followed by choice c's completion (choices past `_SLOTS - 2` are stored, but no later prompt refers to them)."""
_NO_LOGPROBS = 0xFFFFFFFF

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


def _seq_row(ref: int, row: tuple[Any, ...]) -> SeqRow:
    """Sequence `ref` as `parent[:parent_len] + tail`, from its call's row (prompt_parent, prompt_shared,
    prompt_tail, choice_meta, choice_ids)."""
    parent, shared, tail, meta_blob, ids_blob = row
    seq, slot = divmod(ref, _SLOTS)
    if slot == 0:
        return SeqRow(parent, shared, unpack(tail or b""))
    meta = unpack(meta_blob)
    at = sum(meta[k + 1] for k in range(0, 3 * (slot - 1), 3))
    ids = unpack(ids_blob)[at : at + meta[3 * (slot - 1) + 1]]
    return SeqRow(seq * _SLOTS, sys.maxsize, ids)  # the whole prompt, then the completion


def _migrate_v2(conn: sqlite3.Connection) -> None:
    """Move v1's calls (`calls`, `call_choices`, `token_seqs`) into v2's one row per call, prefix sharing redone."""

    def load_v1(seq_id: int) -> SeqRow:
        parent, parent_len, tail = conn.execute(
            "SELECT parent, parent_len, tail FROM token_seqs WHERE id = ?", (seq_id,)
        ).fetchone()
        return SeqRow(parent, parent_len, unpack(tail))

    index = PrefixIndex()
    repo = SQLiteRepo(conn, index, "calls_v2")
    memo: dict[int, array[int]] = {}
    rows = conn.execute("SELECT id, prompt_seq, body FROM calls ORDER BY rowid").fetchall()
    for call_id, prompt_seq, body in rows:
        if len(memo) > 10_000:
            memo.clear()
        prompt = resolve(prompt_seq, load_v1, memo) if prompt_seq is not None else None
        ids, lps = [], []
        for seq, logprobs in conn.execute(
            "SELECT seq, logprobs FROM call_choices WHERE call_id = ? ORDER BY idx", (call_id,)
        ).fetchall():
            full = resolve(seq, load_v1, memo) if seq is not None else array("I")
            ids.append(array("I", full[len(prompt) :]) if prompt is not None and seq is not None else full)
            lp = None
            if logprobs is not None:
                lp = array("f")
                lp.frombytes(logprobs)
            lps.append(lp)
        repo.add_call(codec.call_from_json(_load(body), prompt, ids, lps))
        for scope, ref, seq_ids in repo.end_op(True):
            index.add(scope, ref, seq_ids)
    for statement in (
        "DROP TABLE call_choices",
        "DROP TABLE calls",
        "DROP TABLE token_seqs",
        "ALTER TABLE calls_v2 RENAME TO calls",
        "CREATE INDEX calls_rollout ON calls (rollout_id, order_key)",
    ):
        conn.execute(statement)


_CALL_COLUMNS = (
    "id, rollout_id, attempt_id, order_key, prompt_parent, prompt_shared, prompt_tail, choice_meta, choice_ids,"
    " logprobs, body"
)
_INSERT_CALL = f"INSERT INTO calls ({_CALL_COLUMNS}, tokens, event_seq, event) VALUES ({', '.join('?' * 14)})"
_INSERT_CALL_V2 = f"INSERT INTO calls_v2 ({_CALL_COLUMNS}) VALUES ({', '.join('?' * 11)})"


def _migrate_v3(conn: sqlite3.Connection) -> None:
    """Fill the new `tokens` column from each stored call (once; a page at a time)."""
    repo = SQLiteRepo(conn)
    for (rollout_id,) in conn.execute("SELECT DISTINCT rollout_id FROM calls").fetchall():
        after = -1
        while page := repo.calls(rollout_id, None, after, 500):
            conn.executemany(
                "UPDATE calls SET tokens = ? WHERE id = ?", [(sum(c.tokens()), c.id) for c in page]
            )
            after = page[-1].order_key


class SQLiteRepo:
    """Row access on one connection. The writer's instance also maintains the prefix index."""

    def __init__(
        self, conn: sqlite3.Connection, index: PrefixIndex | None = None, calls_table: str = "calls"
    ) -> None:
        self.conn = conn
        self.index = index
        self.calls_table = calls_table
        self._latest_columns = calls_table == "calls"  # (v2's migration table predates tokens and events)
        writer = index is not None and calls_table == "calls"
        self._seqs: dict[str, int] | None = {} if writer else None
        """The writer's last event seq per rollout (its own writes are the only ones: one process owns the store);
        a MAX() per `llm_call` event otherwise."""
        self._states: dict[str, RolloutStatus] | None = {} if writer else None
        """Likewise each rollout's status, in commit order (what decides whether a call is late)."""
        self._pending: list[tuple[str, int, array[int]]] = []  # index entries of the running operation

    # --- operation boundaries (writer only) ----------------------------------------------------------------------

    def end_op(self, ok: bool) -> list[tuple[str, int, array[int]]]:
        pending, self._pending = self._pending, []
        if not ok:  # what the undone writes cached is undone with them
            if self._seqs:
                self._seqs.clear()
            if self._states:
                self._states.clear()
        return pending if ok else []

    # --- rollouts ------------------------------------------------------------------------------------------------

    def get_rollout(self, rollout_id: str) -> Rollout | None:
        row = self.conn.execute("SELECT body FROM rollouts WHERE id = ?", (rollout_id,)).fetchone()
        return codec.rollout_from_json(_load(row[0])) if row else None

    def rollout_state(self, rollout_id: str) -> RolloutStatus | None:
        states = self._states
        if states is not None and (known := states.get(rollout_id)) is not None:
            return known
        row = self.conn.execute("SELECT status FROM rollouts WHERE id = ?", (rollout_id,)).fetchone()
        status = RolloutStatus(row[0]) if row else None
        if states is not None and status is not None:
            states[rollout_id] = status
        return status

    def put_rollout(self, rollout: Rollout, *, new: bool) -> None:
        states = self._states
        if states is not None:
            if len(states) >= 100_000:
                states.clear()  # a cache: the table stays the truth
            states[rollout.id] = rollout.status
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
        seqs = self._seqs
        if seqs is not None and (known := seqs.get(rollout_id)) is not None:
            return known
        row = self.conn.execute(
            "SELECT MAX(seq) FROM (SELECT MAX(seq) AS seq FROM events WHERE rollout_id = ? UNION ALL"
            " SELECT MAX(event_seq) FROM calls WHERE rollout_id = ? AND event_seq IS NOT NULL)",
            (rollout_id, rollout_id),
        ).fetchone()
        return int(row[0] or 0)

    def add_event(self, event: Event) -> int:
        body = _dump(event.to_json())
        self.conn.execute(
            "INSERT INTO events (rollout_id, seq, kind, body) VALUES (?, ?, ?, ?)",
            (event.rollout_id, event.seq, event.kind, body),
        )
        self._took_seq(event)
        return len(body)

    def _took_seq(self, event: Event) -> None:
        seqs = self._seqs
        if seqs is not None:
            if len(seqs) >= 100_000:
                seqs.clear()  # a cache: the tables stay the truth
            seqs[event.rollout_id] = event.seq

    def events(
        self, rollout_id: str, kind: str | None, after_seq: int, limit: int, max_bytes: int | None = None
    ) -> list[Event]:
        sql = "SELECT seq, body FROM events WHERE rollout_id = ? AND seq > ?"
        args: list[Any] = [rollout_id, after_seq]
        if kind is not None:
            sql += " AND kind = ?"
            args.append(kind)
        if kind in (None, LLM_CALL_KIND):
            # Captured calls keep their events in their own rows (v4); the admin may post `llm_call` events too.
            sql += " UNION ALL SELECT event_seq, event FROM calls WHERE rollout_id = ? AND event_seq > ?"
            args += (rollout_id, after_seq)
        rows = self.conn.execute(sql + " ORDER BY 1 LIMIT ?", (*args, limit))
        page = within_bytes(rows, max_bytes, lambda row: len(row[1]))
        return [codec.event_from_json(_load(b)) for _, b in page]

    # --- calls and token ids -------------------------------------------------------------------------------------

    def add_call(self, call: LLMCall, event: Event | None = None) -> int:
        """One INSERT, the call's event in the same row. The prompt is stored as `parent[:shared] + tail`, the
        parent being the earlier sequence of the same attempt (a prompt, or a prompt and a completion) that shares
        the longest prefix with it."""
        scope = f"{call.rollout_id}/{call.attempt_id}" if call.rollout_id is not None else None
        prompt = call.prompt_token_ids
        parent: int | None = None
        shared = 0
        tail: bytes | None = None
        if prompt is not None:
            if scope is not None and self.index is not None:
                best = self.index.best_parent(scope, prompt)
                if best is not None:
                    parent, shared = best
            tail = pack(prompt[shared:] if shared else prompt)
        meta = array("I")
        ids = array("I")
        lps: array[float] | None = None
        for choice in call.choices:
            meta.append(choice.index)
            meta.append(len(choice.token_ids))
            ids.extend(choice.token_ids)
            if choice.logprobs is None:
                meta.append(_NO_LOGPROBS)
            else:
                meta.append(len(choice.logprobs))
                if lps is None:
                    lps = array("f")
                lps.extend(choice.logprobs)
        packed_meta, packed_ids = pack(meta), pack(ids)
        lps_bytes = lps.tobytes() if lps is not None else None
        body = _dump(codec.call_to_json(call))
        event_body = _dump(event.to_json()) if event is not None else None
        cur = self.conn.execute(
            _INSERT_CALL if self._latest_columns else _INSERT_CALL_V2,
            (
                call.id,
                call.rollout_id,
                call.attempt_id,
                call.order_key,
                parent,
                shared,
                tail,
                packed_meta,
                packed_ids,
                lps_bytes,
                body,
                *(
                    (sum(call.tokens()), event.seq if event else None, event_body)
                    if self._latest_columns
                    else ()
                ),
            ),
        )
        if event is not None:
            self._took_seq(event)
        if scope is not None and prompt is not None:
            base = int(cur.lastrowid or 0) * _SLOTS
            pending = self._pending
            pending.append((scope, base, prompt))
            for slot, choice in enumerate(call.choices[: _SLOTS - 1], 1):
                full = array("I", prompt)  # a later prompt of this attempt may extend prompt + completion
                full.extend(choice.token_ids)
                pending.append((scope, base + slot, full))
        return (
            len(body)
            + len(tail or b"")
            + len(packed_meta)
            + len(packed_ids)
            + len(lps_bytes or b"")
            + len(event_body or b"")
        )

    def rollout_bytes(self, rollout_id: str) -> int:
        """What `add_event` and `add_call` said they wrote for the rollout, from the rows."""
        events = self.conn.execute(
            "SELECT COALESCE(SUM(LENGTH(body)), 0) FROM events WHERE rollout_id = ?", (rollout_id,)
        ).fetchone()[0]
        calls = self.conn.execute(
            "SELECT COALESCE(SUM(LENGTH(body) + COALESCE(LENGTH(prompt_tail), 0) + LENGTH(choice_meta)"
            " + LENGTH(choice_ids) + COALESCE(LENGTH(logprobs), 0)"
            + (" + COALESCE(LENGTH(event), 0)" if self._latest_columns else "")
            + "), 0) FROM "
            + self.calls_table
            + " WHERE rollout_id = ?",
            (rollout_id,),
        ).fetchone()[0]
        return int(events) + int(calls)

    def rollout_tokens(self, rollout_id: str) -> int:
        row = self.conn.execute(
            "SELECT COALESCE(SUM(tokens), 0) FROM " + self.calls_table + " WHERE rollout_id = ?",
            (rollout_id,),
        ).fetchone()
        return int(row[0])

    def _load_seq(self, ref: int) -> SeqRow:
        """The stored form of a sequence: its parent, the length shared with it, and its own tail."""
        row = self.conn.execute(
            "SELECT prompt_parent, prompt_shared, prompt_tail, choice_meta, choice_ids FROM calls WHERE seq = ?",
            (ref // _SLOTS,),
        ).fetchone()
        return _seq_row(ref, row)

    def calls(
        self,
        rollout_id: str | None,
        attempt_id: str | None,
        after_order_key: int,
        limit: int,
        max_bytes: int | None = None,
    ) -> list[LLMCall]:
        sql = (
            "SELECT seq, prompt_parent, prompt_shared, prompt_tail, choice_meta, choice_ids, logprobs, body"
            " FROM calls WHERE rollout_id IS ? AND order_key > ?"
        )
        args: list[Any] = [rollout_id, after_order_key]
        if attempt_id is not None:
            sql += " AND attempt_id = ?"
            args.append(attempt_id)
        cursor = self.conn.execute(sql + " ORDER BY order_key LIMIT ?", (*args, limit))
        rows = within_bytes(cursor, max_bytes, _call_row_bytes)
        memo: dict[int, array[int]] = {}
        fetched = {row[0]: row[1:6] for row in rows}  # a prompt's parent is often an earlier row of this page

        def load(ref: int) -> SeqRow:
            row = fetched.get(ref // _SLOTS)
            return _seq_row(ref, row) if row is not None else self._load_seq(ref)

        out = []
        for seq, parent, _shared, tail, meta_blob, ids_blob, lps_blob, body in rows:
            prompt: array[int] | None = None
            if tail is not None:
                prompt = resolve(seq * _SLOTS, load, memo) if parent is not None else unpack(tail)
            meta = unpack(meta_blob)
            all_ids = unpack(ids_blob)
            all_lps = array("f")
            if lps_blob is not None:
                all_lps.frombytes(lps_blob)
            ids: list[array[int]] = []
            lps: list[array[float] | None] = []
            at = lp_at = 0
            for k in range(0, len(meta), 3):
                n, n_lp = meta[k + 1], meta[k + 2]
                ids.append(all_ids[at : at + n])
                at += n
                if n_lp == _NO_LOGPROBS:
                    lps.append(None)
                else:
                    lps.append(all_lps[lp_at : lp_at + n_lp])
                    lp_at += n_lp
            out.append(codec.call_from_json(_load(body), prompt, ids, lps))
        return out

    def token_bytes(self) -> int:
        """Bytes of packed token ids stored (for the storage test and the docs)."""
        row = self.conn.execute(
            "SELECT COALESCE(SUM(LENGTH(prompt_tail)), 0) + COALESCE(SUM(LENGTH(choice_ids)), 0) FROM calls"
        ).fetchone()
        return int(row[0])

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

    def delete_model(self, name: str) -> ModelRecord | None:
        row = self.conn.execute("DELETE FROM models WHERE name = ? RETURNING body", (name,)).fetchone()
        return codec.model_from_json(_load(row[0])) if row else None

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
_CHECKPOINT = "checkpoint"
_Job = list[_Item] | str | None

CHECKPOINT_EVERY = 256
"""Commits of the writer on the loop between two WAL checkpoints (about what SQLite's own 1000-page default gives)."""
TRUNCATE_WAIT_S = 0.5
"""How long a WAL truncation waits for reads in flight (writes queue meanwhile) before it gives up until the next."""
WAL_LIMIT = 64 * 1024 * 1024
"""WAL bytes past which a checkpoint waits for the readers and truncates it. A passive checkpoint never waits, and
with reads always in flight the WAL never restarts: it grew to 2.1 GB beside a 0.5 GB database under load."""
LOCK_WAIT_S = 10.0
"""How long the writer thread waits for a database locked by another process before it fails the writes (503)."""


class _Locked(Exception):
    """Another connection holds the database's write lock."""


RETRY_AFTER_S = 5
"""What a write refused for want of disk (507) or of a writable database (503) tells its client to wait."""

_UNWRITABLE = frozenset(
    {sqlite3.SQLITE_READONLY, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PROTOCOL}
)


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
        self._thread_done = 0  # batches the writer thread finished (the thread's)
        self._checkpoints_asked = 0  # (the loop's)
        self._checkpoints_done = 0  # (the thread's)
        self._since_checkpoint = 0
        # One transaction at a time on the writer's connection (the loop's or the thread's); guards `ops`, `commits`.
        self._lock = threading.Lock()
        self._writer: threading.Thread | None = None
        self._local = threading.local()
        self._readers = ThreadPoolExecutor(max_workers=readers, thread_name_prefix="agl-sqlite-read")
        self._reader_conns: list[sqlite3.Connection] = []  # closed with the store, so that its WAL goes too
        self._read_gate = threading.Lock()
        self._notes: dict[asyncio.Future[Any], Callable[[Any], object]] = {}  # (`_submit`, `_settle_all`)
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
            self._conn = _connect(self.path, self.synchronous)
            self._conn.execute("PRAGMA busy_timeout = 0")  # a locked database goes to the thread (`_begin`)
            version = int(self._conn.execute("PRAGMA user_version").fetchone()[0])
        except sqlite3.Error as exc:
            raise ConfigError(f"cannot open the store {self.path}: {exc}") from exc
        if version > SCHEMA_VERSION:
            raise ConfigError(
                f"the store {self.path} has schema version {version}, newer than this agl-lite ({SCHEMA_VERSION})"
            )
        for target in range(version + 1, SCHEMA_VERSION + 1):
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                for statement in MIGRATIONS[target - 1].split(";"):
                    if statement.strip():
                        conn.execute(statement)
                if target == 2:
                    _migrate_v2(conn)
                if target == 3:
                    _migrate_v3(conn)
                conn.execute(f"PRAGMA user_version = {target}")
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            log.info("store schema migrated", path=self.path, version=target)
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
        if note is not None:
            self._notes[fut] = note
        self._submitted += 1
        return fut

    def _flush(self) -> None:
        """Commit this loop iteration's writes: here, or on the writer thread when it must or is busy (order kept)."""
        batch, self._pending = self._pending, []
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
            if (
                self._since_checkpoint >= CHECKPOINT_EVERY
                and self._checkpoints_asked == self._checkpoints_done
            ):
                self._since_checkpoint = 0
                self._checkpoints_asked += 1
                self._queue.put_nowait(_CHECKPOINT)

    def _hand_over(self, batch: list[_Item]) -> None:
        self._handed += 1
        self._queue.put_nowait(batch)

    async def _read(self, fn: Callable[[SQLiteRepo], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._readers, self._run_read, fn)

    def _run_read(self, fn: Callable[[SQLiteRepo], T]) -> T:
        repo = getattr(self._local, "repo", None)
        if repo is None:
            repo = self._local.repo = SQLiteRepo(_connect(self.path, self.synchronous))
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
        thread_commits = 0
        while not stop:
            job = self._queue.get()
            if job is None:
                break
            if isinstance(job, str):
                if checkpointer is None:
                    checkpointer = _connect(self.path, self.synchronous)
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
                if thread_commits % CHECKPOINT_EVERY == 0 and _wal_bytes(self.path) > WAL_LIMIT:
                    self._truncate_wal(self._conn)
            self._thread_done += handed
        if checkpointer is not None:
            checkpointer.close()

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
                _settle_all(settled)
            else:
                loop.call_soon_threadsafe(_settle_all, settled)
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
        clean exit leaves the database file alone, and the next start has no log to replay)."""
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
        repo = SQLiteRepo(_connect(self.path, self.synchronous))
        try:
            return repo.token_bytes()
        finally:
            repo.conn.close()


def _call_row_bytes(row: tuple[Any, ...]) -> int:
    return sum(len(v) for v in row[3:] if isinstance(v, bytes))


def _wal_bytes(path: str) -> int:
    try:
        return Path(path + "-wal").stat().st_size
    except OSError:
        return 0


_Settled = tuple[asyncio.Future[Any], Any, BaseException | None, Callable[[Any], object] | None]


def _settle_all(settled: list[_Settled]) -> None:
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
