"""The SQLite store's schema: each version's DDL, and the migrations that bring a database of any earlier version
to the current one.

A database records its version in `PRAGMA user_version`. `migrate` applies each later version in a transaction of
its own (its DDL, then the data it moves), so a migration cut short leaves the database at the last version reached.
"""

from __future__ import annotations

import sqlite3
from array import array

import structlog

from agl_lite.errors import ConfigError
from agl_lite.store import codec
from agl_lite.store.packed_ids import PrefixIndex, SeqRow, resolve, unpack
from agl_lite.store.sqlite.repo import SQLiteRepo, load_json

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "migrate"]

log = structlog.get_logger("agl_lite.store.sqlite")

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
    # v5: the labels addons set on a call, as JSON text in a column of their own (also in the call's JSON), so
    # that the calls API filters on them in SQL; the body may be compressed. NULL for a call without labels.
    """
    ALTER TABLE calls ADD COLUMN labels TEXT;
    """,
    # v6: calls found by their id, which for a Responses API call is its response id (`GET /v1/responses/{id}`,
    # `previous_response_id`): one index search, whatever the store holds.
    """
    CREATE INDEX calls_id ON calls (id);
    """,
    # v7: v6's index held every call's id, random for chat calls: every insert wrote a leaf page of its own
    # (10-17 µs more per call, measured). Only Responses API calls (ids `resp_…`, in sequence within a process) are
    # looked up by id: the index keeps those alone (`SQLiteRepo.response_call` repeats its term). And the Responses
    # API's deleted responses (`DELETE /v1/responses/{id}`): no longer served back to clients; their calls stay,
    # the rollout's training data.
    """
    DROP INDEX calls_id;
    CREATE INDEX calls_response_id ON calls (id) WHERE substr(id, 1, 5) = 'resp_';
    CREATE TABLE deleted_responses (id TEXT PRIMARY KEY, deleted_at REAL NOT NULL);
    """,
    # v8: rollouts by mode, in enqueue order (the dashboard's and the API's `mode` filter: a keyset page on an
    # index, not a scan of every rollout).
    """
    CREATE INDEX rollouts_mode ON rollouts (mode, enqueue_seq);
    """,
    # v9: the list's filters by reward, time and model version (the dashboard's, the API's). Reward and enqueue
    # time get columns (`_migrate_v9` fills them from each rollout's JSON); `rollouts_scan` holds both in enqueue
    # order, so that a filter on them walks one index and reads only the rows that match; `rollouts_created` finds
    # a time window's bounds. A rollout's model versions (those that served its calls) are a table of their own,
    # one row per pair, written by the call that first brings a version to its rollout.
    """
    ALTER TABLE rollouts ADD COLUMN reward REAL;
    ALTER TABLE rollouts ADD COLUMN created_at REAL;
    CREATE TABLE rollout_versions (
        model_version TEXT NOT NULL, enqueue_seq INTEGER NOT NULL, PRIMARY KEY (model_version, enqueue_seq)
    ) WITHOUT ROWID;
    """,
]
_V9_INDEXES = (
    "CREATE INDEX rollouts_scan ON rollouts (enqueue_seq, reward, created_at)",
    "CREATE INDEX rollouts_created ON rollouts (created_at, enqueue_seq)",
)
SCHEMA_VERSION = len(MIGRATIONS)


def migrate(conn: sqlite3.Connection, path: str, version: int) -> None:
    """Bring the database on `conn` (at `version`) to `SCHEMA_VERSION`; a newer database is a config error."""
    if version > SCHEMA_VERSION:
        raise ConfigError(
            f"the store {path} has schema version {version}, newer than this agl-lite ({SCHEMA_VERSION})"
        )
    for target in range(version + 1, SCHEMA_VERSION + 1):
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in MIGRATIONS[target - 1].split(";"):
                if statement.strip():
                    conn.execute(statement)
            if target == 2:
                _migrate_v2(conn)
            if target == 3:
                _migrate_v3(conn)
            if target == 9:
                _migrate_v9(conn)
            conn.execute(f"PRAGMA user_version = {target}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        log.info("store schema migrated", path=path, version=target)


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
        repo.add_call(codec.call_from_json(load_json(body), prompt, ids, lps))
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


def _migrate_v9(conn: sqlite3.Connection) -> None:
    """Fill v9's reward and time columns from each rollout's JSON, and `rollout_versions` from each call's (a page
    at a time), then build the indexes on the filled columns."""
    after = -1
    while rows := conn.execute(
        "SELECT rowid, body FROM rollouts WHERE rowid > ? ORDER BY rowid LIMIT 1000", (after,)
    ).fetchall():
        update = []
        for rowid, body in rows:
            data = load_json(body)
            update.append((data.get("reward"), data.get("created_at"), rowid))
        conn.executemany("UPDATE rollouts SET reward = ?, created_at = ? WHERE rowid = ?", update)
        after = rows[-1][0]
    after = -1
    while rows := conn.execute(
        "SELECT seq, rollout_id, body FROM calls WHERE seq > ? AND rollout_id IS NOT NULL ORDER BY seq LIMIT 1000",
        (after,),
    ).fetchall():
        pairs = {(load_json(body).get("model_version"), rollout_id) for _, rollout_id, body in rows}
        conn.executemany(
            "INSERT OR IGNORE INTO rollout_versions (model_version, enqueue_seq)"
            " SELECT ?, enqueue_seq FROM rollouts WHERE id = ?",
            [pair for pair in pairs if pair[0] is not None],
        )
        after = rows[-1][0]
    for statement in _V9_INDEXES:
        conn.execute(statement)
