"""PostgresStore's own promises, beyond the store suite's: conflicting transactions of two replicas run again
until both commit, a write that fails alone fails alone, and a server that dropped every connection is reached
again without a failed request."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from agl_lite.errors import BadRequest
from agl_lite.store.postgres import PostgresStore
from agl_lite.store.rules import EventSpec, RolloutSpec
from tests.store.test_rules import call


async def test_two_replicas_writing_one_rollout_side_by_side_both_commit_every_write(postgres_db: str) -> None:
    """Events: each reads the rollout's last event number and writes the next, so they queue for the rollout's lock
    across replicas (`Serial`) and never conflict. Calls: each adds to the rollout's totals row; two that ran side
    by side conflict at SERIALIZABLE, and the loser runs again on fresh data. Every write lands, exactly once."""
    a, b = await PostgresStore.open(postgres_db), await PostgresStore.open(postgres_db)
    try:
        await a.enqueue([RolloutSpec(input=1, id="r")])
        await a.claim("runner", 1)
        await asyncio.gather(*[(a, b)[i % 2].add_events("r", [EventSpec("note", i)]) for i in range(200)])
        events = await a.events("r", limit=1000)
        assert sorted(e.data for e in events) == list(range(200))
        assert [e.seq for e in events] == list(range(1, 201))
        assert a.conflicts + b.conflicts == 0
        calls = [call("r", i, [1, 2, 3], [[4, 5]]) for i in range(100)]
        await asyncio.gather(*[(a, b)[i % 2].add_call(c) for i, c in enumerate(calls)])
        assert await a.tokens_used("r") == 100 * 5
        assert len(await b.calls("r", limit=1000)) == 100
        assert a.conflicts + b.conflicts > 0  # (they did run side by side, and ran again)
    finally:
        await a.close()
        await b.close()


async def test_a_refused_write_fails_alone_in_its_batch(postgres_db: str) -> None:
    store = await PostgresStore.open(postgres_db)
    try:
        good = [store.enqueue([RolloutSpec(input=i, id=f"r{i}")]) for i in range(5)]
        bad = store.enqueue([RolloutSpec(input=0, id="has space")])
        results = await asyncio.gather(*good, bad, return_exceptions=True)
        assert isinstance(results[-1], BadRequest)
        assert len(await store.list_rollouts()) == 5
    finally:
        await store.close()


async def test_a_server_that_dropped_every_connection_is_reached_again(postgres_db: str) -> None:
    store = await PostgresStore.open(postgres_db)
    try:
        await store.enqueue([RolloutSpec(input=1, id="before")])
        assert len(await store.list_rollouts()) == 1
        with psycopg.connect(postgres_db, autocommit=True) as admin:
            dropped = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchone()
        assert dropped is not None
        assert dropped[0] >= 3  # the writer, a reader, the listener
        await store.enqueue([RolloutSpec(input=2, id="after")])
        assert [r.id for r in await store.list_rollouts()] == ["before", "after"]
    finally:
        await store.close()


@pytest.mark.parametrize("dsn", ["postgresql://agl@127.0.0.1:1/none", "not a dsn = ="])
async def test_an_unreachable_or_unreadable_dsn_is_a_config_error(dsn: str) -> None:
    from agl_lite.errors import ConfigError

    with pytest.raises(ConfigError, match="cannot open the store"):
        await PostgresStore.open(dsn)
