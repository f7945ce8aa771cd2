"""AglLiteClient against a real gateway over SQLite: every store route and gateway control, typed records back."""

from __future__ import annotations

import aiohttp
import pytest

from agl_lite import errors
from agl_lite.client import (
    AglLiteClient,
    AuthError,
    BadRequestError,
    ConflictError,
    ForbiddenError,
    NotFoundError,
)
from agl_lite.core.contract import KeyRole, derive_key
from agl_lite.core.server import Gateway
from agl_lite.store.records import AttemptStatus, RolloutConfig, RolloutStatus
from agl_lite.store.rules import EventSpec, RolloutFilter, RolloutSpec
from tests.client.conftest import FAST, finished, make_call, running, store_of
from tests.conftest import ADMIN_KEY, gateway_url


async def test_enqueue_names_each_rollout_so_enqueue_is_idempotent(client: AglLiteClient) -> None:
    (first,) = await client.enqueue([RolloutSpec({"q": 1}, metadata={"answer": 2})])
    assert first.id.startswith("ro-")
    (again,) = await client.enqueue([RolloutSpec({"q": "other"}, id=first.id)])
    assert (again.id, again.input, again.metadata) == (first.id, {"q": 1}, {"answer": 2})


async def test_enqueue_group_gives_the_copies_of_an_input_one_group(client: AglLiteClient) -> None:
    groups = await client.enqueue_group(
        [{"q": 1}, {"q": 2}],
        n=3,
        mode="val",
        config=RolloutConfig(max_attempts=2),
        metadata={"split": "a"},
        metadata_per_input=[{"answer": 1}, {"answer": 2}],
    )
    assert [len(g) for g in groups] == [3, 3]
    assert len({r.group_id for r in groups[0]}) == 1
    assert groups[0][0].group_id != groups[1][0].group_id
    assert [r.metadata for r in groups[1]] == [{"split": "a", "answer": 2}] * 3
    assert {(r.mode, r.config.max_attempts) for g in groups for r in g} == {("val", 2)}


async def test_enqueue_over_the_batch_limit_is_split(client: AglLiteClient) -> None:
    (group,) = await client.enqueue_group([{"q": 1}], n=1500)
    assert len({r.id for r in group}) == 1500
    assert len([r async for r in client.iter_rollouts(page_size=1000)]) == 1500


async def test_get_rollout_with_its_attempts(client: AglLiteClient, gateway: Gateway) -> None:
    await running(store_of(gateway), "r1")
    started = await client.start_attempt("r1", "pod-1")
    rollout, attempts = await client.get_rollout_with_attempts("r1")
    assert (rollout.id, rollout.status) == ("r1", RolloutStatus.RUNNING)
    assert [a.id for a in attempts] == [started.id] == ["pod-1"]
    assert await client.get_rollout("r1") == rollout


async def test_missing_rollout_is_not_found_for_client_and_server_handlers(client: AglLiteClient) -> None:
    with pytest.raises(NotFoundError) as info:
        await client.get_rollout("nope")
    assert isinstance(info.value, errors.NotFound)
    assert (info.value.status_code, info.value.error_type) == (404, "not_found")


async def test_list_rollouts_filters_and_pages(client: AglLiteClient) -> None:
    await client.enqueue_group([{"q": i} for i in range(5)], mode="train")
    await client.enqueue_group([{"q": 9}], mode="val")
    page = await client.list_rollouts(RolloutFilter(mode="train", limit=2))
    rest = await client.list_rollouts(RolloutFilter(mode="train", after=page[-1].enqueue_seq))
    assert [r.input["q"] for r in page + rest] == [0, 1, 2, 3, 4]
    assert [r.input async for r in client.iter_rollouts(mode="val")] == [{"q": 9}]


async def test_list_rollouts_by_reward_model_version_and_time(
    client: AglLiteClient, gateway: Gateway
) -> None:
    rollouts = await running(store_of(gateway), "r0", "r1", "r2", "r3")
    for i, reward in enumerate([0.0, 1.0, 0.5, 1.0]):
        await client.add_events(f"r{i}", [EventSpec("reward", reward)])
    for i in (1, 2):
        call = make_call(f"r{i}", None, 1, [1], [[2]])
        call.model_version = f"step-{i}"
        await store_of(gateway).add_call(call)
    assert [r.id for r in await client.list_rollouts(RolloutFilter(reward_min=0.75))] == ["r1", "r3"]
    assert [r.id async for r in client.iter_rollouts(reward_max=0.5, page_size=1)] == ["r0", "r2"]
    assert [r.id async for r in client.iter_rollouts(model_version="step-2")] == ["r2"]
    t = rollouts[2].created_at
    expected = [r.id for r in rollouts if r.created_at >= t]
    assert [r.id async for r in client.iter_rollouts(created_after=t)] == expected
    assert [r.id async for r in client.iter_rollouts(created_before=rollouts[0].created_at)] == []


