"""The store API over real HTTP: every route's happy path, and bad input that is refused and changes nothing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest

from agl_lite.core.contract import KeyRole, derive_key
from agl_lite.store.rules import STORE, Store
from tests.conftest import ADMIN_KEY, GatewayFactory, gateway_url

CHAIN = ("store", "auth", "store_api")


@dataclass
class Api:
    url: str
    session: aiohttp.ClientSession
    store: Store

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        key: str | None = ADMIN_KEY,
        raw: bytes | None = None,
    ) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        kwargs: dict[str, Any] = (
            {"data": raw} if raw is not None else {"json": body} if body is not None else {}
        )
        async with self.session.request(method, self.url + path, headers=headers, **kwargs) as r:
            return r.status, await r.json()

    async def running(self, rid: str, **config: Any) -> None:
        status, _ = await self.call(
            "POST",
            "/api/rollouts",
            {"rollouts": [{"input": {"q": rid}, "rollout_id": rid, "config": config}]},
        )
        assert status == 201
        await self.call("POST", "/api/runner/claim", {"runner_id": "test", "limit": 1000})


@pytest.fixture(params=["memory", "sqlite"])
async def api(request: pytest.FixtureRequest, gateway_factory: GatewayFactory) -> AsyncIterator[Api]:
    options = {"store": {"backend": request.param}, "store_api": {}}
    options.pop("store_api")
    async with (
        gateway_factory(
            {"m": ["http://127.0.0.1:9/v1"]},
            chain=CHAIN,
            addons=options,
            extra={"server": {"max_body_bytes": 200_000}},
        ) as gw,
        aiohttp.ClientSession() as s,
    ):
        yield Api(gateway_url(gw), s, gw.addons.ctx.services.require(STORE, by="test"))


async def test_enqueue_list_and_get(api: Api) -> None:
    status, body = await api.call(
        "POST",
        "/api/rollouts",
        {
            "rollouts": [
                {
                    "input": {"q": i},
                    "mode": "val" if i else "train",
                    "group_id": "g1",
                    "metadata": {"answer": i},
                }
                for i in range(3)
            ]
        },
    )
    assert status == 201
    ids = [r["id"] for r in body["rollouts"]]
    status, page = await api.call("GET", "/api/rollouts?limit=2")
    assert (status, [r["id"] for r in page["rollouts"]]) == (200, ids[:2])
    _, rest = await api.call("GET", f"/api/rollouts?limit=2&after={page['next']}")
    assert [r["id"] for r in rest["rollouts"]] == ids[2:]
    assert rest["next"] is None
    _, val = await api.call("GET", "/api/rollouts?mode=val&status=queuing")
    assert [r["id"] for r in val["rollouts"]] == ids[1:]
    status, one = await api.call("GET", f"/api/rollouts/{ids[0]}")
    assert (status, one["metadata"], one["attempts"]) == (200, {"answer": 0}, [])


@pytest.mark.parametrize(
    "query",
    [
        "reward_min=nan",
        "reward_max=1e999",
        "reward_min=high",
        "created_after=yesterday",
        "model_version=" + "v" * 300,
    ],
)
async def test_a_bad_list_filter_is_a_400_naming_it(api: Api, query: str) -> None:
    status, body = await api.call("GET", f"/api/rollouts?{query}")
    assert status == 400
    assert body["error"]["param"] == query.split("=")[0]


async def test_runner_protocol_round(api: Api) -> None:
    await api.call(
        "POST",
        "/api/rollouts",
        {"rollouts": [{"input": 1, "rollout_id": "r1", "config": {"max_attempts": 2}}]},
    )
    _, claimed = await api.call("POST", "/api/runner/claim", {"runner_id": "runner-1", "limit": 5})
    assert [r["id"] for r in claimed["rollouts"]] == ["r1"]
    status, started = await api.call("POST", "/api/rollouts/r1/attempts", {})
    assert status == 201
    aid = started["attempt"]["id"]
    _, running = await api.call("GET", "/api/runner/running")
    assert [(x["rollout"]["id"], [a["id"] for a in x["attempts"]]) for x in running["running"]] == [
        ("r1", [aid])
    ]
    status, patched = await api.call(
        "PATCH", f"/api/rollouts/r1/attempts/{aid}", {"status": "succeeded", "exit_code": 0}
    )
    assert (status, patched["status"]) == (200, "succeeded")
    status, done = await api.call("POST", "/api/rollouts/r1/finish", {"status": "succeeded"})
    assert (status, done["status"], done["completion_seq"]) == (200, "succeeded", 1)
    _, completed = await api.call("GET", "/api/rollouts/completed?after=0")
    assert ([r["id"] for r in completed["rollouts"]], completed["cursor"]) == (["r1"], 1)


async def test_attempt_env_is_the_agent_contract(api: Api) -> None:
    await api.running("r1")
    _, started = await api.call("POST", "/api/rollouts/r1/attempts", {"attempt_id": "pod-1"})
    env = started["env"]
    base = f"{api.url}/r/r1/a/pod-1"
    assert env["OPENAI_BASE_URL"] == base + "/v1"
    assert env["ANTHROPIC_BASE_URL"] == base
    assert env["AGL_EVENT_URL"] == base + "/events"
    assert env["OPENAI_API_KEY"] == env["ANTHROPIC_API_KEY"] == derive_key(ADMIN_KEY, "r1")
    assert env["AGL_TASK_INPUT"] == '{"q":"r1"}'
    assert (env["AGL_ROLLOUT_ID"], env["AGL_ATTEMPT_ID"], env["AGL_MODE"]) == ("r1", "pod-1", "train")
    assert started["grader_env"] is None
    assert derive_key(ADMIN_KEY, "r1", KeyRole.GRADER) not in str(env)


async def test_grader_env_only_with_a_grading_step(api: Api) -> None:
    await api.running("r1", grader={"command": ["python", "grade.py"]})
    _, started = await api.call("POST", "/api/rollouts/r1/attempts", {})
    grader_key = derive_key(ADMIN_KEY, "r1", KeyRole.GRADER)
    assert started["grader_env"]["AGL_GRADER_KEY"] == grader_key
    assert grader_key not in str(started["env"])


async def test_large_input_goes_by_url(api: Api) -> None:
    await api.call("POST", "/api/rollouts", {"rollouts": [{"input": "x" * 100_000, "rollout_id": "big"}]})
    await api.call("POST", "/api/runner/claim", {"runner_id": "t", "limit": 1})
    _, started = await api.call("POST", "/api/rollouts/big/attempts", {})
    env = started["env"]
    assert "AGL_TASK_INPUT" not in env
    status, task = await api.call("GET", env["AGL_TASK_URL"].removeprefix(api.url), key=env["OPENAI_API_KEY"])
    assert (status, len(task["input"])) == (200, 100_000)
    assert "metadata" not in task


async def test_kubernetes_env_template_creates_no_attempt(api: Api) -> None:
    await api.running("r1")
    _, started = await api.call("POST", "/api/rollouts/r1/attempts", {"attempt_id": "$(AGL_ATTEMPT_ID)"})
    assert started["attempt"] is None
    assert started["env"]["OPENAI_BASE_URL"].endswith("/r/r1/a/$(AGL_ATTEMPT_ID)/v1")
    assert await api.store.attempts("r1") == []


async def test_completed_long_polls_until_a_finish(api: Api) -> None:
    await api.running("r1")
    waiter = asyncio.ensure_future(api.call("GET", "/api/rollouts/completed?after=0&wait=30"))

    async def parked() -> None:
        while api.store.completion_waiters == 0:  # noqa: ASYNC110 — the store exposes a counter
            await asyncio.sleep(0.001)

    await asyncio.wait_for(parked(), 5)
    await api.call("POST", "/api/rollouts/r1/finish", {"status": "failed", "message": "no answer"})
    status, body = await asyncio.wait_for(waiter, 5)
    assert (status, [r["id"] for r in body["rollouts"]], body["cursor"]) == (200, ["r1"], 1)


async def test_events_and_admin_rewards(api: Api) -> None:
    await api.running("r1")
    status, body = await api.call(
        "POST",
        "/api/rollouts/r1/events",
        {"events": [{"kind": "note", "data": {"k": 1}}, {"kind": "reward", "data": {"value": 0.25}}]},
    )
    assert (status, [e["seq"] for e in body["events"]]) == (201, [1, 2])
    _, listed = await api.call("GET", "/api/rollouts/r1/events?kind=reward")
    assert [e["data"] for e in listed["events"]] == [{"value": 0.25}]
    _, rollout = await api.call("GET", "/api/rollouts/r1")
    assert rollout["reward"] == 0.25


async def test_agent_reward_needs_a_rollout_that_trusts_it(api: Api) -> None:
    await api.running("r1")
    key = derive_key(ADMIN_KEY, "r1")
    status, body = await api.call("POST", "/r/r1/a/a1/events", {"kind": "reward", "value": 1}, key=key)
    assert (status, body["error"]["type"]) == (403, "forbidden")
    status, _ = await api.call(
        "POST", "/r/r1/a/a1/events", {"kind": "progress", "data": {"step": 2}}, key=key
    )
    assert status == 201
    assert [e.kind for e in await api.store.events("r1")] == ["progress"]
    assert (await api.store.get_rollout("r1")).reward is None


async def test_trusted_agent_reward_counts_and_can_name_a_step(api: Api) -> None:
    await api.running("r1", trust_agent_rewards=True)
    body = {"kind": "reward", "value": 1, "response_id": "chatcmpl-1", "choice": 1}
    status, event = await api.call("POST", "/r/r1/a/a1/events", body, key=derive_key(ADMIN_KEY, "r1"))
    assert (status, event["data"], event["source"]) == (
        201,
        {"value": 1.0, "response_id": "chatcmpl-1", "choice": 1},
        "agent",
    )
    assert (await api.store.get_rollout("r1")).reward is None  # one step's reward, not the rollout's
    await api.call(
        "POST", "/r/r1/a/a1/events", {"kind": "reward", "value": 0.5}, key=derive_key(ADMIN_KEY, "r1")
    )
    assert (await api.store.get_rollout("r1")).reward == 0.5


async def test_agent_first_sight_upserts_its_attempt_within_the_cap(api: Api) -> None:
    await api.running("r1", max_attempts=1)
    key = derive_key(ADMIN_KEY, "r1")
    assert (await api.call("POST", "/r/r1/a/pod-a/events", {"kind": "hello"}, key=key))[0] == 201
    assert [a.id for a in await api.store.attempts("r1")] == ["pod-a"]
    status, body = await api.call("POST", "/r/r1/a/pod-b/events", {"kind": "hello"}, key=key)
    assert (status, body["error"]["type"]) == (409, "conflict")


async def test_agent_key_stops_working_when_the_rollout_ends(api: Api) -> None:
    await api.running("r1")
    key = derive_key(ADMIN_KEY, "r1")
    assert (await api.call("GET", "/r/r1/a/a1/task", key=key))[0] == 200
    await api.call("POST", "/api/rollouts/r1/cancel", {})
    status, body = await api.call("GET", "/r/r1/a/a1/task", key=key)
    assert (status, body["error"]["type"]) == (403, "forbidden")


async def test_agent_key_of_a_queued_rollout_does_not_work(api: Api) -> None:
    await api.call("POST", "/api/rollouts", {"rollouts": [{"input": 1, "rollout_id": "q"}]})
    status, _ = await api.call("GET", "/r/q/a/a1/task", key=derive_key(ADMIN_KEY, "q"))
    assert status == 403


async def test_grader_reads_metadata_and_posts_the_reward(api: Api) -> None:
    await api.call(
        "POST", "/api/rollouts", {"rollouts": [{"input": 1, "rollout_id": "r1", "metadata": {"answer": 42}}]}
    )
    await api.call("POST", "/api/runner/claim", {"runner_id": "t", "limit": 1})
    grader = derive_key(ADMIN_KEY, "r1", KeyRole.GRADER)
    status, rollout = await api.call("GET", "/r/r1/a/a1/grade", key=grader)
    assert (status, rollout["metadata"]) == (200, {"answer": 42})
    status, event = await api.call("POST", "/r/r1/a/a1/grade", {"kind": "reward", "value": 0.0}, key=grader)
    assert (status, event["source"]) == (201, "grader")
    assert (await api.store.get_rollout("r1")).reward == 0.0


async def test_resources_and_models(api: Api) -> None:
    assert (await api.call("POST", "/api/resources", {"name": "prompt", "value": "v1"}))[1]["version"] == 1
    assert (await api.call("POST", "/api/resources", {"name": "prompt", "value": "v2"}))[1]["version"] == 2
    assert (await api.call("GET", "/api/resources/prompt?version=1"))[1]["value"] == "v1"
    assert [r["version"] for r in (await api.call("GET", "/api/resources/latest"))[1]["resources"]] == [2]
    status, _ = await api.call(
        "POST",
        "/api/models",
        {"name": "qwen", "endpoints": ["http://127.0.0.1:8000/v1"], "version": "step-3"},
    )
    assert status == 201
    assert (await api.call("GET", "/api/models"))[1]["models"][0]["version"] == "step-3"


async def test_openapi_document_lists_every_route(api: Api) -> None:
    status, doc = await api.call("GET", "/api/openapi.json", key=None)
    assert (status, doc["openapi"]) == (200, "3.1.0")
    assert "/api/rollouts/{rollout_id}/attempts/{attempt_id}" in doc["paths"]
    assert "patch" in doc["paths"]["/api/rollouts/{rollout_id}/attempts/{attempt_id}"]
    assert (
        doc["paths"]["/api/rollouts"]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        == "#/components/schemas/EnqueueIn"
    )


BAD = [
    ("POST", "/api/rollouts", {"rollouts": []}, 400),
    ("POST", "/api/rollouts", {"rollouts": [{"input": 1, "rollout_id": "has space"}]}, 400),
    ("POST", "/api/rollouts", {"rollouts": [{"input": 1, "config": {"max_attempts": 0}}]}, 400),
    ("POST", "/api/rollouts", {"rollouts": [{"input": 1, "config": {"max_atempts": 2}}]}, 400),
    ("POST", "/api/rollouts", {"rollouts": [{"input": 1}], "extra": True}, 400),
    ("POST", "/api/rollouts", [1, 2], 400),
    ("GET", "/api/rollouts?status=sleeping", None, 400),
    ("GET", "/api/rollouts?limit=0", None, 400),
    ("GET", "/api/rollouts?after=x", None, 400),
    ("GET", "/api/rollouts/completed?wait=1000", None, 400),
    ("GET", "/api/rollouts/nope", None, 404),
    ("POST", "/api/rollouts/r1/finish", {"status": "cancelled"}, 400),
    ("POST", "/api/rollouts/nope/finish", {"status": "failed"}, 404),
    ("PATCH", "/api/rollouts/r1/attempts/nope", {"status": "failed"}, 404),
    ("PATCH", "/api/rollouts/r1/attempts/nope", {"status": "exploded"}, 400),
    ("POST", "/api/rollouts/r1/events", {"events": [{"kind": "reward", "data": "lots"}]}, 400),
    ("POST", "/api/rollouts/r1/events", {"events": [{"kind": "Bad Kind"}]}, 400),
    ("POST", "/api/runner/claim", {"runner_id": "x", "limit": 5000}, 400),
    ("POST", "/api/resources", {"name": "a/b", "value": 1}, 400),
    ("POST", "/api/models", {"name": "m", "endpoints": ["ftp://x"], "version": "1"}, 400),
    # issue #15 (low): these were taken, then failed mid-call (500), or showed their credentials to agents
    ("POST", "/api/models", {"name": "m", "endpoints": ["http://u:secret@x/v1"], "version": "1"}, 400),
    ("POST", "/api/models", {"name": "m", "endpoints": ["http://x:99999/v1"], "version": "1"}, 400),
    ("POST", "/api/models", {"name": "m", "endpoints": ["http://x/v1?k=1"], "version": "1"}, 400),
    ("POST", "/api/rollouts", {"rollouts": [{"input": "x" * 300_000}]}, 413),
]


@pytest.mark.parametrize(("method", "path", "body", "status"), BAD)
async def test_bad_input_is_refused_with_json_and_changes_nothing(
    api: Api, method: str, path: str, body: Any, status: int
) -> None:
    await api.running("r1")
    before = (await api.store.list_rollouts(), await api.store.events("r1"), await api.store.attempts("r1"))
    got, payload = await api.call(method, path, body)
    assert got == status
    assert set(payload["error"]) >= {"type", "message", "code"}
    after = (await api.store.list_rollouts(), await api.store.events("r1"), await api.store.attempts("r1"))
    assert after == before


async def test_malformed_json_is_400(api: Api) -> None:
    status, body = await api.call("POST", "/api/rollouts", raw=b"{nope")
    assert (status, body["error"]["type"]) == (400, "invalid_request")


async def test_illegal_transition_is_409_and_changes_nothing(api: Api) -> None:
    await api.running("r1")
    await api.call("POST", "/api/rollouts/r1/finish", {"status": "succeeded"})
    status, body = await api.call("POST", "/api/rollouts/r1/cancel", {})
    assert (status, body["error"]["type"]) == (409, "conflict")
    assert (await api.store.get_rollout("r1")).status.value == "succeeded"


@pytest.mark.parametrize("value", ["1_000", "+5", " 5", "\u0665", "5.0", "0x10", "1e3"])
async def test_a_query_integer_is_plain_ascii_digits(api: Api, value: str) -> None:
    # Issue #15 (low): int() took "1_000", "+5" and non-ASCII digits.
    status, body = await api.call("GET", f"/api/rollouts?limit={quote(value)}")
    assert status == 400
    assert "'limit' must be an integer" in body["error"]["message"]


async def test_pages_of_events_and_calls_end_at_a_byte_bound_and_say_if_more_follow(api: Api) -> None:
    # Issue #15 M4: `GET …/events` built a page of up to 10,000 events whole (RSS six to seven times its size).
    await api.running("r1")
    for _event in range(10):
        status, _ = await api.call(
            "POST", "/api/rollouts/r1/events", {"events": [{"kind": "n", "data": "x" * 1000}]}
        )
        assert status == 201
    seen: list[int] = []
    after, pages, more = 0, 0, True
    while more:  # bounded: ten events
        status, page = await api.call("GET", f"/api/rollouts/r1/events?after_seq={after}&max_bytes=2500")
        assert status == 200
        assert 1 <= len(page["events"]) <= 2
        seen += [e["seq"] for e in page["events"]]
        after, more, pages = seen[-1], page["more"], pages + 1
    assert seen == list(range(1, 11))
    assert pages == 5
    status, whole = await api.call("GET", "/api/rollouts/r1/events")
    assert (len(whole["events"]), whole["more"]) == (10, False)
    status, calls = await api.call("GET", "/api/rollouts/r1/calls")
    assert (calls["calls"], calls["more"]) == ([], False)
