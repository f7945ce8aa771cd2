"""The real openai SDK's Responses API (`client.responses.create`, streamed and not, `responses.stream`) through the
gateway to the mock vLLM: every body validates against the SDK's own models (it parses them), the streamed and
whole views agree, a function tool round trip works as Codex and the Agents SDK send it (the whole history in
`input`), and each call is captured with the upstream's exact token ids, its Responses view beside it.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import openai
import pytest
from openai.types.responses import Response

from agl_lite.addons import DEFAULT_CHAIN
from agl_lite.core.contract import derive_key
from agl_lite.core.server import Gateway
from agl_lite.store.records import CallOutcome
from agl_lite.store.rules import STORE, RolloutSpec, Store
from agl_lite.testing import MockVLLM, Scenario, ToolCallSpec, running_mock
from agl_lite.testing.addons import FlowRecorder
from tests.conftest import ADMIN_KEY, GatewayFactory, gateway_url

TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "add",
        "description": "Add two numbers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}},
        "strict": False,
    }
]


@dataclass
class Setup:
    mock: MockVLLM
    gateway: Gateway
    probe: FlowRecorder

    @property
    def client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=gateway_url(self.gateway) + "/v1", api_key=ADMIN_KEY, max_retries=0
        )

    @property
    def store(self) -> Store:
        return self.gateway.addons.ctx.services.require(STORE, by="test")


@pytest.fixture
async def setup(gateway_factory: GatewayFactory) -> AsyncIterator[Setup]:
    mock, probe = MockVLLM(("smollm2",), seed=7), FlowRecorder()
    async with (
        running_mock(mock) as url,
        gateway_factory(
            {"smollm2": [url]},
            aliases={"smollm2": ["gpt-5"]},
            chain=DEFAULT_CHAIN,
            addons={"store": {"backend": "memory"}},
            extra_addons=[probe],
        ) as gw,
    ):
        yield Setup(mock, gw, probe)


def text_of(response: Response) -> str:
    return "".join(
        part.text
        for item in response.output
        if item.type == "message"
        for part in item.content
        if part.type == "output_text"
    )


async def test_a_text_answer_whole_and_streamed_is_the_same_response(setup: Setup) -> None:
    setup.mock.enqueue(Scenario(content="Two plus three is five."), times=None)
    kwargs: dict[str, Any] = {"model": "gpt-5", "instructions": "Be brief.", "input": "What is 2+3?"}
    whole = await setup.client.responses.create(**kwargs)
    assert isinstance(whole, Response)
    assert (whole.status, whole.model, text_of(whole)) == ("completed", "gpt-5", "Two plus three is five.")
    assert whole.usage is not None
    assert whole.usage.output_tokens > 0
    assert whole.usage.total_tokens == whole.usage.input_tokens + whole.usage.output_tokens
    rec = await setup.probe.record()
    assert (rec.api, rec.outcome, rec.client_id) == ("responses", CallOutcome.OK, whole.id)
    assert rec.request == kwargs  # the client's own request; the chat one sent upstream beside it
    assert rec.upstream_request["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+3?"},
    ]
    assert rec.client_response["id"] == whole.id
    ids = list(rec.choices[0].token_ids)
    assert len(ids) == whole.usage.output_tokens  # the upstream's exact ids, all of them

    events = []
    async with setup.client.responses.stream(**kwargs) as stream:
        async for event in stream:
            events.append(event.type)
        streamed = await stream.get_final_response()
    assert events[:2] == ["response.created", "response.in_progress"]
    assert events[-1] == "response.completed"
    assert "response.output_text.delta" in events
    assert text_of(streamed) == text_of(whole)
    assert [i.type for i in streamed.output] == [i.type for i in whole.output]
    streamed_rec = await setup.probe.record(2)
    assert streamed_rec.client_id == streamed.id != whole.id
    assert list(streamed_rec.choices[0].token_ids) == ids  # the same answer, the same ids


async def test_a_function_tool_round_trip_with_the_history_in_input(setup: Setup) -> None:
    """As the Agents SDK and Codex do it: the model calls the tool, the client runs it and sends the whole
    conversation back, the call and its output included; the second call's prompt extends the first's."""
    setup.mock.enqueue(Scenario(tool_call=ToolCallSpec("add", {"a": 2, "b": 3})), times=1)
    setup.mock.enqueue(Scenario(content="It is 5."), times=1)
    first = await setup.client.responses.create(model="gpt-5", input="What is 2+3?", tools=TOOLS)
    (call,) = first.output
    assert call.type == "function_call"
    assert (call.name, json.loads(call.arguments)) == ("add", {"a": 2, "b": 3})
    history: list[Any] = [
        {"role": "user", "content": "What is 2+3?"},
        *[item.model_dump(exclude_none=True) for item in first.output],
        {"type": "function_call_output", "call_id": call.call_id, "output": "5"},
    ]
    second = await setup.client.responses.create(model="gpt-5", input=history, tools=TOOLS)
    assert text_of(second) == "It is 5."
    one, two = await setup.probe.record(1), await setup.probe.record(2)
    assert two.upstream_request["messages"][1]["tool_calls"][0]["id"] == call.call_id
    assert two.upstream_request["messages"][2] == {
        "role": "tool",
        "tool_call_id": call.call_id,
        "content": "5",
    }
    prompt_one, prompt_two = list(one.prompt_token_ids or ()), list(two.prompt_token_ids or ())
    assert len(prompt_two) > len(prompt_one)
    assert prompt_two[: len(prompt_one)] == prompt_one


async def test_a_streamed_tool_call_arrives_whole_in_its_done_item(setup: Setup) -> None:
    setup.mock.enqueue(Scenario(tool_call=ToolCallSpec("add", {"a": 2, "b": 3})), times=None)
    async with setup.client.responses.stream(model="gpt-5", input="What is 2+3?", tools=TOOLS) as stream:
        done = [e.item for e in [e async for e in stream] if e.type == "response.output_item.done"]
        final = await stream.get_final_response()
    (item,) = done
    assert item.type == "function_call"
    assert json.loads(item.arguments) == {"a": 2, "b": 3}
    (whole,) = final.output
    assert whole.type == "function_call"
    assert (whole.id, whole.call_id, whole.name, whole.arguments) == (
        item.id,
        item.call_id,
        item.name,
        item.arguments,
    )


async def test_two_calls_in_one_reply_are_two_function_call_items_streamed_and_not(setup: Setup) -> None:
    calls = (ToolCallSpec("add", {"a": 2, "b": 3}), ToolCallSpec("add", {"a": 4, "b": 5}))
    setup.mock.enqueue(Scenario(tool_calls=calls), times=None)
    whole = await setup.client.responses.create(model="gpt-5", input="2+3 and 4+5?", tools=TOOLS)
    async with setup.client.responses.stream(model="gpt-5", input="2+3 and 4+5?", tools=TOOLS) as stream:
        streamed = await stream.get_final_response()
    for response in (whole, streamed):
        items = [i for i in response.output if i.type == "function_call"]
        assert [json.loads(i.arguments) for i in items] == [{"a": 2, "b": 3}, {"a": 4, "b": 5}]
        assert len({i.call_id for i in items}) == 2


async def test_json_schema_output_is_asked_of_the_upstream(setup: Setup) -> None:
    setup.mock.enqueue(Scenario(content='{"answer": 5}'), times=None)
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
    text: Any = {"format": {"type": "json_schema", "name": "sum", "schema": schema, "strict": True}}
    response = await setup.client.responses.create(model="gpt-5", input="2+3?", text=text)
    assert json.loads(text_of(response)) == {"answer": 5}
    rec = await setup.probe.record()
    assert rec.upstream_request["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "sum", "schema": schema, "strict": True},
    }


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "gpt-5", "input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"model": "gpt-5", "input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        ({"model": "gpt-5", "input": "hi", "frobnicate": 1}, "frobnicate"),
        ({"model": "gpt-5", "input": "hi", "previous_response_id": 5}, "previous_response_id"),
        ({"model": "gpt-5"}, "input"),
    ],
)
async def test_what_cannot_be_translated_is_a_400_in_the_responses_shape(
    setup: Setup, body: dict[str, Any], param: str
) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            gateway_url(setup.gateway) + "/v1/responses",
            json=body,
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        ) as resp,
    ):
        assert resp.status == 400
        error = (await resp.json())["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "invalid_request",
        param,
    )
    assert setup.mock.requests == []  # nothing reached the upstream


async def test_an_unknown_model_is_an_error_the_sdk_raises(setup: Setup) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        await setup.client.responses.create(model="nope", input="hi")
    assert "nope" in str(caught.value)


async def test_the_agents_sdk_runs_an_agent_with_a_function_tool_to_its_end(setup: Setup) -> None:
    """The OpenAI Agents SDK (pinned) in its default mode, the Responses API with the whole history resent each
    turn, as a rollout's agent on its own path and key: it calls its tool, gets the result, answers; both calls
    are captured and merge into one training row (the second turn's prompt extends the first's)."""
    import agents

    from agl_lite.integrations.trajectory import merge_trajectories
    from agl_lite.store.triplets import rollout_triplets

    await setup.store.enqueue([RolloutSpec(input={"q": "2+3"}, id="ro-agents")])
    await setup.store.claim("test", 1)
    agents.set_tracing_disabled(True)
    seen: list[tuple[int, int]] = []

    @agents.function_tool
    def add(a: int, b: int) -> str:
        """Add two numbers."""
        seen.append((a, b))
        return str(a + b)

    setup.mock.enqueue(Scenario(tool_call=ToolCallSpec("add", {"a": 2, "b": 3})), times=1)
    setup.mock.enqueue(Scenario(content="2 + 3 = 5."), times=1)
    client = openai.AsyncOpenAI(
        base_url=gateway_url(setup.gateway) + "/r/ro-agents/a/at-1/v1",
        api_key=derive_key(ADMIN_KEY, "ro-agents"),
        max_retries=0,
    )
    model = agents.OpenAIResponsesModel(model="gpt-5", openai_client=client)
    agent = agents.Agent(name="adder", instructions="Use the tool.", tools=[add], model=model)
    result = await agents.Runner.run(agent, "What is 2+3?")
    assert result.final_output == "2 + 3 = 5."
    assert seen == [(2, 3)]
    one, two = await setup.probe.record(1), await setup.probe.record(2)
    assert (one.api, two.api, one.rollout_id, two.attempt_id) == (
        "responses",
        "responses",
        "ro-agents",
        "at-1",
    )
    (row,), stats = merge_trajectories((await rollout_triplets(setup.store, "ro-agents")).triplets)
    assert (len(row.spans), stats.merged_steps) == (2, 1)


async def test_a_previous_response_id_chain_of_three_extends_its_prompts_and_is_served_back(
    setup: Setup,
) -> None:
    """`previous_response_id` continues a conversation from the store: each turn's prompt ids extend the previous
    turn's prompt and answer exactly, the instructions are each response's own, and a stored Response and its input
    items are served back (`responses.retrieve`, `input_items.list`)."""
    for text in ("One.", "Two.", "Three."):
        setup.mock.enqueue(Scenario(content=text), times=1)
    first = await setup.client.responses.create(model="gpt-5", instructions="Count.", input="Start.")
    second = await setup.client.responses.create(
        model="gpt-5", instructions="Count.", input="Go on.", previous_response_id=first.id
    )
    third = await setup.client.responses.create(
        model="gpt-5", instructions="Count.", input="Again.", previous_response_id=second.id
    )
    assert [text_of(r) for r in (first, second, third)] == ["One.", "Two.", "Three."]
    records = [await setup.probe.record(n) for n in (1, 2, 3)]
    assert [r.id for r in records] == [first.id, second.id, third.id]  # stored under their response ids
    for before, after in itertools.pairwise(records):
        grown = list(before.prompt_token_ids or ()) + list(before.choices[0].token_ids)
        assert list(after.prompt_token_ids or ())[: len(grown)] == grown
    assert records[2].upstream_request["messages"] == [
        {"role": "system", "content": "Count."},
        {"role": "user", "content": "Start."},
        {"role": "assistant", "content": "One."},
        {"role": "user", "content": "Go on."},
        {"role": "assistant", "content": "Two."},
        {"role": "user", "content": "Again."},
    ]
    fetched = await setup.client.responses.retrieve(second.id)
    assert (fetched.id, text_of(fetched)) == (second.id, "Two.")
    items = await setup.client.responses.input_items.list(second.id)
    assert [i.type for i in items.data] == ["message"]


async def two_rollouts(setup: Setup) -> Callable[[str], openai.AsyncOpenAI]:
    """Running rollouts `ro-a` and `ro-b` whose calls all answer "Hi.", and a client for either one's agent."""
    await setup.store.enqueue([RolloutSpec(input=1, id="ro-a"), RolloutSpec(input=2, id="ro-b")])
    await setup.store.claim("test", 2)
    setup.mock.enqueue(Scenario(content="Hi."), times=None)

    def agent(rollout: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=f"{gateway_url(setup.gateway)}/r/{rollout}/a/at-1/v1",
            api_key=derive_key(ADMIN_KEY, rollout),
            max_retries=0,
        )

    return agent


