"""Row access to the SQLite store: the storage format of each record and the SQL that reads and writes it.

A captured call is one row: its JSON, its token ids packed (`store.packed_ids`), its prompt stored as the longest
prefix it shares with an earlier sequence of its attempt plus its own tail, and its `llm_call` event. `SQLiteRepo`
works on one connection and knows nothing of transactions: the store (`store.sqlite.store`) decides those.
"""

from __future__ import annotations

import sqlite3
import sys
import zlib
from array import array
from typing import Any

import orjson

from agl_lite.store import codec
from agl_lite.store.packed_ids import PrefixIndex, SeqRow, pack, resolve, unpack
from agl_lite.store.records import Attempt, Event, LLMCall, ModelRecord, Resource, Rollout, RolloutStatus
from agl_lite.store.rules import LLM_CALL_KIND, RolloutFilter, within_bytes

__all__ = ["NO_LOGPROBS", "SQLiteRepo", "connect", "dump_json", "load_json"]

_SLOTS = 1024
"""A token sequence is referred to as `ref = call seq * _SLOTS + slot`: slot 0 is the call's prompt, slot c + 1 the
prompt followed by choice c's completion (choices past `_SLOTS - 2` are stored, but no later prompt refers to them)."""
NO_LOGPROBS = 0xFFFFFFFF

_COMPRESS_OVER = (
    8192  # bytes; smaller bodies are stored as plain JSON (compressing them costs more than it saves)
)


def dump_json(obj: Any) -> bytes:
    raw = orjson.dumps(obj)
    return b"z" + zlib.compress(raw, 1) if len(raw) > _COMPRESS_OVER else raw


def load_json(blob: bytes) -> Any:
    return orjson.loads(zlib.decompress(blob[1:]) if blob[:1] == b"z" else blob)


def _rollout_row(r: Rollout) -> tuple[Any, ...]:
    return (
        r.id,
        r.enqueue_seq,
        r.status.value,
        r.mode,
        r.group_id,
        r.completion_seq,
        r.reward,
        r.created_at,
        dump_json(r.to_json()),
    )


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