async def test_cancel_twice_is_a_conflict(client: AglLiteClient) -> None:
    ((rollout,),) = await client.enqueue_group([{"q": 1}])
    cancelled = await client.cancel(rollout.id, "not needed")
    assert (cancelled.status, cancelled.message) == (RolloutStatus.CANCELLED, "not needed")
    with pytest.raises(ConflictError) as info:
        await client.cancel(rollout.id)
    assert isinstance(info.value, errors.Conflict)


async def test_runner_protocol_round_trip(client: AglLiteClient) -> None:
    ((queued,),) = await client.enqueue_group([{"q": 1}], config=RolloutConfig(max_attempts=2))
    (claimed,) = await client.claim("runner-1", 5)
    assert (claimed.id, claimed.status, claimed.runner_id) == (queued.id, RolloutStatus.RUNNING, "runner-1")
    attempt = await client.start_attempt(queued.id)
    assert attempt.env["AGL_ROLLOUT_ID"] == queued.id
    assert attempt.env["OPENAI_API_KEY"] == derive_key(ADMIN_KEY, queued.id)
    assert attempt.grader_env is None
    ((rollout, attempts),) = await client.running()
    assert (rollout.id, [a.id for a in attempts]) == (queued.id, [attempt.id])
    failed = await client.update_attempt(
        queued.id, attempt.id, AttemptStatus.FAILED, exit_code=3, message="x"
    )
    assert (failed.status, failed.exit_code) == (AttemptStatus.FAILED, 3)
    assert [a.status for a in await client.attempts(queued.id)] == [AttemptStatus.FAILED]
    done = await client.finish(queued.id, RolloutStatus.SUCCEEDED, "ok")
    assert (done.status, done.completion_seq) == (RolloutStatus.SUCCEEDED, 1)
    rows, cursor = await client.completed(0)
    assert ([r.id for r in rows], cursor) == ([queued.id], 1)


async def test_start_attempt_again_with_its_id_returns_the_same_attempt(client: AglLiteClient) -> None:
    ((rollout,),) = await client.enqueue_group([{"q": 1}])
    await client.claim("r", 1)
    first = await client.start_attempt(rollout.id, "pod-a")
    again = await client.start_attempt(rollout.id, "pod-a")
    assert (again.id, again.seq) == (first.id, first.seq)
    assert len(await client.attempts(rollout.id)) == 1


async def test_grader_env_comes_with_a_grading_step(client: AglLiteClient) -> None:
    ((rollout,),) = await client.enqueue_group([{"q": 1}], config=RolloutConfig(grader={"command": ["g"]}))
    await client.claim("r", 1)
    attempt = await client.start_attempt(rollout.id)
    assert attempt.grader_env is not None
    assert attempt.grader_env["AGL_GRADER_KEY"] == derive_key(ADMIN_KEY, rollout.id, KeyRole.GRADER)


async def test_env_template_for_kubernetes_creates_no_attempt(client: AglLiteClient) -> None:
    ((rollout,),) = await client.enqueue_group([{"q": 1}])
    await client.claim("r", 1)
    template = await client.attempt_env_template(rollout.id)
    assert template.env["OPENAI_BASE_URL"].endswith("/a/$(AGL_ATTEMPT_ID)/v1")
    assert await client.attempts(rollout.id) == []


async def test_events_and_a_step_reward(client: AglLiteClient, gateway: Gateway) -> None:
    await running(store_of(gateway), "r1")
    await client.add_events("r1", [EventSpec("note", {"k": 1})])
    reward = await client.reward("r1", 0.5, response_id="chatcmpl-1", choice=1)
    assert reward.data == {"value": 0.5, "response_id": "chatcmpl-1", "choice": 1}
    assert [(e.seq, e.kind) for e in await client.events("r1")] == [(1, "note"), (2, "reward")]
    assert [e.seq for e in await client.events("r1", kind="reward")] == [2]
    assert [e.seq for e in await client.events("r1", after_seq=1)] == [2]
    assert (await client.get_rollout("r1")).reward is None  # one step's reward is not the rollout's


