"""The real anthropic SDK (sync and async, whole and streamed, tools) through the gateway to the mock vLLM.

Every answer is validated with the SDK's own models (not only constructed), and every captured record holds the
token ids the mock produces for the chat request the gateway sent it (asked again directly, the mock being
deterministic), so Claude-Code-style trajectories keep exact ids.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import anthropic
import pytest
from anthropic.types import Message, MessageTokensCount, ModelInfo, RawMessageStreamEvent
from pydantic import TypeAdapter

from agl_lite.core.contract import derive_key
from agl_lite.core.server import Gateway
from agl_lite.store.records import CallOutcome, LLMCall
from agl_lite.testing import MockVLLM, Scenario, ToolCallSpec, running_mock
from agl_lite.testing.addons import FlowRecorder
from tests.conftest import ADMIN_KEY, GatewayFactory, gateway_url

MODEL = "claude-haiku-4-5"  # Claude Code's small/fast model name, routed to the mock by an alias
ADD = {
    "name": "add",
    "description": "Add two integers.",
    "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
}
QUESTION = [{"role": "user", "content": "What is 2+3?"}]
EVENTS: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)


@dataclass
class Setup:
    mock: MockVLLM
    mock_url: str
    gateway: Gateway
    probe: FlowRecorder

    def client(self, prefix: str = "", key: str = ADMIN_KEY) -> anthropic.AsyncAnthropic:
        return anthropic.AsyncAnthropic(
            base_url=gateway_url(self.gateway) + prefix, api_key=key, max_retries=0
        )

    async def mock_ids(self, rec: LLMCall) -> tuple[list[int], list[int]]:
        """(prompt ids, completion ids) the mock gives for the chat request the gateway sent, asked directly."""
        body = {**rec.upstream_request, "model": rec.served_model, "stream": False, "return_token_ids": True}
        body.pop("stream_options", None)
        async with aiohttp.ClientSession() as s, s.post(self.mock_url + "/chat/completions", json=body) as r:
            answer = await r.json()
        return answer["prompt_token_ids"], answer["choices"][0]["token_ids"]


@pytest.fixture
async def setup(gateway_factory: GatewayFactory) -> AsyncIterator[Setup]:
    mock, probe = MockVLLM(("smollm2",), seed=11), FlowRecorder()
    async with (
        running_mock(mock) as url,
        gateway_factory(
            {"smollm2": [url]},
            aliases={"smollm2": [MODEL]},
            chain=("auth", "route", "anthropic", "capture"),
            extra_addons=[probe],
        ) as gw,
    ):
        yield Setup(mock, url, gw, probe)


async def assert_ids_are_the_mocks(s: Setup, rec: LLMCall) -> None:
    prompt, completion = await s.mock_ids(rec)
    assert rec.prompt_token_ids is not None
    assert rec.prompt_token_ids.tolist() == prompt
    assert rec.choices[0].token_ids.tolist() == completion
    assert (rec.outcome, rec.complete) == (CallOutcome.OK, True)


async def test_async_create_validates_and_its_record_has_the_mocks_ids(setup: Setup) -> None:
    raw = await setup.client().messages.with_raw_response.create(
        model=MODEL, max_tokens=40, messages=QUESTION
    )
    message = Message.model_validate(json.loads(raw.http_response.content))
    assert message.id.startswith("msg_")
    assert message.stop_reason == "end_turn"
    assert message.content[0].type == "text"
    rec = await setup.probe.record(1)
    await assert_ids_are_the_mocks(setup, rec)
    assert (rec.api, rec.client_id, rec.requested_model, rec.stream) == ("messages", message.id, MODEL, False)
    assert rec.client_response == json.loads(raw.http_response.content)
    assert message.usage.output_tokens == len(rec.choices[0].token_ids)


async def test_stream_helper_final_message_validates_and_its_record_has_the_mocks_ids(setup: Setup) -> None:
    async with setup.client().messages.stream(model=MODEL, max_tokens=40, messages=QUESTION) as stream:
        async for event in stream:
            if event.type in ("message_start", "content_block_start", "content_block_delta", "message_delta"):
                EVENTS.validate_python(event.to_dict())
        final = await stream.get_final_message()
    message = Message.model_validate(final.to_dict())
    rec = await setup.probe.record(1)
    await assert_ids_are_the_mocks(setup, rec)
    assert rec.stream is True
    assert rec.client_id == message.id
    assert rec.client_response is not None
    assert rec.client_response["content"] == [b.to_dict() for b in message.content if b.type == "text"]
    assert (message.usage.input_tokens, message.usage.output_tokens) == (
        len(rec.prompt_token_ids or ()),
        len(rec.choices[0].token_ids),
    )


async def test_sync_client_whole_and_streamed(setup: Setup) -> None:
    setup.mock.enqueue(Scenario(content="The answer is 5."), times=2)
    client = anthropic.Anthropic(base_url=gateway_url(setup.gateway), api_key=ADMIN_KEY, max_retries=0)

    def run() -> tuple[Message, Message]:
        whole = client.messages.create(model=MODEL, max_tokens=40, messages=QUESTION)  # type: ignore[arg-type]
        with client.messages.stream(model=MODEL, max_tokens=40, messages=QUESTION) as stream:  # type: ignore[arg-type]
            streamed = stream.get_final_message()
        return whole, streamed

    # The sync SDK blocks, and the gateway runs on this event loop: call it from a thread.
    whole, streamed = await asyncio.to_thread(run)
    for message in (whole, streamed):
        Message.model_validate(message.to_dict())
        assert message.content[0].to_dict() == {"type": "text", "text": "The answer is 5."}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_tool_use_round_trip_keeps_exact_ids_across_turns(setup: Setup, stream: bool) -> None:
    # The call where the user spoke last (also when asked again directly) is a tool call; after the result, text.
    def asked_by_user(body: dict[str, Any]) -> bool:
        return bool(body["messages"][-1]["role"] == "user")

    setup.mock.enqueue(
        Scenario(tool_call=ToolCallSpec("add", {"a": 2, "b": 3})), when=asked_by_user, times=None
    )
    client = setup.client()
    kwargs: dict[str, Any] = {"model": MODEL, "max_tokens": 200, "tools": [ADD]}
    if stream:
        async with client.messages.stream(messages=QUESTION, **kwargs) as s:
            first = await s.get_final_message()
    else:
        first = await client.messages.create(messages=QUESTION, **kwargs)
    Message.model_validate(first.to_dict())
    assert first.stop_reason == "tool_use"
    (call,) = [b for b in first.content if b.type == "tool_use"]
    assert (call.name, call.input) == ("add", {"a": 2, "b": 3})
    turn = [
        *QUESTION,
        {"role": "assistant", "content": [b.to_dict() for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "5"}]},
    ]
    second = await client.messages.create(messages=turn, **kwargs)
    Message.model_validate(second.to_dict())
    assert second.stop_reason == "end_turn"
    one, two = await setup.probe.record(1), await setup.probe.record(2)
    await assert_ids_are_the_mocks(setup, one)
    await assert_ids_are_the_mocks(setup, two)
    assert two.upstream_request["messages"][-1] == {"role": "tool", "tool_call_id": call.id, "content": "5"}
    # The tool_result turn's prompt starts with the first call's prompt and completion, token for token: the
    # trajectory stays one sequence for training.
    assert one.prompt_token_ids is not None
    assert two.prompt_token_ids is not None
    sequence = one.prompt_token_ids.tolist() + one.choices[0].token_ids.tolist()
    assert two.prompt_token_ids.tolist()[: len(sequence)] == sequence


async def test_beta_messages_and_count_tokens_agree_with_the_prompt_the_mock_sees(setup: Setup) -> None:
    client = setup.client()
    message = await client.beta.messages.create(
        model=MODEL, max_tokens=20, messages=QUESTION, system="Be brief."
    )
    count = await client.messages.count_tokens(model=MODEL, messages=QUESTION, system="Be brief.")
    MessageTokensCount.model_validate(count.to_dict())
    rec = await setup.probe.record(1)
    assert rec.prompt_token_ids is not None
    assert count.input_tokens == message.usage.input_tokens == len(rec.prompt_token_ids)
    assert [r.path for r in setup.mock.requests] == ["/v1/chat/completions", "/tokenize"]
    assert len(setup.probe.flows) == 2
    assert "capture.record" not in setup.probe.flows[1].metadata  # counting is no generation


async def test_models_list_validates(setup: Setup) -> None:
    page = await setup.client().models.list()
    assert {m.id for m in page.data} == {"smollm2", MODEL}


async def test_models_retrieve_validates(setup: Setup) -> None:
    info = await setup.client().models.retrieve(MODEL)
    ModelInfo.model_validate(info.to_dict())
    assert (info.id, info.type) == (MODEL, "model")
    with pytest.raises(anthropic.NotFoundError) as err:
        await setup.client().models.retrieve("claude-none")
    assert err.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]


async def test_agent_key_on_its_own_rollout_path_and_not_on_another(setup: Setup) -> None:
    key = derive_key(ADMIN_KEY, "ro-1")
    message = await setup.client("/r/ro-1/a/at-1", key).messages.create(
        model=MODEL, max_tokens=8, messages=QUESTION
    )
    assert message.content
    rec = await setup.probe.record(1)
    assert (rec.rollout_id, rec.attempt_id) == ("ro-1", "at-1")
    with pytest.raises(anthropic.PermissionDeniedError) as err:
        await setup.client("/r/ro-2/a/at-1", key).messages.create(
            model=MODEL, max_tokens=8, messages=QUESTION
        )
    assert err.value.body == {
        "type": "error",
        "error": {"type": "permission_error", "message": err.value.body["error"]["message"]},
    }  # type: ignore[index]


async def test_errors_are_anthropic_errors_for_the_sdk(setup: Setup) -> None:
    client = setup.client()
    with pytest.raises(anthropic.NotFoundError, match="not_found_error"):
        await client.messages.create(model="claude-opus-9", max_tokens=8, messages=QUESTION)
    with pytest.raises(anthropic.BadRequestError, match="max_model_len") as upstream:
        await client.messages.create(model=MODEL, max_tokens=4096, messages=QUESTION)  # the mock's is 2048
    assert upstream.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    with pytest.raises(anthropic.AuthenticationError):
        await setup.client(key="not-the-key-0123456789").messages.create(
            model=MODEL, max_tokens=8, messages=QUESTION
        )


async def test_a_mid_stream_upstream_error_reaches_the_sdk_as_an_error_event(setup: Setup) -> None:
    setup.mock.enqueue(Scenario(error_frame_after=3))
    with pytest.raises(anthropic.APIStatusError, match="mock mid-stream failure"):
        async with setup.client().messages.stream(model=MODEL, max_tokens=40, messages=QUESTION) as stream:
            await stream.get_final_message()
    rec = await setup.probe.record(1)
    assert rec.outcome is CallOutcome.UPSTREAM_ERROR
    assert rec.client_response is not None
    assert rec.client_response["stop_reason"] is None  # the client never got a finished message


async def test_a_connection_reset_mid_stream_reaches_the_sdk_as_an_error_event(setup: Setup) -> None:
    """The core's own in-band error (the upstream vanished) goes through the translator like vLLM's: an
    Anthropic client gets `event: error`, not a stream that stops without message_stop."""
    setup.mock.enqueue(Scenario(reset_after=3))
    with pytest.raises(anthropic.APIStatusError) as raised:
        async with setup.client().messages.stream(model=MODEL, max_tokens=40, messages=QUESTION) as stream:
            await stream.get_final_message()
    assert raised.value.body["type"] == "error"  # type: ignore[index]
    rec = await setup.probe.record(1)
    assert rec.outcome is CallOutcome.UPSTREAM_ERROR


async def test_an_unreachable_upstream_is_an_anthropic_error(gateway_factory: GatewayFactory) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    async with gateway_factory(
        {"smollm2": [dead]}, aliases={"smollm2": [MODEL]}, chain=("auth", "route", "anthropic", "capture")
    ) as gw:
        client = anthropic.AsyncAnthropic(base_url=gateway_url(gw), api_key=ADMIN_KEY, max_retries=0)
        with pytest.raises(anthropic.APIStatusError) as raised:
            await client.messages.create(model=MODEL, max_tokens=8, messages=QUESTION)
    assert raised.value.status_code == 502
    body = raised.value.body
    assert isinstance(body, dict)
    assert body["type"] == "error"
    assert body["error"]["type"] == "api_error"
