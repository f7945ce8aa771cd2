"""The sink at the commit point: a call whose record cannot be committed never looks complete to its client
(issue #15 H3), and the gateway recovers by itself once the store can write again.

The store is a real SQLite file made unable to write the way SQLite itself reports it: `max_page_count` gives
SQLITE_FULL ("database or disk is full") exactly as a full disk does, `query_only` gives SQLITE_READONLY.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import aiohttp
import anthropic
import openai
import pytest

from agl_lite.addons import DEFAULT_CHAIN
from agl_lite.core.contract import derive_key
from agl_lite.core.flow import Flow
from agl_lite.core.server import Gateway
from agl_lite.store.records import LLMCall
from agl_lite.store.rules import STORE, RolloutSpec
from agl_lite.store.sqlite import SQLiteStore
from agl_lite.testing import MockVLLM, running_mock
from tests.conftest import ADMIN_KEY, GatewayFactory, gateway_url

# Long enough that its record (token ids included) needs new pages of the database: a short one could fit in the
# free space of a page it shares, full disk or not.
MESSAGES = [{"role": "user", "content": "What is 2+3? " + secrets.token_hex(800)}]


@dataclass
class Setup:
    gateway: Gateway
    store: SQLiteStore

    @property
    def base(self) -> str:
        return f"{gateway_url(self.gateway)}/r/r1/a/a1"

    @property
    def key(self) -> str:
        return derive_key(ADMIN_KEY, "r1")

    def openai(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.base + "/v1", api_key=self.key, max_retries=0)

    def anthropic(self) -> anthropic.AsyncAnthropic:
        return anthropic.AsyncAnthropic(base_url=self.base, api_key=self.key, max_retries=0)

    @contextmanager
    def full(self, how: str = "full") -> Iterator[None]:
        """The store's database cannot grow (`full`) or cannot be written at all (`readonly`)."""
        conn = self.store._conn
        if how == "full":
            conn.execute(
                "VACUUM"
            )  # no free pages left to reuse: a record that needs a new page cannot have one
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
            conn.execute(f"PRAGMA max_page_count = {pages}")
        else:
            conn.execute("PRAGMA query_only = ON")
        try:
            yield
        finally:
            conn.execute("PRAGMA max_page_count = 4294967294")
            conn.execute("PRAGMA query_only = OFF")

    async def calls(self) -> int:
        return len(await self.store.calls("r1"))


@pytest.fixture
async def setup(gateway_factory: GatewayFactory) -> AsyncIterator[Setup]:
    async with (
        running_mock(MockVLLM()) as url,
        gateway_factory(
            {"smollm2": [url]}, chain=DEFAULT_CHAIN, addons={"store": {"backend": "sqlite"}}
        ) as gw,
    ):
        store = gw.addons.ctx.services.require(STORE, by="test")
        assert isinstance(store, SQLiteStore)
        await store.enqueue([RolloutSpec(input=1, id="r1")])
        await store.claim("t", 1)
        yield Setup(gw, store)


async def test_a_plain_call_the_store_cannot_commit_answers_507_and_the_gateway_recovers(
    setup: Setup,
) -> None:
    agent = setup.openai()
    with setup.full(), pytest.raises(openai.APIStatusError) as refused:
        await agent.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=4)  # type: ignore[arg-type]
    assert refused.value.status_code == 507
    assert refused.value.response.headers["Retry-After"].isdigit()
    assert refused.value.response.json()["error"]["type"] == "insufficient_storage"
    assert await setup.calls() == 0
    done = await agent.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=4)  # type: ignore[arg-type]
    assert done.choices[0].message.content
    assert await setup.calls() == 1


@pytest.mark.parametrize("how", ["full", "readonly"])
async def test_a_stream_the_store_cannot_commit_ends_with_an_error_event_not_done(
    setup: Setup, how: str
) -> None:
    body = {"model": "smollm2", "messages": MESSAGES, "max_tokens": 4, "stream": True}
    headers = {"Authorization": f"Bearer {setup.key}"}
    async with aiohttp.ClientSession() as s:
        with setup.full(how):
            async with s.post(setup.base + "/v1/chat/completions", json=body, headers=headers) as r:
                raw = await r.read()
        events = [e.removeprefix(b"data: ") for e in raw.split(b"\n\n") if e]
        assert b"[DONE]" not in events
        error = json.loads(events[-1])["error"]
        assert (error["code"], error["type"]) == (
            (507, "insufficient_storage") if how == "full" else (503, "service_unavailable")
        )
        assert await setup.calls() == 0
        async with s.post(setup.base + "/v1/chat/completions", json=body, headers=headers) as r:
            assert (await r.read()).endswith(b"data: [DONE]\n\n")
    assert await setup.calls() == 1