_CALL_COLUMNS = (
    "id, rollout_id, attempt_id, order_key, prompt_parent, prompt_shared, prompt_tail, choice_meta, choice_ids,"
    " logprobs, body"
)
_INSERT_CALL = (
    f"INSERT INTO calls ({_CALL_COLUMNS}, tokens, event_seq, event, labels) VALUES ({', '.join('?' * 15)})"
)
_INSERT_CALL_V2 = f"INSERT INTO calls_v2 ({_CALL_COLUMNS}) VALUES ({', '.join('?' * 11)})"


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
        self._versions: set[tuple[str, str]] = set()
        """(rollout, model version) pairs already in `rollout_versions`: one insert per pair, not one per call."""
        self._pending: list[tuple[str, int, array[int]]] = []  # index entries of the running operation

    # --- operation boundaries (writer only) ----------------------------------------------------------------------

    def end_op(self, ok: bool) -> list[tuple[str, int, array[int]]]:
        pending, self._pending = self._pending, []
        if not ok:  # what the undone writes cached is undone with them
            if self._seqs:
                self._seqs.clear()
            if self._states:
                self._states.clear()
            self._versions.clear()
        return pending if ok else []

    # --- rollouts ------------------------------------------------------------------------------------------------

    def get_rollout(self, rollout_id: str) -> Rollout | None:
        row = self.conn.execute("SELECT body FROM rollouts WHERE id = ?", (rollout_id,)).fetchone()
        return codec.rollout_from_json(load_json(row[0])) if row else None

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
            "INSERT OR REPLACE INTO rollouts"
            " (id, enqueue_seq, status, mode, group_id, completion_seq, reward, created_at, body)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            _rollout_row(rollout),
        )

    def list_rollouts(self, flt: RolloutFilter) -> list[Rollout]:
        """One keyset page in enqueue order. Status, mode and group each have an index in enqueue order; a model
        version is looked up in `rollout_versions` (also in enqueue order). Reward and time alone are tested on the
        `rollouts_scan` index, whose entries hold both (no row is read that does not match); a time window first
        finds its bounds in enqueue order on `rollouts_created`, so that a recent window does not walk the whole
        history (creation times never decrease in enqueue order: `Store.enqueue` makes sure of it)."""
        # the page's key: the versions' when they drive the page
        key = "r.enqueue_seq" if flt.model_version is None else "v.enqueue_seq"
        after, last = flt.after, None
        if flt.created_after is not None:
            first = self._enqueued_at("created_at >= ? ORDER BY created_at, enqueue_seq", flt.created_after)
            if first is None:
                return []
            after = max(after, first - 1)
        if flt.created_before is not None:
            last = self._enqueued_at(
                "created_at < ? ORDER BY created_at DESC, enqueue_seq DESC", flt.created_before
            )
            if last is None:
                return []
        # (One term per bound: given two, SQLite searches the index from one and tests the other on each entry.)
        where: list[str] = [f"{key} > ?"]
        args: list[object] = [after]
        if last is not None:
            where.append(f"{key} <= ?")
            args.append(last)
        status = flt.status.value if flt.status is not None else None
        for column, text in (("status", status), ("mode", flt.mode), ("group_id", flt.group_id)):
            if text is not None:
                where.append(f"r.{column} = ?")
                args.append(text)
        # (The unary `+` keeps the planner off the reward and time indexes for these terms: the page is read in
        # enqueue order, and an index on reward or time would make it sort every match first.)
        for term, number in (
            ("+r.reward >= ?", flt.reward_min),
            ("+r.reward <= ?", flt.reward_max),
            ("+r.created_at >= ?", flt.created_after),
            ("+r.created_at < ?", flt.created_before),
        ):
            if number is not None:
                where.append(term)
                args.append(number)
        scan = (flt.reward_min, flt.reward_max, flt.created_after, flt.created_before) != (None,) * 4
        if flt.model_version is None and scan and (flt.status, flt.mode, flt.group_id) == (None,) * 3:
            # Its entries hold the reward and the time: a row is read only when it matches (10x fewer pages read
            # than through the enqueue index, measured at 200,000 rollouts: 2 against 27 ms for a page).
            source = "rollouts r INDEXED BY rollouts_scan"
        elif flt.model_version is None:
            source = "rollouts r"
        else:  # CROSS JOIN: SQLite keeps the tables in this order, the versions' index driving the page
            source = "rollout_versions v CROSS JOIN rollouts r ON r.enqueue_seq = v.enqueue_seq"
            where.append("v.model_version = ?")
            args.append(flt.model_version)
        sql = f"SELECT r.body FROM {source} WHERE {' AND '.join(where)} ORDER BY {key} LIMIT ?"
        return [codec.rollout_from_json(load_json(b)) for (b,) in self.conn.execute(sql, (*args, flt.limit))]

    def _enqueued_at(self, term: str, when: float) -> int | None:
        """The enqueue position of the first rollout by `term` (a time bound and its order), on `rollouts_created`."""
        row = self.conn.execute(f"SELECT enqueue_seq FROM rollouts WHERE {term} LIMIT 1", (when,)).fetchone()
        return int(row[0]) if row else None

    def queued(self, limit: int) -> list[Rollout]:
        return self.list_rollouts(RolloutFilter(status=RolloutStatus.QUEUING, limit=limit))

    def running(self) -> list[Rollout]:
        rows = self.conn.execute("SELECT body FROM rollouts WHERE status = 'running' ORDER BY enqueue_seq")
        return [codec.rollout_from_json(load_json(b)) for (b,) in rows]

    def last_created_at(self) -> float:
        row = self.conn.execute("SELECT MAX(created_at) FROM rollouts").fetchone()
        return float(row[0] or 0.0)

    def last_enqueue_seq(self) -> int:
        return int(self.conn.execute("SELECT COALESCE(MAX(enqueue_seq), 0) FROM rollouts").fetchone()[0])

    def last_completion_seq(self) -> int:
        return int(self.conn.execute("SELECT COALESCE(MAX(completion_seq), 0) FROM rollouts").fetchone()[0])

    def completed_after(self, after: int, limit: int) -> list[Rollout]:
        rows = self.conn.execute(
            "SELECT body FROM rollouts WHERE completion_seq > ? ORDER BY completion_seq LIMIT ?",
            (after, limit),
        )
        return [codec.rollout_from_json(load_json(b)) for (b,) in rows]

    # --- attempts and events -------------------------------------------------------------------------------------

    def get_attempt(self, rollout_id: str, attempt_id: str) -> Attempt | None:
        row = self.conn.execute(
            "SELECT body FROM attempts WHERE rollout_id = ? AND id = ?", (rollout_id, attempt_id)
        ).fetchone()
        return codec.attempt_from_json(load_json(row[0])) if row else None

    def attempts(self, rollout_id: str) -> list[Attempt]:
        rows = self.conn.execute("SELECT body FROM attempts WHERE rollout_id = ? ORDER BY seq", (rollout_id,))
        return [codec.attempt_from_json(load_json(b)) for (b,) in rows]

    def put_attempt(self, attempt: Attempt, *, new: bool) -> None:
        self.conn.execute(
            "INSERT OR REPLACE INTO attempts (rollout_id, id, seq, body) VALUES (?, ?, ?, ?)",
            (attempt.rollout_id, attempt.id, attempt.seq, dump_json(attempt.to_json())),
        )

    def last_event_seq(self, rollout_id: str) -> int:
        seqs = self._seqs
        if seqs is not None and (known := seqs.get(rollout_id)) is not None:
            return known
        row = self.conn.execute(
            "SELECT MAX(seq) FROM (SELECT MAX(seq) AS seq FROM events WHERE rollout_id = ? UNION ALL"
            " SELECT MAX(event_seq) FROM calls WHERE rollout_id = ? AND event_seq IS NOT NULL) AS s",
            (rollout_id, rollout_id),
        ).fetchone()
        return int(row[0] or 0)

    def add_event(self, event: Event) -> int:
        body = dump_json(event.to_json())
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
        return [codec.event_from_json(load_json(b)) for _, b in page]

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
                meta.append(NO_LOGPROBS)
            else:
                meta.append(len(choice.logprobs))
                if lps is None:
                    lps = array("f")
                lps.extend(choice.logprobs)
        packed_meta, packed_ids = pack(meta), pack(ids)
        lps_bytes = lps.tobytes() if lps is not None else None
        body = dump_json(codec.call_to_json(call))
        event_body = dump_json(event.to_json()) if event is not None else None
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
                    (
                        sum(call.tokens()),
                        event.seq if event else None,
                        event_body,
                        orjson.dumps(call.labels).decode() if call.labels else None,
                    )
                    if self._latest_columns
                    else ()
                ),
            ),
        )
        if event is not None:
            self._took_seq(event)
        version = call.model_version
        if version is not None and call.rollout_id is not None and self._latest_columns:
            pair = (call.rollout_id, version)
            if pair not in self._versions:
                if len(self._versions) >= 100_000:
                    self._versions.clear()  # a cache: INSERT OR IGNORE keeps the table right without it
                inserted = self.conn.execute(
                    "INSERT OR IGNORE INTO rollout_versions (model_version, enqueue_seq)"
                    " SELECT ?, enqueue_seq FROM rollouts WHERE id = ?",
                    (version, call.rollout_id),
                ).rowcount
                if inserted or self.rollout_state(call.rollout_id) is not None:  # (not before its rollout is)
                    self._versions.add(pair)
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
        label: tuple[str, str] | None = None,
    ) -> list[LLMCall]:
        if rollout_id is None:
            sql = f"SELECT {_CALL_COLUMNS} FROM calls WHERE rollout_id IS NULL AND order_key > ?"
            args: list[Any] = [after_order_key]
        else:
            sql = f"SELECT {_CALL_COLUMNS} FROM calls WHERE rollout_id = ? AND order_key > ?"
            args = [rollout_id, after_order_key]
        if attempt_id is not None:
            sql += " AND attempt_id = ?"
            args.append(attempt_id)
        if label is not None:
            sql += self.LABEL_TERM
            args += self._label_args(*label)
        cursor = self.conn.execute(sql + " ORDER BY order_key LIMIT ?", (*args, limit))
        return self._decode_calls(within_bytes(cursor, max_bytes, _call_row_bytes))

    LABEL_TERM = " AND json_extract(labels, ?) = ?"
    """A call's label in SQL (the column holds the labels as JSON text)."""

    def _label_args(self, key: str, value: str) -> tuple[str, str]:
        # A JSON path, the key quoted: keys are `LABEL_KEY` (no quote, no backslash), checked where they come in.
        return f'$."{key}"', value

    def response_call(self, response_id: str) -> LLMCall | None:
        # The term of the partial index (schema v7) repeated, so that SQLite may search it (a scan otherwise).
        sql = f"SELECT {_CALL_COLUMNS} FROM calls WHERE id = ? AND substr(id, 1, 5) = 'resp_'"
        rows = self.conn.execute(sql, (response_id,)).fetchall()
        return self._decode_calls(rows)[0] if rows else None

    def delete_response(self, call_id: str, at: float) -> bool:
        sql = "INSERT OR IGNORE INTO deleted_responses (id, deleted_at) VALUES (?, ?)"
        return self.conn.execute(sql, (call_id, at)).rowcount == 1

    def response_deleted(self, call_id: str) -> bool:
        return (
            self.conn.execute("SELECT 1 FROM deleted_responses WHERE id = ?", (call_id,)).fetchone()
            is not None
        )

    def _decode_calls(self, rows: list[Any]) -> list[LLMCall]:
        memo: dict[int, array[int]] = {}
        fetched = {row[0]: row[1:6] for row in rows}  # a prompt's parent is often an earlier row of this page

        def load_seq(ref: int) -> SeqRow:
            row = fetched.get(ref // _SLOTS)
            return _seq_row(ref, row) if row is not None else self._load_seq(ref)

        out = []
        for seq, parent, _shared, tail, meta_blob, ids_blob, lps_blob, body in rows:
            prompt: array[int] | None = None
            if tail is not None:
                prompt = resolve(seq * _SLOTS, load_seq, memo) if parent is not None else unpack(tail)
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
                if n_lp == NO_LOGPROBS:
                    lps.append(None)
                else:
                    lps.append(all_lps[lp_at : lp_at + n_lp])
                    lp_at += n_lp
            out.append(codec.call_from_json(load_json(body), prompt, ids, lps))
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
            (resource.name, resource.version, dump_json(resource.to_json())),
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
        return codec.resource_from_json(load_json(row[0])) if row else None

    def resource_versions(self, name: str, after: int, limit: int) -> list[Resource]:
        rows = self.conn.execute(
            "SELECT body FROM resources WHERE name = ? AND version > ? ORDER BY version LIMIT ?",
            (name, after, limit),
        )
        return [codec.resource_from_json(load_json(b)) for (b,) in rows]

    def latest_resources(self) -> list[Resource]:
        rows = self.conn.execute(
            "SELECT body FROM resources r WHERE version = (SELECT MAX(version) FROM resources WHERE name = r.name)"
            " ORDER BY name"
        )
        return [codec.resource_from_json(load_json(b)) for (b,) in rows]

    def put_model(self, model: ModelRecord) -> None:
        self.conn.execute(
            "INSERT OR REPLACE INTO models (name, body) VALUES (?, ?)",
            (model.name, dump_json(model.to_json())),
        )

    def delete_model(self, name: str) -> ModelRecord | None:
        row = self.conn.execute("DELETE FROM models WHERE name = ? RETURNING body", (name,)).fetchone()
        return codec.model_from_json(load_json(row[0])) if row else None

    def models(self) -> list[ModelRecord]:
        rows = self.conn.execute("SELECT body FROM models ORDER BY name")
        return [codec.model_from_json(load_json(b)) for (b,) in rows]


def connect(path: str, synchronous: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    conn.execute("PRAGMA foreign_keys = OFF")
    conn.execute("PRAGMA busy_timeout = 10000")
    return conn


_CALL_COLUMNS = "seq, prompt_parent, prompt_shared, prompt_tail, choice_meta, choice_ids, logprobs, body"
"""What a call is read back from (`_decode_calls`)."""


def _call_row_bytes(row: tuple[Any, ...]) -> int:
    return sum(len(v) for v in row[3:] if isinstance(v, bytes))
