"""The real openai SDK (sync and async, streamed and not) through the gateway to the mock vLLM.

Each case asks the same question twice, once straight to the mock and once through the gateway: the SDK must
see the same thing both ways (the mock is deterministic), so content, tool calls and n > 1 arrive intact.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import openai
import pytest

from agl_lite.core.contract import derive_key
from agl_lite.core.server import Gateway
from agl_lite.testing import MockVLLM, Scenario, ToolCallSpec, running_mock
from tests.conftest import ADMIN_KEY, GatewayFactory, gateway_url

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            },
        },
    }
]
MESSAGES = [{"role": "user", "content": "What is 2+3?"}]


@dataclass
class Setup:
    mock: MockVLLM
    mock_url: str
    gateway: Gateway


@pytest.fixture
async def setup(gateway_factory: GatewayFactory) -> AsyncIterator[Setup]:
    mock = MockVLLM(("smollm2",), seed=7)
    async with (
        running_mock(mock) as url,
        gateway_factory({"smollm2": [url]}, aliases={"smollm2": ["gpt-4.1"]}) as gw,
    ):
        yield Setup(mock, url, gw)


def clients(s: Setup) -> tuple[openai.AsyncOpenAI, openai.AsyncOpenAI]:
    direct = openai.AsyncOpenAI(base_url=s.mock_url, api_key="unused", max_retries=0)
    via = openai.AsyncOpenAI(base_url=gateway_url(s.gateway) + "/v1", api_key=ADMIN_KEY, max_retries=0)
    return direct, via


def essentials(completion: Any) -> list[dict[str, Any]]:
    """What must survive the trip: per choice, content, tool calls, finish reason."""
    return [
        {
            "index": c.index,
            "content": c.message.content,
            "tool_calls": [(t.id, t.function.name, t.function.arguments) for t in c.message.tool_calls or []],
            "finish_reason": c.finish_reason,
        }
        for c in completion.choices
    ]


async def assemble(stream: Any) -> dict[int, dict[str, Any]]:
    """Join a streamed completion per choice, as an SDK user would."""
    out: dict[int, dict[str, Any]] = {}
    async for chunk in stream:
        for c in chunk.choices:
            acc = out.setdefault(c.index, {"content": "", "tools": {}, "finish_reason": None})
            acc["content"] += c.delta.content or ""
            for t in c.delta.tool_calls or []:
                tool = acc["tools"].setdefault(t.index, {"id": None, "name": "", "arguments": ""})
                tool["id"] = t.id or tool["id"]
                tool["name"] += (t.function.name or "") if t.function else ""
                tool["arguments"] += (t.function.arguments or "") if t.function else ""
            acc["finish_reason"] = c.finish_reason or acc["finish_reason"]
    return out


async def test_async_non_streamed_n2_arrives_intact(setup: Setup) -> None:
    direct, via = clients(setup)
    kwargs: dict[str, Any] = {"messages": MESSAGES, "n": 2, "max_tokens": 12, "seed": 1}
    want = await direct.chat.completions.create(model="smollm2", **kwargs)
    got = await via.chat.completions.create(model="gpt-4.1", **kwargs)
    assert len(got.choices) == 2
    assert essentials(got) == essentials(want)
    assert got.usage == want.usage


async def test_async_streamed_n2_arrives_intact(setup: Setup) -> None:
    direct, via = clients(setup)
    kwargs: dict[str, Any] = {"messages": MESSAGES, "n": 2, "max_tokens": 12, "seed": 1, "stream": True}
    want = await assemble(await direct.chat.completions.create(model="smollm2", **kwargs))
    got = await assemble(await via.chat.completions.create(model="gpt-4.1", **kwargs))
    assert set(got) == {0, 1}
    assert got == want


async def test_tool_call_arrives_intact_streamed_and_not(setup: Setup) -> None:
    direct, via = clients(setup)
    call = ToolCallSpec(name="add", arguments={"a": 2, "b": 3})
    setup.mock.enqueue(Scenario(tool_call=call), times=None)
    kwargs: dict[str, Any] = {"messages": MESSAGES, "tools": TOOLS, "max_tokens": 200}
    plain = await via.chat.completions.create(model="gpt-4.1", **kwargs)
    (tool,) = plain.choices[0].message.tool_calls or []
    assert (tool.function.name, tool.function.arguments) == ("add", '{"a": 2, "b": 3}')
    assert plain.choices[0].finish_reason == "tool_calls"
    want = await assemble(await direct.chat.completions.create(model="smollm2", stream=True, **kwargs))
    got = await assemble(await via.chat.completions.create(model="gpt-4.1", stream=True, **kwargs))
    assert got[0]["tools"][0]["name"] == "add"
    assert [(t["name"], t["arguments"]) for t in got[0]["tools"].values()] == [
        (t["name"], t["arguments"]) for t in want[0]["tools"].values()
    ]


async def test_sync_client_streamed_and_not(setup: Setup) -> None:
    setup.mock.enqueue(Scenario(content="The answer is 5."), times=2)
    client = openai.OpenAI(base_url=gateway_url(setup.gateway) + "/v1", api_key=ADMIN_KEY, max_retries=0)

    def run() -> tuple[str | None, str]:
        plain = client.chat.completions.create(model="gpt-4.1", messages=MESSAGES)  # type: ignore[arg-type]
        stream = client.chat.completions.create(model="gpt-4.1", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        return plain.choices[0].message.content, text

    # The sync SDK blocks, and the gateway runs on this event loop: call it from a thread.
    plain, streamed = await asyncio.to_thread(run)
    assert plain == "The answer is 5."
    assert streamed == "The answer is 5."


async def test_completions_endpoint_streamed_and_not(setup: Setup) -> None:
    direct, via = clients(setup)
    want = await direct.completions.create(model="smollm2", prompt="2+3=", max_tokens=6, seed=3)
    got = await via.completions.create(model="gpt-4.1", prompt="2+3=", max_tokens=6, seed=3)
    assert [c.text for c in got.choices] == [c.text for c in want.choices]
    stream = await via.completions.create(model="gpt-4.1", prompt="2+3=", max_tokens=6, seed=3, stream=True)
    assert "".join([c.choices[0].text async for c in stream if c.choices]) == want.choices[0].text


async def test_agent_key_on_its_rollout_path(setup: Setup) -> None:
    agent = openai.AsyncOpenAI(
        base_url=f"{gateway_url(setup.gateway)}/r/ro-1/a/at-1/v1",
        api_key=derive_key(ADMIN_KEY, "ro-1"),
        max_retries=0,
    )
    completion = await agent.chat.completions.create(model="gpt-4.1", messages=MESSAGES, max_tokens=5)  # type: ignore[arg-type]
    assert completion.choices[0].message.content
    models = await agent.models.list()
    assert {m.id for m in models.data} == {"smollm2", "gpt-4.1"}


async def test_models_retrieve_by_name_alias_and_a_name_with_a_slash(gateway_factory: GatewayFactory) -> None:
    """`models.retrieve` (the SDK percent-encodes a `/`; a raw `/` as older clients send it works too)."""
    mock = MockVLLM(("smollm2",), seed=7)
    async with (
        running_mock(mock) as url,
        gateway_factory({"Qwen/Qwen2.5-0.5B": [url]}, aliases={"Qwen/Qwen2.5-0.5B": ["gpt-4.1"]}) as gw,
    ):
        admin = openai.AsyncOpenAI(base_url=gateway_url(gw) + "/v1", api_key=ADMIN_KEY, max_retries=0)
        agent = openai.AsyncOpenAI(
            base_url=f"{gateway_url(gw)}/r/ro-1/a/at-1/v1",
            api_key=derive_key(ADMIN_KEY, "ro-1"),
            max_retries=0,
        )
        for client in (admin, agent):
            model = await client.models.retrieve("Qwen/Qwen2.5-0.5B")
            assert (model.id, model.object, model.owned_by) == ("Qwen/Qwen2.5-0.5B", "model", "agl-lite")
            assert (await client.models.retrieve("gpt-4.1")).id == "gpt-4.1"
            with pytest.raises(openai.NotFoundError, match="not routed here"):
                await client.models.retrieve("gpt-5")
        async with (
            aiohttp.ClientSession() as s,
            s.get(
                gateway_url(gw) + "/v1/models/Qwen/Qwen2.5-0.5B",
                headers={"Authorization": f"Bearer {ADMIN_KEY}"},
            ) as r,
        ):
            assert (r.status, (await r.json())["id"]) == (200, "Qwen/Qwen2.5-0.5B")


async def test_agent_key_on_another_rollout_is_forbidden(setup: Setup) -> None:
    agent = openai.AsyncOpenAI(
        base_url=f"{gateway_url(setup.gateway)}/r/ro-2/a/at-1/v1",
        api_key=derive_key(ADMIN_KEY, "ro-1"),
        max_retries=0,
    )
    with pytest.raises(openai.PermissionDeniedError):
        await agent.chat.completions.create(model="gpt-4.1", messages=MESSAGES)  # type: ignore[arg-type]


async def test_unknown_model_is_a_not_found_error_for_the_sdk(setup: Setup) -> None:
    _, via = clients(setup)
    with pytest.raises(openai.NotFoundError, match="known models"):
        await via.chat.completions.create(model="gpt-5", messages=MESSAGES)  # type: ignore[arg-type]


async def test_upstream_error_status_and_body_are_relayed(setup: Setup) -> None:
    _, via = clients(setup)
    with pytest.raises(openai.BadRequestError, match="max_model_len"):
        await via.chat.completions.create(model="gpt-4.1", messages=MESSAGES, max_tokens=100_000)  # type: ignore[arg-type]


async def test_mid_stream_error_frame_reaches_the_sdk(setup: Setup) -> None:
    _, via = clients(setup)
    setup.mock.enqueue(Scenario(error_frame_after=3))
    stream = await via.chat.completions.create(model="gpt-4.1", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
    with pytest.raises(openai.APIError):
        async for _ in stream:
            pass


async def test_upstream_reset_mid_stream_ends_the_sdk_stream_with_an_error(setup: Setup) -> None:
    _, via = clients(setup)
    setup.mock.enqueue(Scenario(reset_after=3))
    stream = await via.chat.completions.create(model="gpt-4.1", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
    with pytest.raises(openai.APIError, match="failed mid-response"):
        async for _ in stream:
            pass


async def test_client_disconnect_closes_the_stream_on_the_mock(setup: Setup) -> None:
    _, via = clients(setup)
    setup.mock.enqueue(Scenario(stall_after=2))
    stream = await via.chat.completions.create(model="gpt-4.1", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
    async for _ in stream:
        break
    await setup.mock.wait_until(lambda m: m.open_streams == 1 and m.stalled_streams == 1)
    await stream.close()
    await setup.mock.wait_until(lambda m: m.open_streams == 0 and m.peer_disconnects == 1)


async def test_upstream_silent_past_read_timeout_ends_the_stream_with_a_timeout_error(
    gateway_factory: GatewayFactory,
) -> None:
    mock = MockVLLM(("smollm2",))
    mock.enqueue(Scenario(stall_after=2))
    async with (
        running_mock(mock) as url,
        gateway_factory({"smollm2": [url]}, extra={"upstream": {"read_timeout": 0.5}}) as gw,
    ):
        via = openai.AsyncOpenAI(base_url=gateway_url(gw) + "/v1", api_key=ADMIN_KEY, max_retries=0)
        stream = await via.chat.completions.create(model="smollm2", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
        with pytest.raises(openai.APIError, match="timed out mid-response"):
            async for _ in stream:
                pass
        await mock.wait_until(lambda m: m.open_streams == 0)
