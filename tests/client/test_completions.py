"""`wait` and `completions` follow the completion cursor: one request per page or per long-poll timeout, never
one per pending rollout."""

from __future__ import annotations

import asyncio
import math
import random

import aiohttp

from agl_lite.client import AglLiteClient
from agl_lite.core.server import Gateway
from agl_lite.store.records import Rollout, RolloutStatus
from agl_lite.store.rules import Repo, Store
from tests.client.conftest import FAST, finished, running, store_of
from tests.conftest import ADMIN_KEY, gateway_url


class CursorRequests:
    """Counts the requests on the completion cursor (trace config) and the pages that came back empty (a
    long-poll that timed out)."""

    def __init__(self) -> None:
        self.requests = 0
        self.empty = 0

    def watch(self, client: AglLiteClient) -> AglLiteClient:
        completed = client.completed

        async def counting(after: int, limit: int = 100, wait: float = 0.0) -> tuple[list[Rollout], int]:
            rows, cursor = await completed(after, limit, wait)
            self.empty += not rows
            return rows, cursor

        client.completed = counting  # type: ignore[method-assign]
        return client

    def trace(self) -> aiohttp.TraceConfig:
        async def on_start(_: object, __: object, params: aiohttp.TraceRequestStartParams) -> None:
            self.requests += params.url.path == "/api/rollouts/completed"

        config = aiohttp.TraceConfig()
        config.on_request_start.append(on_start)
        return config


async def parked(store: Store) -> None:
    """Until a long-poll waits on the store (it exposes a counter for this)."""
    while store.completion_waiters == 0:  # noqa: ASYNC110
        await asyncio.sleep(0.001)


async def finish_in_one_commit(store: Store, ids: list[str]) -> None:
    """Finish rollouts in one transaction, so a parked long-poll wakes once to all of them (through the store's
    backend seam: the public `finish` commits each on its own)."""

    def op(repo: Repo) -> None:
        for rid in ids:
            Store._transition(repo, rid, RolloutStatus.SUCCEEDED, None)

    await store._write(op)
    store._notify_completion()


async def test_wait_over_1000_rollouts_makes_one_request_per_page(gateway: Gateway) -> None:
    store, rng = store_of(gateway), random.Random(7)
    ids = [f"r{i:04d}" for i in range(1000)]
    await running(store, *ids)
    shuffled = rng.sample(ids, len(ids))
    early, late = shuffled[:500], shuffled[500:]
    await asyncio.gather(*(store.finish(rid, RolloutStatus.SUCCEEDED) for rid in early))
    count = CursorRequests()
    async with count.watch(
        AglLiteClient(gateway_url(gateway), ADMIN_KEY, retry=FAST, trace_configs=[count.trace()])
    ) as client:
        waiting = asyncio.ensure_future(client.wait(ids, timeout=60, page_size=100, poll_s=30))
        await asyncio.wait_for(parked(store), 10)  # read the 500 finished so far, now long-polling
        await finish_in_one_commit(store, late)
        result = await asyncio.wait_for(waiting, 30)
    print(f"wait over 1000 rollouts: {count.requests} requests, {count.empty} long-poll timeouts")
    assert result.done
    assert [r.id for r in result.rollouts] == ids
    assert count.requests <= math.ceil(1000 / 100) + count.empty
    assert count.requests - count.empty == 10


async def test_wait_returns_the_finished_and_the_pending_at_its_timeout(
    client: AglLiteClient, gateway: Gateway
) -> None:
    store = store_of(gateway)
    await running(store, "a", "b")
    await store.finish("a", RolloutStatus.FAILED)
    result = await client.wait(["a", "b", "a"], timeout=0.2, poll_s=0.1)
    assert ([r.id for r in result.rollouts], result.pending, result.done) == (["a"], ["b"], False)
    assert result.rollouts[0].status is RolloutStatus.FAILED


async def test_wait_from_a_cursor_skips_what_was_seen(gateway: Gateway) -> None:
    store = store_of(gateway)
    await finished(store, *[f"old{i}" for i in range(250)])
    count = CursorRequests()
    async with count.watch(
        AglLiteClient(gateway_url(gateway), ADMIN_KEY, retry=FAST, trace_configs=[count.trace()])
    ) as client:
        first = await client.wait(["old249"])
        await finished(store, "new")
        second = await client.wait(["new"], after=first.cursor)
    assert [r.id for r in second.rollouts] == ["new"]
    assert count.requests == 3 + 1  # 250 from 0 in pages of 100, then one page from the cursor


async def test_completions_yield_in_completion_order_and_keep_the_cursor(
    client: AglLiteClient, gateway: Gateway
) -> None:
    store = store_of(gateway)
    await running(store, "a", "b", "c", "d")
    for rid in ("c", "a", "b"):
        await store.finish(rid, RolloutStatus.SUCCEEDED)
    stream = client.completions(after=0, page_size=2, poll_s=30)
    assert [(await anext(stream)).id for _ in range(3)] == ["c", "a", "b"]
    assert stream.cursor == 3
    following = asyncio.ensure_future(anext(stream))
    await asyncio.wait_for(parked(store), 10)
    await store.cancel("d")
    assert (await asyncio.wait_for(following, 10)).id == "d"
    assert stream.cursor == 4
