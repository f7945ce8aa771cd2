"""PostgresStore's own promises, beyond the store suite's: conflicting transactions of two replicas run again
until both commit, a write that fails alone fails alone, and a server that dropped every connection is reached
again without a failed request."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import psycopg
import pytest

from agl_lite.errors import BadRequest, ServiceUnavailable
from agl_lite.store.postgres import PostgresStore
from agl_lite.store.rules import EventSpec, RolloutSpec
from tests.store.test_rules import call


async def test_two_replicas_writing_one_rollout_side_by_side_both_commit_every_write(
    postgres_db: str,
) -> None:
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


class CutAtCommit:
    """A TCP proxy to the server that, once armed, lets the next COMMIT through and cuts the connection before
    the server's answer reaches the client: the transaction is committed, and the client cannot know it."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.armed = False
        self.cuts = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        cutting = False

        async def client_to_server() -> None:
            nonlocal cutting
            while data := await reader.read(65536):
                if self.armed and b"COMMIT" in data:
                    self.armed, cutting = False, True
                up_writer.write(data)
                await up_writer.drain()

        async def server_to_client() -> None:
            while data := await up_reader.read(65536):
                if cutting:  # the answer to the COMMIT: dropped, and the client's connection with it
                    self.cuts += 1
                    break
                writer.write(data)
                await writer.drain()
            writer.close()
            up_writer.close()

        tasks = [asyncio.ensure_future(client_to_server()), asyncio.ensure_future(server_to_client())]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        writer.close()
        up_writer.close()


async def test_a_write_committed_as_the_connection_broke_is_done_once_not_twice(postgres_db: str) -> None:
    """The server committed; the answer never came. Run again, the call would be stored twice (training data
    twice); answered 503, it would look lost. The store asks the server what became of the transaction."""
    url = urlsplit(postgres_db)
    proxy = CutAtCommit(url.hostname or "127.0.0.1", url.port or 5432)
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    store = await PostgresStore.open(postgres_db.replace(f":{url.port}/", f":{port}/"))
    try:
        await store.enqueue([RolloutSpec(input=1, id="r")])
        await store.claim("runner", 1)
        proxy.armed = True
        await store.add_call(call("r", 1, [1, 2, 3], [[4, 5]]))
        assert proxy.cuts == 1
        assert [c.id for c in await store.calls("r", limit=10)] == ["c1"]  # once
        assert await store.tokens_used("r") == 5
        await store.add_call(call("r", 2, [1, 2, 3, 4, 5, 6], [[7]]))  # and the store goes on
        assert len(await store.calls("r", limit=10)) == 2
    finally:
        await store.close()
        server.close()


async def test_a_write_or_read_asked_while_the_store_closes_is_refused_not_left_waiting(
    postgres_db: str,
) -> None:
    """As on SQLite: a write that came once `close` had queued the writer's stop never settled."""
    store = await PostgresStore.open(postgres_db)
    await store.enqueue([RolloutSpec(input=0, id="r")])
    closing = asyncio.ensure_future(store.close())
    async with asyncio.timeout(10):
        while not store._closing.is_set():  # noqa: ASYNC110 (close's own first write goes before the flag)
            await asyncio.sleep(0)
    with pytest.raises(ServiceUnavailable, match="closing"):
        await asyncio.wait_for(store.add_events("r", [EventSpec("note", 1)]), 10)
    with pytest.raises(ServiceUnavailable, match="closing"):
        await asyncio.wait_for(store.events("r"), 10)
    await closing
