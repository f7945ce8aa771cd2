"""Abuse of keys (issue #9, point 4), beyond the scope matrix of tests/integration/test_scopes.py: what an agent
key or a grader key could try against its own and other rollouts, through a real gateway (default chain, SQLite),
and a check that no key ever shows in a log, an error, /metrics, a stored record or an upstream request.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
import orjson
import pytest

from agl_lite.addons import DEFAULT_CHAIN
from agl_lite.core.contract import KeyRole, derive_key
from agl_lite.testing import MockVLLM, running_mock
from agl_lite.testing.gateway import write_config
from bench.harness.gateway_process import gateway_processes, log_records, secrets_in, start_gateway
from tests.conftest import ADMIN_KEY, GatewayFactory, gateway_url
from tests.reliability.sqlite_view import stored_text

SECRET_ANSWER = "the-reference-answer-42"
CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@dataclass
class Rollout:
    id: str
    attempt: str
    agent_key: str
    grader_key: str

    @property
    def base(self) -> str:
        return f"/r/{self.id}/a/{self.attempt}"


class Client:
    def __init__(self, http: aiohttp.ClientSession, url: str) -> None:
        self.http, self.url = http, url

    async def send(self, method: str, path: str, key: str | None, body: Any = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        async with self.http.request(method, self.url + path, json=body, headers=headers) as r:
            raw = await r.read()
            return r.status, orjson.loads(raw) if raw else None

    async def admin(self, method: str, path: str, body: Any = None) -> Any:
        status, got = await self.send(method, path, ADMIN_KEY, body)
        assert status < 300, (method, path, status, got)
        return got

    async def rollout(self, *, trust: bool = False, max_attempts: int = 3) -> Rollout:
        spec = {
            "input": {"question": "2+3"},
            "metadata": {"answer": SECRET_ANSWER},
            "config": {"trust_agent_rewards": trust, "max_attempts": max_attempts},
        }
        (created,) = (await self.admin("POST", "/api/rollouts", {"rollouts": [spec]}))["rollouts"]
        rid = created["id"]
        claimed = await self.admin("POST", "/api/runner/claim", {"runner_id": "abuse", "limit": 1000})
        assert rid in [r["id"] for r in claimed["rollouts"]]
        got = await self.admin("POST", f"/api/rollouts/{rid}/attempts", {})
        return Rollout(
            rid,
            got["attempt"]["id"],
            derive_key(ADMIN_KEY, rid, KeyRole.AGENT),
            derive_key(ADMIN_KEY, rid, KeyRole.GRADER),
        )

    async def state(self, rid: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        rollout = await self.admin("GET", f"/api/rollouts/{rid}")
        return rollout, (await self.admin("GET", f"/api/rollouts/{rid}/events"))["events"]


@pytest.fixture
async def client(gateway_factory: GatewayFactory) -> AsyncIterator[Client]:
    async with (
        running_mock(MockVLLM(("smollm2",))) as url,
        gateway_factory(
            {"smollm2": [url]},
            chain=DEFAULT_CHAIN,
            addons={"store": {"backend": "sqlite", "path": "abuse.db"}},
        ) as gw,
        aiohttp.ClientSession() as http,
    ):
        yield Client(http, gateway_url(gw))


# --- rewards -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        {"kind": "reward", "value": 1.0},
        {"kind": "reward", "value": 1.0, "response_id": "chatcmpl-x", "choice": 0},
    ],
)
async def test_an_agent_key_cannot_post_a_reward_where_the_rollout_does_not_trust_agent_rewards(
    client: Client, body: dict[str, Any]
) -> None:
    r = await client.rollout(trust=False)
    before = await client.state(r.id)
    status, got = await client.send("POST", f"{r.base}/events", r.agent_key, body)
    assert (status, got["error"]["type"]) == (403, "forbidden")
    assert await client.state(r.id) == before


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "{base}/grade", {"kind": "reward", "value": 1.0}),
        ("POST", "/api/rollouts/{rid}/events", {"events": [{"kind": "reward", "data": {"value": 1.0}}]}),
        ("POST", "/api/rollouts/{rid}/finish", {"status": "succeeded"}),
    ],
)
async def test_an_agent_key_cannot_reach_the_routes_that_reward_or_judge(
    client: Client, method: str, path: str, body: Any
) -> None:
    r = await client.rollout(trust=True)  # even a rollout that trusts its agent's rewards
    before = await client.state(r.id)
    status, _ = await client.send(method, path.format(base=r.base, rid=r.id), r.agent_key, body)
    assert status == 403
    assert await client.state(r.id) == before


async def test_a_trusted_agent_reward_counts_and_an_untrusted_custom_kind_is_not_a_reward(
    client: Client,
) -> None:
    untrusted, trusted = await client.rollout(trust=False), await client.rollout(trust=True)
    status, _ = await client.send(
        "POST", f"{untrusted.base}/events", untrusted.agent_key, {"kind": "reward.x"}
    )
    assert status == 201
    assert (await client.state(untrusted.id))[0]["reward"] is None
    status, _ = await client.send(
        "POST", f"{trusted.base}/events", trusted.agent_key, {"kind": "reward", "value": 0.5}
    )
    assert status == 201
    assert (await client.state(trusted.id))[0]["reward"] == 0.5


async def test_an_agent_key_cannot_forge_a_captured_call_event(client: Client) -> None:
    r = await client.rollout()
    before = await client.state(r.id)
    forged = {"kind": "llm_call", "data": {"call_id": "fake", "outcome": "ok"}}
    status, got = await client.send("POST", f"{r.base}/events", r.agent_key, forged)
    assert status in (400, 403), got
    assert await client.state(r.id) == before


async def test_a_call_refused_for_another_rollouts_key_leaves_no_trace_in_that_rollout(
    client: Client,
) -> None:
    mine, other = await client.rollout(), await client.rollout()
    before = await client.state(other.id)
    for method, path, body in [
        ("POST", f"{other.base}/v1/chat/completions", CHAT),
        ("POST", f"{other.base}/v1/messages", {"model": "smollm2", "max_tokens": 4, "messages": []}),
        ("POST", f"{other.base}/events", {"kind": "note"}),
    ]:
        status, _ = await client.send(method, path, mine.agent_key, body)
        assert status == 403, path
    assert await client.state(other.id) == before
    assert (await client.admin("GET", f"/api/rollouts/{other.id}/calls"))["calls"] == []


# --- attempts ----------------------------------------------------------------------------------------------------


async def test_an_agent_key_cannot_mint_attempts_past_the_cap(client: Client) -> None:
    r = await client.rollout(max_attempts=2)  # one attempt started already
    status, _ = await client.send("GET", f"/r/{r.id}/a/pod-2/task", r.agent_key)
    assert status == 200  # first sight of a pod's UID: upserted, within the cap
    status, got = await client.send("POST", f"/r/{r.id}/a/pod-3/v1/chat/completions", r.agent_key, CHAT)
    assert (status, got["error"]["type"]) == (409, "conflict")
    rollout, _ = await client.state(r.id)
    assert (rollout["attempt_count"], sorted(a["id"] for a in rollout["attempts"])) == (
        2,
        sorted([r.attempt, "pod-2"]),
    )


@pytest.mark.parametrize("end", ["finish", "cancel"])
async def test_an_agent_key_stops_working_when_its_rollout_ends(client: Client, end: str) -> None:
    r = await client.rollout()
    status, _ = await client.send("POST", f"{r.base}/v1/chat/completions", r.agent_key, CHAT)
    assert status == 200
    await client.admin(
        "POST", f"/api/rollouts/{r.id}/{end}", {"status": "succeeded"} if end == "finish" else {}
    )
    before = await client.state(r.id)
    for method, path, body in [
        ("POST", f"{r.base}/v1/chat/completions", CHAT),
        ("POST", f"{r.base}/events", {"kind": "note"}),
        ("GET", f"{r.base}/task", None),
        ("GET", f"/r/{r.id}/a/new-pod/task", None),  # no attempt on a terminal rollout either
    ]:
        status, got = await client.send(method, path, r.agent_key, body)
        assert (status, got["error"]["type"]) == (403, "forbidden"), (path, got)
    assert await client.state(r.id) == before


# --- reading -----------------------------------------------------------------------------------------------------


async def test_an_agent_key_reads_its_own_task_without_the_metadata_and_nothing_of_another_rollout(
    client: Client,
) -> None:
    mine, other = await client.rollout(), await client.rollout()
    status, task = await client.send("GET", f"{mine.base}/task", mine.agent_key)
    assert status == 200
    assert task["input"] == {"question": "2+3"}
    assert SECRET_ANSWER not in orjson.dumps(task).decode()
    for method, path in [
        ("GET", f"{other.base}/task"),
        ("GET", f"{other.base}/grade"),
        ("GET", f"{mine.base}/grade"),  # the grader's read, with the metadata: not the agent's
        ("GET", f"/api/rollouts/{mine.id}"),
        ("GET", f"/api/rollouts/{mine.id}/events"),
        ("GET", f"/api/rollouts/{other.id}"),
    ]:
        status, got = await client.send(method, path, mine.agent_key)
        assert status == 403, (path, got)
        assert SECRET_ANSWER not in orjson.dumps(got).decode()


async def test_a_grader_key_works_only_for_its_own_running_rollout(client: Client) -> None:
    mine, other = await client.rollout(), await client.rollout()
    status, rollout = await client.send("GET", f"{mine.base}/grade", mine.grader_key)
    assert (status, rollout["metadata"]["answer"]) == (200, SECRET_ANSWER)
    status, _ = await client.send(
        "POST", f"{mine.base}/grade", mine.grader_key, {"kind": "reward", "value": 1.0}
    )
    assert status == 201
    other_before = await client.state(other.id)
    for method, path, body in [
        ("GET", f"{other.base}/grade", None),
        ("POST", f"{other.base}/grade", {"kind": "reward", "value": 1.0}),
        ("POST", f"{mine.base}/events", {"kind": "note"}),
        ("GET", f"{mine.base}/task", None),
        ("POST", f"{mine.base}/v1/chat/completions", CHAT),
        ("GET", f"/api/rollouts/{mine.id}", None),
    ]:
        status, got = await client.send(method, path, mine.grader_key, body)
        assert status == 403, (path, got)
    assert await client.state(other.id) == other_before
    await client.admin("POST", f"/api/rollouts/{mine.id}/finish", {"status": "succeeded"})
    status, _ = await client.send(
        "POST", f"{mine.base}/grade", mine.grader_key, {"kind": "reward", "value": 0.0}
    )
    assert status == 403
    assert (await client.state(mine.id))[0]["reward"] == 1.0


# --- no key in logs, errors, metrics, records or upstream requests ------------------------------------------------


async def test_no_key_shows_in_logs_errors_metrics_records_or_upstream_requests(tmp_path: Path) -> None:
    mock = MockVLLM(("smollm2",))
    async with (
        running_mock(mock) as mock_url,
        gateway_processes() as started,
        aiohttp.ClientSession() as http,
    ):
        write_config(
            tmp_path,
            {"smollm2": [mock_url]},
            aliases={"smollm2": ["claude-haiku-4-5"]},
            chain=DEFAULT_CHAIN,
            addons={"store": {"backend": "sqlite", "path": "keys.db"}},
            extra={"log": {"format": "json", "level": "debug", "access_log": True}},
        )
        gw = await start_gateway(tmp_path / "agl-lite.toml", env={"AGL_KEY": ADMIN_KEY})
        started.append(gw)
        client = Client(http, gw.url)
        mine, other = await client.rollout(), await client.rollout()
        keys = [ADMIN_KEY, mine.agent_key, mine.grader_key, other.agent_key, other.grader_key]
        bodies: list[str] = []

        oa = openai.AsyncOpenAI(base_url=f"{gw.url}{mine.base}/v1", api_key=mine.agent_key, max_retries=0)
        hi: Any = [{"role": "user", "content": "hi"}]
        await oa.chat.completions.create(model="smollm2", messages=hi, max_tokens=4)
        async for _ in await oa.chat.completions.create(
            model="smollm2", messages=hi, max_tokens=4, stream=True
        ):
            pass
        an = anthropic.AsyncAnthropic(base_url=f"{gw.url}{mine.base}", api_key=mine.agent_key, max_retries=0)
        await an.messages.create(
            model="claude-haiku-4-5", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
        )
        await oa.close()
        await an.close()
        # refusals of every kind, each with a real key in a place it does not belong
        attempts = [
            ("POST", f"{other.base}/v1/chat/completions", mine.agent_key, CHAT),
            ("POST", f"{mine.base}/events", mine.agent_key, {"kind": "reward", "value": 1}),
            ("GET", "/api/rollouts", mine.agent_key, None),
            ("GET", f"{other.base}/grade", mine.grader_key, None),
            ("GET", "/api/rollouts", f"{ADMIN_KEY}x", None),
            ("GET", "/api/rollouts", f"agl-agent.{other.id}.{mine.agent_key.rpartition('.')[2]}", None),
            ("POST", "/v1/chat/completions", ADMIN_KEY, {"model": "nope", "messages": []}),
            ("POST", f"{mine.base}/v1/chat/completions", mine.agent_key, b"{not json"),
        ]
        for method, path, key, body in attempts:
            headers = {"Authorization": f"Bearer {key}", "x-api-key": key}
            data = body if isinstance(body, bytes) else orjson.dumps(body) if body is not None else None
            async with http.request(method, gw.url + path, data=data, headers=headers) as r:
                assert r.status >= 400, (path, r.status)
                bodies.append(f"{dict(r.headers)} {await r.text()}")
        async with http.get(gw.url + "/metrics") as r:
            metrics = await r.text()
        calls = await client.admin("GET", f"/api/rollouts/{mine.id}/calls")
        # three answered, and the malformed one that passed auth; the refused ones left no record
        assert sorted(c["outcome"] for c in calls["calls"]) == ["ok", "ok", "ok", "rejected"]
        assert (await client.admin("GET", f"/api/rollouts/{other.id}/calls"))["calls"] == []
        events = await client.admin("GET", f"/api/rollouts/{mine.id}/events")
        assert await gw.stop() == 0
    logs = "\n".join(gw.stderr)
    assert any(rec.get("event") == "flow" for rec in log_records(gw.stderr))  # the access log did run
    upstream = "\n".join(f"{[(str(k), v) for k, v in r.headers.items()]} {r.body}" for r in mock.requests)
    assert len(mock.requests) == 3
    places = {
        "log": logs,
        "error bodies": "\n".join(bodies),
        "metrics": metrics,
        "records": orjson.dumps([calls, events]).decode(),
        "the store file": stored_text(tmp_path / "keys.db"),
        "upstream requests": upstream,
    }
    leaks = {where: found for where, text in places.items() if (found := secrets_in(text, keys))}
    assert leaks == {}
