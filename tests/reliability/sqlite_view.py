"""Reading a gateway's SQLite file from the outside, on a read-only connection of its own (WAL: it sees what was
committed): a digest to prove a refused request changed nothing, and all the text to grep for secrets.
"""

from __future__ import annotations

import contextlib
import hashlib
import sqlite3
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def _rows(db: Path) -> Iterator[Iterator[tuple[str, tuple[Any, ...]]]]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        tables = [
            r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        ]
        yield ((t, row) for t in tables for row in conn.execute(f'SELECT * FROM "{t}"'))
    finally:
        conn.close()


def store_digest(db: Path) -> str:
    """Every row of every table, in a stable order: equal digests, equal stores."""
    with _rows(db) as rows:
        lines = sorted(f"{table}:{row!r}" for table, row in rows)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def stored_text(db: Path) -> str:
    """Every value in the file as text, blobs inflated where they are compressed."""
    parts = []
    with _rows(db) as rows:
        for _, row in rows:
            for value in row:
                if isinstance(value, bytes):
                    with contextlib.suppress(zlib.error):  # compressed only when large
                        value = zlib.decompress(value)
                    value = value.decode(errors="replace")
                parts.append(str(value))
    return "\n".join(parts)
