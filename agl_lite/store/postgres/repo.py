"""Row access to the PostgreSQL store: the SQLite repository's storage format and SQL, said in PostgreSQL's dialect.

`SQLiteRepo` holds the format of every record and the SQL that reads and writes it; that SQL is written in the
subset both engines share, but for a few spellings. `PgConnection` gives the repository the `execute` it expects
and rewrites those spellings once per statement (cached): `?` placeholders, SQLite's `INSERT OR REPLACE` / `OR
IGNORE` (an upsert and `ON CONFLICT DO NOTHING`), its `INDEXED BY` hint (PostgreSQL's planner takes no hints), a
`CROSS JOIN … ON` (SQLite's way of fixing the join order), and the call insert's row id (`RETURNING seq`). One
repository for both backends means one storage format and the same store rules on both, tested by one suite.

What differs in behaviour is what a shared server needs: the writer's caches of event sequence numbers and rollout
states assume one process owns the store (SQLite's case), so they are off here: several gateways write the same
rollouts.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import orjson
import psycopg

from agl_lite.store.packed_ids import PrefixIndex
from agl_lite.store.records import Attempt, Event, LLMCall, ModelRecord, Rollout
from agl_lite.store.sqlite.repo import SQLiteRepo

__all__ = ["PgConnection", "PostgresRepo", "translate"]

_KEYS = {"rollouts": ("id",), "attempts": ("rollout_id", "id"), "models": ("name",)}
"""The conflict target of each table written with `INSERT OR REPLACE`."""
_REPLACE = re.compile(r"\s*INSERT OR REPLACE INTO (\w+)\s*\(([^)]*)\)")


@functools.lru_cache(maxsize=512)
def translate(sql: str) -> bytes:
    """SQLite's statement `sql` in PostgreSQL's dialect (bytes: psycopg runs it as given)."""
    out = sql
    if m := _REPLACE.match(out):
        table, columns = m[1], [c.strip() for c in m[2].split(",")]
        keys = _KEYS[table]
        updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in columns if c not in keys)
        out = f"INSERT INTO {table} ({', '.join(columns)}){out[m.end() :]}"
        out += f" ON CONFLICT ({', '.join(keys)}) DO UPDATE SET {updates}"
    elif out.lstrip().startswith("INSERT OR IGNORE INTO"):
        out = out.replace("INSERT OR IGNORE INTO", "INSERT INTO", 1) + " ON CONFLICT DO NOTHING"
    out = re.sub(r" INDEXED BY \w+", "", out).replace(" CROSS JOIN ", " JOIN ")
    out = out.replace("json_extract(labels, ?)", "(labels::jsonb ->> ?)")
    out = out.replace("%", "%%").replace("?", "%s")
    if out.startswith("INSERT INTO calls "):
        out += " RETURNING seq"
    return out.encode()


_NOW = "EXTRACT(EPOCH FROM clock_timestamp())"
"""The server's clock: the gateways' own may disagree."""


class _Cursor:
    """A psycopg cursor with the `lastrowid` of SQLite's (the call insert's `RETURNING seq`)."""

    __slots__ = ("_cur", "lastrowid")

    def __init__(self, cur: psycopg.Cursor[Any], returning: bool) -> None:
        self._cur = cur
        self.lastrowid = cur.fetchone()[0] if returning else None  # type: ignore[index]

    @property
    def rowcount(self) -> int:
        return self._cur.rowcount

    def fetchone(self) -> Any:
        return self._cur.fetchone()

    def fetchall(self) -> list[Any]:
        return self._cur.fetchall()

    def __iter__(self) -> Any:
        return iter(self._cur)


class PgConnection:
    """What `SQLiteRepo` calls on its connection, on a psycopg connection."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.raw = conn

    def execute(self, sql: str, params: Any = ()) -> _Cursor:
        query = translate(sql)
        return _Cursor(self.raw.execute(query, params or None), query.endswith(b"RETURNING seq"))

    def executemany(self, sql: str, params: Any) -> None:
        with self.raw.cursor() as cur:
            cur.executemany(translate(sql), params)


