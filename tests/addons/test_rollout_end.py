"""What happens to a rollout's LLM calls in flight when it ends (issue #15 M5): they are cut at once, wherever they
are, and their records are kept but marked late: no `llm_call` event, no triplet, nothing in the finished set.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import aiohttp
import pytest
from aiohttp import web

from agl_lite.addons import DEFAULT_CHAIN
from agl_lite.core.contract import derive_key
from agl_lite.core.server import Gateway
from agl_lite.store.records import CallOutcome, RolloutStatus
from agl_lite.store.rules import STORE, RolloutSpec, Store
from agl_lite.store.triplets import TripletOptions, rollout_triplets
from agl_lite.testing.servers import serve_app
from tests.conftest import ADMIN_KEY, GatewayFactory, gateway_url

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


@dataclass
class Stalling:
    """An upstream that answers (or not) and then stalls until the gateway lets go of it."""

    reached: asyncio.Event
    closed: asyncio.Event
    headers_first: bool = True

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.reached.set()
        try:
            if self.headers_first:
                resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
                await resp.prepare(request)
                frame = {
                    "id": "c1",
                    "choices": [{"index": 0, "delta": {"content": "Hel"}, "finish_reason": None}],
                }
                await resp.write(b"data: " + json.dumps(frame).encode() + b"\n\n")
            await asyncio.Event().wait()
        finally:
            self.closed.set()
        raise AssertionError("unreachable")


@dataclass
class Setup:
    gateway: Gateway
    store: Store
    upstream: Stalling

    async def post(self, session: aiohttp.ClientSession) -> aiohttp.ClientResponse:
        return await session.post(
            f"{gateway_url(self.gateway)}/r/r1/a/a1/v1/chat/completions",
            json={**CHAT, "stream": True},
            headers={"Authorization": f"Bearer {derive_key(ADMIN_KEY, 'r1')}"},
        )


@pytest.fixture(params=[True, False], ids=["mid-stream", "before-headers"])
async def setup(
    request: pytest.FixtureRequest, gateway_factory: GatewayFactory
) -> AsyncIterator[Callable[[], Setup]]:
    upstream = Stalling(asyncio.Event(), asyncio.Event(), headers_first=request.param)
    app = web.Application()
    app.router.add_post("/v1/chat/completions", upstream.handle)
    async with (
        serve_app(app) as url,
        gateway_factory(
            {"m": [url + "/v1"]}, chain=DEFAULT_CHAIN, addons={"store": {"backend": "memory"}}
        ) as gw,
    ):
        store = gw.addons.ctx.services.require(STORE, by="test")
        await store.enqueue([RolloutSpec(input=1, id="r1")])
        await store.claim("t", 1)
        yield lambda: Setup(gw, store, upstream)


@pytest.mark.parametrize("end", ["cancel", "finish"])
async def test_a_call_in_flight_when_its_rollout_ends_is_cut_and_recorded_late(
    setup: Callable[[], Setup], end: str
) -> None:
    s = setup()
    async with aiohttp.ClientSession() as session:
        pending = asyncio.ensure_future(s.post(session))
        await asyncio.wait_for(s.upstream.reached.wait(), 5)
        if end == "cancel":
            await s.store.cancel("r1")
        else:
            await s.store.finish("r1", RolloutStatus.FAILED)
        resp = await asyncio.wait_for(pending, 5)
        body = await asyncio.wait_for(resp.read(), 5)  # the stream ends: it does not wait for the upstream
        await asyncio.wait_for(s.upstream.closed.wait(), 5)  # and the upstream was let go at once
    if s.upstream.headers_first:
        assert resp.status == 200
        last = json.loads(body.rsplit(b"data: ", 1)[-1])
        assert b"[DONE]" not in body
    else:
        assert resp.status == 403
        last = json.loads(body)
    assert "ended while this call was in flight" in last["error"]["message"]
    calls = await s.store.calls("r1")
    assert [(c.outcome, c.late) for c in calls] == [(CallOutcome.ABORTED, True)]
    assert [e.kind for e in await s.store.events("r1")] == []  # no llm_call event in the ended rollout
    triplets = await rollout_triplets(s.store, "r1", TripletOptions())
    assert (triplets.triplets, triplets.skipped) == ([], {"late": 1})


async def test_the_admin_key_calls_on_an_agent_path_only_by_the_rollouts_rules(
    gateway_factory: GatewayFactory,
) -> None:
    # Issue #15 (low): with the admin key, calls could be recorded into a finished rollout, for attempts that do
    # not exist.
    async with gateway_factory(
        {"m": ["http://127.0.0.1:9/v1"]}, chain=DEFAULT_CHAIN, addons={"store": {"backend": "memory"}}
    ) as gw:
        store = gw.addons.ctx.services.require(STORE, by="test")
        await store.enqueue([RolloutSpec(input=1, id="done")])
        await store.claim("t", 1)
        await store.cancel("done")
        async with aiohttp.ClientSession() as session:
            for rollout in ("done", "nowhere"):
                async with session.post(
                    f"{gateway_url(gw)}/r/{rollout}/a/a1/v1/chat/completions",
                    json=CHAT,
                    headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                ) as r:
                    assert r.status == 403, rollout
        assert await store.calls("done") == []