async def test_follow_events_ends_once_the_rollout_is_terminal(
    client: AglLiteClient, gateway: Gateway
) -> None:
    store = store_of(gateway)
    await running(store, "r1")
    await client.add_events("r1", [EventSpec("step", 1)])
    follow = client.follow_events("r1", poll_s=0.01)
    assert (await anext(follow)).data == 1
    await client.add_events("r1", [EventSpec("step", 2)])
    await client.finish("r1", RolloutStatus.SUCCEEDED)
    assert [e.data async for e in follow] == [2]


async def test_calls_come_back_with_exact_ids_and_logprobs(client: AglLiteClient, gateway: Gateway) -> None:
    store = store_of(gateway)
    await running(store, "r1")
    for k in range(5):
        await store.add_call(make_call("r1", "a1", k, list(range(100 + k)), [[7, 8, k], [9]]))
    expected = await store.calls("r1")
    assert await client.calls("r1") == expected
    assert [c async for c in client.iter_calls("r1", page_size=2)] == expected
    assert await client.calls("r1", after_order_key=2, limit=1) == expected[3:4]


async def test_unattributed_calls_are_not_served_over_http(client: AglLiteClient) -> None:
    with pytest.raises(BadRequestError):
        await client.calls(None)


async def test_resources_and_models(client: AglLiteClient) -> None:
    assert (await client.put_resource("prompt", {"t": "v1"})).version == 1
    assert (await client.put_resource("prompt", {"t": "v2"})).version == 2
    assert (await client.get_resource("prompt", 1)).value == {"t": "v1"}
    assert (await client.get_resource("prompt")).value == {"t": "v2"}
    assert [(r.name, r.version) for r in await client.latest_resources()] == [("prompt", 2)]
    model = await client.put_model("qwen", ["http://127.0.0.1:8000/v1"], "step-1")
    assert [(m.name, m.version) for m in await client.models()] == [(model.name, "step-1")]


async def test_health_and_gateway_controls(client: AglLiteClient) -> None:
    assert await client.health() == {"status": "ok"}
    paused = await client.pause("reject", hold_timeout_s=5)
    assert (paused.paused, paused.mode) == (True, "reject")
    assert (await client.gateway_state(wait_drained=1)).in_flight == 0
    assert (await client.resume()).paused is False


async def test_invalid_request_is_a_bad_request_error(client: AglLiteClient) -> None:
    with pytest.raises(BadRequestError) as info:
        await client.enqueue([RolloutSpec({"q": 1}, mode="Not A Mode")])
    assert "mode" in info.value.message
    assert isinstance(info.value, errors.BadRequest)


async def test_wrong_key_is_an_auth_error(gateway: Gateway) -> None:
    async with AglLiteClient(gateway_url(gateway), "wrong", retry=FAST) as c:
        with pytest.raises(AuthError):
            await c.models()


async def test_agent_key_is_forbidden_on_the_admin_api(gateway: Gateway) -> None:
    async with AglLiteClient(gateway_url(gateway), derive_key(ADMIN_KEY, "r1"), retry=FAST) as c:
        with pytest.raises(ForbiddenError):
            await c.models()


async def test_trace_configs_see_every_request(gateway: Gateway) -> None:
    seen: list[str] = []

    async def on_start(_: aiohttp.ClientSession, __: object, params: aiohttp.TraceRequestStartParams) -> None:
        seen.append(f"{params.method} {params.url.path}")

    trace = aiohttp.TraceConfig()
    trace.on_request_start.append(on_start)
    async with AglLiteClient(gateway_url(gateway), ADMIN_KEY, trace_configs=[trace]) as c:
        await c.health()
        await c.models()
    assert seen == ["GET /healthz", "GET /api/models"]


async def test_url_and_key_come_from_the_environment(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGL_URL", gateway_url(gateway) + "/")
    async with AglLiteClient() as c:
        assert c.url == gateway_url(gateway)
        assert await c.models() == []


async def test_completed_pages_with_a_limit(client: AglLiteClient, gateway: Gateway) -> None:
    await finished(store_of(gateway), "a", "b", status=RolloutStatus.FAILED)
    rows, cursor = await client.completed(0, limit=1)
    assert ([r.id for r in rows], cursor) == (["a"], 1)