class PostgresRepo(SQLiteRepo):
    """`SQLiteRepo` on a PostgreSQL connection, without the caches that assume one process owns the store."""

    def __init__(
        self, conn: psycopg.Connection[Any], index: PrefixIndex | None = None, origin: str = ""
    ) -> None:
        super().__init__(PgConnection(conn), index)  # type: ignore[arg-type]
        self._seqs = None
        self._states = None
        self.origin = origin
        """The writing store's id, in its notifications: it skips its own."""

    def _label_args(self, key: str, value: str) -> tuple[str, str]:
        return key, value  # (`->>` takes the key itself)

    def put_model(self, model: ModelRecord) -> None:
        super().put_model(model)
        self._notify_model("model", model)

    def delete_model(self, name: str) -> ModelRecord | None:
        removed = super().delete_model(name)
        if removed is not None:
            self._notify_model("unmodel", removed)
        return removed

    def _notify_model(self, kind: str, model: ModelRecord) -> None:
        """A registration (or its removal) for the other replicas' routes: its name (they read the record; it
        may not fit a notification's 8,000 bytes, 64 endpoints of 2 KB each being allowed)."""
        self.conn.execute("SELECT pg_notify('agl_store', ?)", (f"{kind} {self.origin} {model.name}",))

    # --- each rollout's totals (schema v3) ----------------------------------------------------------------------

    def add_call(self, call: LLMCall, event: Event | None = None) -> int:
        written = super().add_call(call, event)
        if call.rollout_id is not None:
            self._add_totals(call.rollout_id, sum(call.tokens()), written)
        return written

    def add_event(self, event: Event) -> int:
        written = super().add_event(event)
        self._add_totals(event.rollout_id, 0, written)
        return written

    def _add_totals(self, rollout_id: str, tokens: int, written: int) -> None:
        self.conn.execute(
            "INSERT INTO rollout_totals (rollout_id, tokens, bytes) VALUES (?, ?, ?) ON CONFLICT (rollout_id)"
            " DO UPDATE SET tokens = rollout_totals.tokens + EXCLUDED.tokens,"
            " bytes = rollout_totals.bytes + EXCLUDED.bytes",
            (rollout_id, tokens, written),
        )

    def rollout_tokens(self, rollout_id: str) -> int:
        return self._total("tokens", rollout_id)

    def rollout_bytes(self, rollout_id: str) -> int:
        return self._total("bytes", rollout_id)

    def _total(self, column: str, rollout_id: str) -> int:
        row = self.conn.execute(
            f"SELECT {column} FROM rollout_totals WHERE rollout_id = ?", (rollout_id,)
        ).fetchone()
        return int(row[0]) if row else 0

    # --- the gateways sharing the store (schema v2) -------------------------------------------------------------

    def put_pause(self, pause: dict[str, Any] | None) -> dict[str, Any]:
        """The shared pause state after this change: `{"version": n, "pause": pause}`, n one more than before (in
        commit order: two changes side by side conflict, and one runs again)."""
        row = self.conn.execute(
            "INSERT INTO gateway_pause (id, version, body) VALUES (1, 1, ?) ON CONFLICT (id)"
            " DO UPDATE SET version = gateway_pause.version + 1, body = EXCLUDED.body RETURNING version",
            (orjson.dumps(pause),),
        ).fetchone()
        state = {"version": int(row[0]), "pause": pause}
        self.conn.execute(
            "SELECT pg_notify('agl_store', ?)", (f"pause {self.origin} {orjson.dumps(state).decode()}",)
        )
        return state

    def get_pause(self) -> dict[str, Any]:
        row = self.conn.execute("SELECT version, body FROM gateway_pause WHERE id = 1").fetchone()
        return (
            {"version": int(row[0]), "pause": orjson.loads(row[1])} if row else {"version": 0, "pause": None}
        )

    def put_replica(self, pause_id: str | None, in_flight: int) -> None:
        """This gateway heard of now; with `pause_id`, its answer to that pause too."""
        if pause_id is None:
            self.conn.execute(
                "INSERT INTO gateway_replicas (origin, in_flight, seen_at) VALUES (?, 0, " + _NOW + ")"
                " ON CONFLICT (origin) DO UPDATE SET seen_at = EXCLUDED.seen_at",
                (self.origin,),
            )
            return
        self.conn.execute(
            "INSERT INTO gateway_replicas (origin, pause_id, in_flight, seen_at) VALUES (?, ?, ?, "
            + _NOW
            + ")"
            " ON CONFLICT (origin) DO UPDATE SET pause_id = EXCLUDED.pause_id, in_flight = EXCLUDED.in_flight,"
            " seen_at = EXCLUDED.seen_at",
            (self.origin, pause_id, in_flight),
        )

    def undrained(self, pause_id: str, live_s: float) -> int:
        """Other gateways heard of within `live_s` that do not hold `pause_id` drained."""
        row = self.conn.execute(
            "SELECT COUNT(*) FROM gateway_replicas WHERE origin <> ? AND seen_at > " + _NOW + " - ?"
            " AND (pause_id IS DISTINCT FROM ? OR in_flight > 0)",
            (self.origin, live_s, pause_id),
        ).fetchone()
        return int(row[0])

    def drop_replica(self) -> None:
        self.conn.execute("DELETE FROM gateway_replicas WHERE origin = ?", (self.origin,))

    def put_attempt(self, attempt: Attempt, *, new: bool) -> None:
        super().put_attempt(attempt, new=new)
        if (
            attempt.status.terminal
        ):  # (the other replicas' agent gates forget it: asked again, they refuse it)
            ended = f"attempt {self.origin} {attempt.rollout_id} {attempt.id}"
            self.conn.execute("SELECT pg_notify('agl_store', ?)", (ended,))

    def put_rollout(self, rollout: Rollout, *, new: bool) -> None:
        super().put_rollout(rollout, new=new)
        # Every replica's waiters hear of it when (and only if) the transaction commits; PostgreSQL sends one
        # notification per channel and payload per transaction, however many rollouts it wrote.
        if new:
            self.conn.execute("SELECT pg_notify('agl_store', 'enqueued')")
        if (
            rollout.completion_seq is not None
        ):  # (ended: the other replicas cut its calls and wake their polls)
            ended = f"ended {self.origin} {rollout.status.value} {rollout.id}"
            self.conn.execute("SELECT pg_notify('agl_store', ?)", (ended,))
