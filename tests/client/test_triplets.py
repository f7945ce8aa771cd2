"""Triplets over HTTP: one rollout (`GET`), many in NDJSON pages with a byte budget (`POST /api/triplets`), and the
clear JSON errors bad input gets."""

from __future__ import annotations

import aiohttp
import pytest

from agl_lite.client import AglLiteClient, BadRequestError, NotFoundError, SyncAglLiteClient
from agl_lite.core.server import Gateway
from agl_lite.store.records import RolloutStatus
from agl_lite.store.rules import EventSpec
from agl_lite.store.triplets import RewardPolicy, TripletOptions
from tests.client.conftest import BackgroundGateway, make_call, running, store_of
from tests.conftest import ADMIN_KEY, gateway_url

IDS = [f"r{i}" for i in range(12)]


async def fill(gateway: Gateway, ids: list[str] = IDS) -> None:
    store = store_of(gateway)
    await running(store, *ids)
    for k, rid in enumerate(ids):  # while the rollouts run: calls committed after their end are late
        await store.add_call(make_call(rid, None, 1, [1, 2, 3], [[10 + k]]))
        await store.add_call(make_call(rid, None, 2, [1, 2, 3, 10 + k, 4], [[20 + k], [30 + k]]))
        await store.add_events(rid, [EventSpec("reward", {"value": float(k)})])
    for rid in ids:
        await store.finish(rid, RolloutStatus.SUCCEEDED)


async def test_one_rollouts_triplets(gateway: Gateway, client: AglLiteClient) -> None:
    await fill(gateway, ["r0"])
    rt = await client.triplets("r0", TripletOptions(reward_policy=RewardPolicy.BROADCAST))
    assert [(t.order_key, t.choice, t.prompt_ids.tolist(), t.response_ids.tolist()) for t in rt.triplets] == [
        (1, 0, [1, 2, 3], [10]),
        (2, 0, [1, 2, 3, 10, 4], [20]),
        (2, 1, [1, 2, 3, 10, 4], [30]),
    ]
    assert [t.logprobs.tolist() if t.logprobs else None for t in rt.triplets] == [[-0.5], [-0.5], [-0.5]]
    assert (rt.reward, [t.reward for t in rt.triplets]) == (0.0, [0.0, 0.0, 0.0])


async def test_many_rollouts_come_in_the_order_asked_one_request_per_page(
    gateway: Gateway, client: AglLiteClient
) -> None:
    await fill(gateway)
    wanted = list(reversed(IDS))
    one = len((await client.triplets("r0")).to_json().__repr__())  # about a rollout's size on the wire
    before = client.http.requests
    got = [rt async for rt in client.iter_triplets(wanted, max_bytes=max(1024, 3 * one))]
    assert [rt.rollout_id for rt in got] == wanted
    assert [rt.reward for rt in got] == [float(IDS.index(r)) for r in wanted]
    pages = client.http.requests - before
    assert 1 < pages < len(IDS)  # several rollouts a page, several pages


async def test_a_big_budget_serves_every_rollout_in_one_request(
    gateway: Gateway, client: AglLiteClient
) -> None:
    await fill(gateway)
    before = client.http.requests
    assert len([rt async for rt in client.iter_triplets(IDS)]) == len(IDS)
    assert client.http.requests - before == 1


async def test_an_unknown_rollout_is_a_json_404(gateway: Gateway, client: AglLiteClient) -> None:
    await fill(gateway, ["r0"])
    with pytest.raises(NotFoundError, match="nope"):
        await client.triplets("nope")
    with pytest.raises(NotFoundError, match="nope"):
        [rt async for rt in client.iter_triplets(["r0", "nope"])]


@pytest.mark.parametrize(
    ("method", "path", "body", "words"),
    [
        ("GET", "/api/rollouts/r0/triplets?reward_policy=first", None, "reward_policy"),
        ("GET", "/api/rollouts/r0/triplets?missing_reward=inf", None, "missing_reward"),
        ("POST", "/api/triplets", {"rollout_ids": []}, "rollout_ids"),
        ("POST", "/api/triplets", {"rollout_ids": ["r0"], "max_bytes": 1}, "max_bytes"),
        ("POST", "/api/triplets", {"rollout_ids": ["r0"], "attempts": "some"}, "attempts"),
        ("POST", "/api/triplets", {"rollout_ids": ["../x"]}, "rollout_ids"),
        ("POST", "/api/triplets", {"rollout_ids": ["r0"], "extra": 1}, "extra"),
    ],
)
async def test_bad_input_gets_a_clear_json_400(
    gateway: Gateway, method: str, path: str, body: object, words: str
) -> None:
    await fill(gateway, ["r0"])
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, gateway_url(gateway) + path, json=body, headers=headers) as resp,
    ):
        assert resp.status == 400
        error = (await resp.json())["error"]
    assert error["type"] == "invalid_request"
    assert words in error["message"]


async def test_the_client_refuses_nothing_the_server_would_take(
    gateway: Gateway, client: AglLiteClient
) -> None:
    await fill(gateway, ["r0"])
    with pytest.raises(BadRequestError):
        await client.triplets("r0", TripletOptions(missing_reward=float("nan")))


def test_the_sync_twin_pages_too(background_gateway: BackgroundGateway) -> None:
    async def setup() -> None:
        await running(background_gateway.store, "s1", "s2")
        for rid in ("s1", "s2"):
            await background_gateway.store.add_call(make_call(rid, None, 1, [1], [[2]]))
            await background_gateway.store.finish(rid, RolloutStatus.SUCCEEDED)

    background_gateway.run(setup())
    with SyncAglLiteClient(background_gateway.url, ADMIN_KEY) as client:
        assert [rt.rollout_id for rt in client.iter_triplets(["s2", "s1"])] == ["s2", "s1"]
        assert client.triplets("s1").triplets[0].response_ids.tolist() == [2]
