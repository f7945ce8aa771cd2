from __future__ import annotations

import secrets
from array import array
from collections.abc import AsyncIterator
from dataclasses import dataclass

import openai
import pytest

from agl_lite.addons.tokens import Tokens
from agl_lite.core.contract import derive_key
from agl_lite.core.server import Gateway
from agl_lite.store.records import CallOutcome, ChoiceRecord, LLMCall, RolloutConfig
from agl_lite.store.rules import STORE, RolloutSpec, Store
from agl_lite.testing import MockVLLM, running_mock
from tests.conftest import ADMIN_KEY, GatewayFactory, gateway_url

CHAIN = ("store", "auth", "route", "capture", "tokens", "sink")
MESSAGES = [{"role": "user", "content": "What is 2+3?"}]


def test_call_tokens_prefers_usage_and_falls_back_to_ids() -> None:
    call = LLMCall(
        id="c",
        order_key=1,
        outcome=CallOutcome.OK,
        api="chat",
        usage={"prompt_tokens": 10, "completion_tokens": 4},
    )
    assert call.tokens() == (10, 4)
    cut = LLMCall(
        id="c",
        order_key=1,
        outcome=CallOutcome.CLIENT_DISCONNECTED,
        api="chat",
        prompt_token_ids=array("I", range(7)),
        choices=[ChoiceRecord(0, token_ids=array("I", [1, 2]))],
    )
    assert cut.tokens() == (7, 2)


@dataclass
class Setup:
    gateway: Gateway
    store: Store
    tokens: Tokens

    def agent(self, rollout: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=f"{gateway_url(self.gateway)}/r/{rollout}/a/a1/v1",
            api_key=derive_key(ADMIN_KEY, rollout),
            max_retries=0,
        )


@pytest.fixture
async def setup(gateway_factory: GatewayFactory) -> AsyncIterator[Setup]:
    async with (
        running_mock(MockVLLM()) as url,
        gateway_factory({"smollm2": [url]}, chain=CHAIN, addons={"store": {"backend": "memory"}}) as gw,
    ):
        store = gw.addons.ctx.services.require(STORE, by="test")
        tokens = next(a.addon for a in gw.addons.addons if a.name == "tokens")
        yield Setup(gw, store, tokens)


async def test_usage_is_counted_per_rollout_and_model(setup: Setup) -> None:
    await setup.store.enqueue([RolloutSpec(input=1, id="r1")])
    await setup.store.claim("t", 1)
    agent = setup.agent("r1")
    done = await agent.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=5)  # type: ignore[arg-type]
    assert done.usage is not None
    assert await setup.tokens.used("r1") == done.usage.total_tokens
    again = await agent.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=5)  # type: ignore[arg-type]
    assert again.usage is not None
    assert await setup.tokens.used("r1") == done.usage.total_tokens + again.usage.total_tokens


async def test_spent_budget_gets_429_before_the_upstream(setup: Setup) -> None:
    await setup.store.enqueue([RolloutSpec(input=1, id="r1", config=RolloutConfig(token_budget=20))])
    await setup.store.claim("t", 1)
    agent = setup.agent("r1")
    await agent.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=5)  # type: ignore[arg-type]
    calls_before = await setup.store.calls("r1")
    events_before = await setup.store.events("r1")
    for _ in range(20):  # an agent that retries in a loop
        with pytest.raises(openai.RateLimitError, match="token budget"):
            await agent.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=5)  # type: ignore[arg-type]
    # Issue #15: each refusal was a call row and an event (27k rows in 6 s for one rollout); they are counted
    # (the metrics' 4xx), not stored one by one.
    assert await setup.store.calls("r1") == calls_before
    assert await setup.store.events("r1") == events_before


async def test_totals_survive_a_restart_of_the_accounting(setup: Setup) -> None:
    await setup.store.enqueue([RolloutSpec(input=1, id="r1")])
    await setup.store.claim("t", 1)
    done = await setup.agent("r1").chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=5)  # type: ignore[arg-type]
    fresh = Tokens()
    fresh.store, fresh.options = setup.store, Tokens.Options()
    assert done.usage is not None
    assert await fresh.used("r1") == done.usage.total_tokens


async def test_a_rollout_over_its_storage_quota_gets_507_before_the_upstream_and_no_record(
    setup: Setup,
) -> None:
    await setup.store.enqueue([RolloutSpec(input=1, id="r1")])
    await setup.store.claim("t", 1)
    agent = setup.agent("r1")
    await agent.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=5)  # type: ignore[arg-type]
    setup.store.max_rollout_bytes = await setup.store.rollout_bytes("r1")  # used up
    calls_before = await setup.store.calls("r1")
    with pytest.raises(openai.APIStatusError) as refused:
        await agent.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=5)  # type: ignore[arg-type]
    assert (refused.value.status_code, refused.value.response.json()["error"]["type"]) == (
        507,
        "quota_exceeded",
    )
    assert await setup.store.calls("r1") == calls_before


async def test_a_failed_call_does_not_keep_a_large_request(setup: Setup) -> None:
    # Issue #15 M4: a failed call kept its whole request (up to 64 MiB), again and again.
    await setup.store.enqueue([RolloutSpec(input=1, id="r1")])
    await setup.store.claim("t", 1)
    big = [{"role": "user", "content": secrets.token_hex(100_000)}]
    with pytest.raises(openai.BadRequestError):  # the mock vLLM refuses it: too long for the model
        await setup.agent("r1").chat.completions.create(model="smollm2", messages=big, max_tokens=5)  # type: ignore[arg-type]
    (call,) = await setup.store.calls("r1")
    assert call.outcome is CallOutcome.UPSTREAM_ERROR
    assert call.request["bytes"] > 200_000
    assert "omitted" in call.request
