"""The store addon: SQLite by default, PostgreSQL given a DSN (one config key, or `AGL_STORE_DSN` /
`AGL_STORE_DSN_FILE` kept out of the config), and what two gateways on one PostgreSQL database show their clients."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agl_lite.addons.store import DSN_ENV
from agl_lite.client import AglLiteClient
from agl_lite.core import key_source
from agl_lite.errors import ConfigError
from agl_lite.store.records import RolloutStatus
from agl_lite.store.rules import RolloutSpec
from tests.client.conftest import NO_UPSTREAM, store_of
from tests.conftest import ADMIN_KEY, GatewayFactory, gateway_url

CHAIN = ("store", "auth", "store_api")


async def test_two_gateways_on_one_database_show_one_store_and_wake_each_others_long_polls(
    gateway_factory: GatewayFactory, postgres_db: str
) -> None:
    addons = {"store": {"dsn": postgres_db}}
    async with (
        gateway_factory(NO_UPSTREAM, chain=CHAIN, addons=addons) as gw_a,
        gateway_factory(NO_UPSTREAM, chain=CHAIN, addons=addons) as gw_b,
        AglLiteClient(gateway_url(gw_a), ADMIN_KEY) as a,
        AglLiteClient(gateway_url(gw_b), ADMIN_KEY) as b,
    ):
        assert type(store_of(gw_a)).__name__ == "PostgresStore"
        group = [r for g in await a.enqueue_group([{"q": i} for i in range(20)]) for r in g]
        claimed = await b.claim("runner-b", 20)
        assert sorted(r.id for r in claimed) == sorted(r.id for r in group)
        assert await a.claim("runner-a", 20) == []  # claimed once, whichever replica is asked
        _, head = await a.completed(0, 0)
        # A long poll on one replica wakes when a rollout ends through the other (LISTEN/NOTIFY), not at its wait.
        poll = asyncio.ensure_future(b.completed(head, 100, wait=30))
        await asyncio.sleep(
            0
        )  # (let it start; it may also begin after the finish: it reads first, then waits)
        await a.finish(claimed[0].id, RolloutStatus.SUCCEEDED)
        rows, cursor = await asyncio.wait_for(poll, 10)
        assert [r.id for r in rows] == [claimed[0].id]
        # A follower of the cursor through alternating replicas sees every completion once.
        for i, rollout in enumerate(claimed[1:]):
            await (a, b)[i % 2].finish(rollout.id, RolloutStatus.SUCCEEDED)
        seen = [r.id for r in rows]
        for i in range(40):
            page, cursor = await (a, b)[i % 2].completed(cursor, 3)
            seen += [r.id for r in page]
            if not page:
                break
        assert sorted(seen) == sorted(r.id for r in claimed)
        assert len(seen) == len(set(seen))


async def test_the_dsn_may_come_from_a_file_kept_from_agents(
    gateway_factory: GatewayFactory, postgres_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = tmp_path / "dsn"
    secret.write_text(postgres_db + "\n")
    monkeypatch.delenv(DSN_ENV, raising=False)
    monkeypatch.setenv(f"{DSN_ENV}_FILE", str(secret))
    async with gateway_factory(NO_UPSTREAM, chain=CHAIN) as gw:
        await store_of(gw).enqueue([RolloutSpec(input=1, id="r")])
        assert type(store_of(gw)).__name__ == "PostgresStore"
        assert secret.resolve() in gw.addons.ctx.private_paths
    assert key_source.read_key(DSN_ENV) == postgres_db


async def test_a_dsn_with_the_memory_backend_is_a_config_error(
    gateway_factory: GatewayFactory, postgres_db: str
) -> None:
    addons = {"store": {"backend": "memory", "dsn": postgres_db}}
    with pytest.raises(ConfigError, match="a DSN is given, but backend is `memory`"):
        async with gateway_factory(NO_UPSTREAM, chain=CHAIN, addons=addons):
            pass
