"""What the PostgreSQL store's schema promises: migrated from an empty database once, however many replicas start
together; its version recorded; a newer one refused; the DSN's password never in a message."""

from __future__ import annotations

import asyncio
import re

import orjson
import psycopg
import pytest

from agl_lite.errors import ConfigError
from agl_lite.store.postgres import SCHEMA_VERSION, PostgresStore
from agl_lite.store.records import Rollout
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
    for secret in ("s3cret-pw", "Pa@ssw0rd", "Pa/ss@w0rd"):  # (an @ or / in a password left unescaped too)
        wrong = postgres_db.replace("agl@", f"agl:{secret}@").rsplit("/", 1)[0] + "/no_such_db"
        with pytest.raises(ConfigError, match="cannot open the store") as info:
            await PostgresStore.open(wrong)
        assert not {secret, *secret.split("@"), *secret.split("/")} & set(
            re.split(r"[\s=@/:'\"]+", str(info.value))
        )


async def test_a_v1_database_is_migrated_with_its_rollouts(
    postgres_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """v2 adds the gateways' shared pause and their answers to it; a v1 database keeps what it held."""
    from agl_lite.store.postgres import schema

    with monkeypatch.context() as m:
        m.setattr(schema, "MIGRATIONS", schema.MIGRATIONS[:1])
        m.setattr(schema, "SCHEMA_VERSION", 1)
        with psycopg.connect(postgres_db, autocommit=True) as conn:
            assert schema.migrate(conn, postgres_db) == 0
            conn.execute(
                "INSERT INTO rollouts (id, enqueue_seq, status, mode, body) VALUES ('r', 1, 'queuing', 'train', %s)",
                (orjson.dumps(Rollout(id="r", input=1, enqueue_seq=1).to_json()),),
            )
    store = await PostgresStore.open(postgres_db)
    try:
        assert [r.id for r in await store.list_rollouts()] == ["r"]
        await store.share_pause({"pause_id": "p", "mode": "hold", "hold_timeout_s": 1.0})
        pause = {"pause_id": "p", "mode": "hold", "hold_timeout_s": 1.0}
        assert await store.shared_pause() == {"version": 1, "pause": pause}
    finally:
        await store.close()
    with psycopg.connect(postgres_db) as conn:
        assert conn.execute("SELECT version FROM agl_schema").fetchall() == [(SCHEMA_VERSION,)]
