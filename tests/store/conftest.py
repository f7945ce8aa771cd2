"""Every store test runs against every backend: memory, SQLite, and PostgreSQL (a real server the session starts,
a fresh database per test: tests/conftest.py's `postgres_db`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agl_lite.store.memory import MemoryStore
from agl_lite.store.rules import Store
from agl_lite.store.sqlite import SQLiteStore


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    s: Store
    if request.param == "memory":
        s = MemoryStore()
    elif request.param == "sqlite":
        s = await SQLiteStore.open(tmp_path / "store.db")
    else:
        from agl_lite.store.postgres import PostgresStore

        s = await PostgresStore.open(request.getfixturevalue("postgres_db"))
    try:
        yield s
    finally:
        await s.close()