async def test_a_response_not_stored_or_of_another_rollout_is_not_found(setup: Setup) -> None:
    agent = await two_rollouts(setup)
    mine = await agent("ro-a").responses.create(model="gpt-5", input="hi")
    assert (await agent("ro-a").responses.retrieve(mine.id)).id == mine.id
    with pytest.raises(openai.NotFoundError):
        await agent("ro-b").responses.retrieve(mine.id)  # another rollout's: as if it did not exist
    with pytest.raises(openai.NotFoundError):
        await agent("ro-b").responses.create(model="gpt-5", input="hi", previous_response_id=mine.id)
    with pytest.raises(openai.NotFoundError):
        await setup.client.responses.create(model="gpt-5", input="hi", previous_response_id="resp_never")
    unstored = await setup.client.responses.create(model="gpt-5", input="hi", store=False)
    with pytest.raises(openai.NotFoundError) as caught:
        await setup.client.responses.retrieve(unstored.id)
    assert caught.value.body["type"] == "invalid_request_error"  # type: ignore[index]
    assert (
        await setup.client.responses.retrieve(mine.id)
    ).id == mine.id  # the admin key sees every rollout's


async def test_a_deleted_response_is_no_longer_served_but_its_call_stays(setup: Setup) -> None:
    """`responses.delete`: the Response is gone for its clients (retrieve, input items, previous_response_id: 404;
    a second delete: 404), another rollout's key cannot delete it, and the captured call stays in the store."""
    agent = await two_rollouts(setup)
    mine = await agent("ro-a").responses.create(model="gpt-5", input="hi")
    with pytest.raises(openai.NotFoundError):
        await agent("ro-b").responses.delete(mine.id)  # another rollout's: as if it did not exist
    async with aiohttp.ClientSession() as http:
        url = f"{gateway_url(setup.gateway)}/r/ro-a/a/at-1/v1/responses/{mine.id}"
        headers = {"Authorization": f"Bearer {derive_key(ADMIN_KEY, 'ro-a')}"}
        async with http.delete(url, headers=headers) as resp:
            assert (resp.status, await resp.json()) == (
                200,
                {"id": mine.id, "object": "response", "deleted": True},
            )
    with pytest.raises(openai.NotFoundError):
        await agent("ro-a").responses.retrieve(mine.id)
    with pytest.raises(openai.NotFoundError):
        await agent("ro-a").responses.input_items.list(mine.id)
    with pytest.raises(openai.NotFoundError):
        await agent("ro-a").responses.create(model="gpt-5", input="again", previous_response_id=mine.id)
    with pytest.raises(openai.NotFoundError):
        await setup.client.responses.delete(mine.id)  # once only, for the admin key too
    assert (await setup.store.response_call(mine.id)).id == mine.id  # the training record stays
    assert not await setup.store.response_deleted("resp_other")
