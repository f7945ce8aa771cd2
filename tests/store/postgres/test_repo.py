"""The SQLite repository's SQL in PostgreSQL's dialect: each spelling that differs, rewritten once."""

from __future__ import annotations

import pytest

from agl_lite.store.postgres.repo import translate


@pytest.mark.parametrize(
    ("sqlite", "postgres"),
    [
        ("SELECT body FROM rollouts WHERE id = ?", "SELECT body FROM rollouts WHERE id = %s"),
        (
            "INSERT OR REPLACE INTO attempts (rollout_id, id, seq, body) VALUES (?, ?, ?, ?)",
            "INSERT INTO attempts (rollout_id, id, seq, body) VALUES (%s, %s, %s, %s)"
            " ON CONFLICT (rollout_id, id) DO UPDATE SET seq = EXCLUDED.seq, body = EXCLUDED.body",
        ),
        (
            "INSERT OR IGNORE INTO deleted_responses (id, deleted_at) VALUES (?, ?)",
            "INSERT INTO deleted_responses (id, deleted_at) VALUES (%s, %s) ON CONFLICT DO NOTHING",
        ),
        (
            "SELECT r.body FROM rollouts r INDEXED BY rollouts_scan WHERE +r.reward >= ? LIMIT ?",
            "SELECT r.body FROM rollouts r WHERE +r.reward >= %s LIMIT %s",
        ),
        (
            "SELECT r.body FROM rollout_versions v CROSS JOIN rollouts r ON r.enqueue_seq = v.enqueue_seq",
            "SELECT r.body FROM rollout_versions v JOIN rollouts r ON r.enqueue_seq = v.enqueue_seq",
        ),
        (
            "SELECT seq FROM calls WHERE rollout_id = ? AND json_extract(labels, ?) = ?",
            "SELECT seq FROM calls WHERE rollout_id = %s AND (labels::jsonb ->> %s) = %s",
        ),
        ("INSERT INTO calls (id) VALUES (?)", "INSERT INTO calls (id) VALUES (%s) RETURNING seq"),
        ("SELECT '100%' WHERE 1 = ?", "SELECT '100%%' WHERE 1 = %s"),  # a literal % is not a placeholder
    ],
)
def test_each_sqlite_spelling_becomes_postgresqls(sqlite: str, postgres: str) -> None:
    assert translate(sqlite) == postgres.encode()


def test_a_table_written_with_insert_or_replace_needs_its_conflict_key() -> None:
    with pytest.raises(KeyError):
        translate("INSERT OR REPLACE INTO unknown (a) VALUES (?)")
