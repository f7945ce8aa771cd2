"""What the PostgreSQL store's schema promises: migrated from an empty database once, however many replicas start
together; its version recorded; a newer one refused; the DSN's password never in a message."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from agl_lite.errors import ConfigError
from agl_lite.store.postgres import SCHEMA_VERSION, PostgresStore
from agl_lite.store.rules import RolloutSpec


async def test_replicas_starting_together_migrate_an_empty_database_once(postgres_db: str) -> None:
    stores = await asyncio.gather(*(PostgresStore.open(postgres_db) for _ in range(4)))
    try:
        await stores[0].enqueue([RolloutSpec(input=1, id="r")])
        assert [r.id for r in await stores[3].list_rollouts()] == ["r"]
    finally:
        for store in stores:
            await store.close()
    with psycopg.connect(postgres_db) as conn:
        assert conn.execute("SELECT version FROM agl_schema").fetchall() == [(SCHEMA_VERSION,)]


async def test_a_newer_database_is_refused_and_a_password_never_shown(postgres_db: str) -> None:
    await (await PostgresStore.open(postgres_db)).close()
    with psycopg.connect(postgres_db) as conn:
        conn.execute("UPDATE agl_schema SET version = %s", (SCHEMA_VERSION + 1,))
    with pytest.raises(ConfigError, match=f"schema version {SCHEMA_VERSION + 1}, newer"):
        await PostgresStore.open(postgres_db)
    wrong = postgres_db.replace("agl@", "agl:s3cret-pw@").rsplit("/", 1)[0] + "/no_such_db"
    with pytest.raises(ConfigError, match="cannot open the store") as info:
        await PostgresStore.open(wrong)
    assert "s3cret-pw" not in str(info.value)