async def test_the_openai_sdk_raises_for_a_stream_whose_record_was_not_committed(setup: Setup) -> None:
    agent = setup.openai()
    with setup.full():
        stream = await agent.chat.completions.create(
            model="smollm2",
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=4,
            stream=True,
        )
        with pytest.raises(openai.APIError, match="disk is full"):
            async for _ in stream:
                pass


async def test_an_anthropic_stream_whose_record_was_not_committed_ends_with_an_error_not_message_stop(
    setup: Setup,
) -> None:
    client = setup.anthropic()
    with setup.full():
        with pytest.raises(anthropic.APIStatusError, match="disk is full"):
            async with client.messages.stream(
                model="smollm2",
                max_tokens=4,
                messages=MESSAGES,  # type: ignore[arg-type]
            ) as stream:
                await stream.get_final_message()
        with pytest.raises(anthropic.APIStatusError) as refused:
            await client.messages.create(model="smollm2", max_tokens=4, messages=MESSAGES)  # type: ignore[arg-type]
        assert refused.value.status_code == 507
    assert (await client.messages.create(model="smollm2", max_tokens=4, messages=MESSAGES)).content  # type: ignore[arg-type]
    assert await setup.calls() == 1


async def test_the_store_api_answers_507_with_retry_after_when_the_disk_is_full(setup: Setup) -> None:
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    event = {"events": [{"kind": "note", "data": secrets.token_hex(50_000)}]}
    url = f"{gateway_url(setup.gateway)}/api/rollouts/r1/events"
    async with aiohttp.ClientSession() as s:
        with setup.full():
            async with s.post(url, json=event, headers=headers) as r:
                assert r.status == 507
                assert r.headers["Retry-After"].isdigit()
                assert (await r.json())["error"]["type"] == "insufficient_storage"
        async with s.post(url, json=event, headers=headers) as r:
            assert r.status == 201, await r.text()


class Labeller:
    """An addon of a user's: labels each captured call with the tool its request offers (before the sink)."""

    after = {"capture": "it labels the record capture builds"}

    def response_end(self, flow: Flow) -> None:
        record = flow.metadata.get("capture.record")
        if isinstance(record, LLMCall):
            tools = (flow.request.json_object() or {}).get("tools") or [{"function": {"name": "none"}}]
            record.labels["tool"] = tools[0]["function"]["name"]


async def test_labels_an_addon_sets_are_committed_and_filter_the_calls_api(
    gateway_factory: GatewayFactory,
) -> None:
    search = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
    async with (
        running_mock(MockVLLM()) as url,
        gateway_factory({"smollm2": [url]}, chain=DEFAULT_CHAIN, extra_addons=[Labeller()]) as gw,
        aiohttp.ClientSession() as http,
    ):
        store = gw.addons.ctx.services.require(STORE, by="test")
        await store.enqueue([RolloutSpec(input=1, id="r1")])
        await store.claim("t", 1)
        base = f"{gateway_url(gw)}/r/r1/a/a1/v1"
        sdk = openai.AsyncOpenAI(base_url=base, api_key=derive_key(ADMIN_KEY, "r1"), max_retries=0)
        for tools in (search, None, search):
            extra = {"tools": tools} if tools else {}
            await sdk.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=4, **extra)  # type: ignore[call-overload]
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        calls_url = f"{gateway_url(gw)}/api/rollouts/r1/calls"
        async with http.get(calls_url, headers=admin, params={"label": "tool:search"}) as r:
            assert r.status == 200
            page = await r.json()
        assert [c["labels"] for c in page["calls"]] == [{"tool": "search"}, {"tool": "search"}]
        assert [c.labels["tool"] for c in await store.calls("r1")] == ["search", "none", "search"]
        for bad in ("tool", 'to"ol:x'):
            async with http.get(calls_url, headers=admin, params={"label": bad}) as r:
                assert r.status == 400
                assert (await r.json())["error"]["type"] == "invalid_request"
