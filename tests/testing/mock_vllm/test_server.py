"""The mock vLLM server: wire conformance with real vLLM 0.32 captures, determinism, scenarios and fault modes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

from agl_lite.testing.mock_vllm import MockVLLM, running_mock
from agl_lite.testing.mock_vllm.scenario import ErrorReply, Scenario, ToolCallSpec

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "vllm-0.32-cpu"
"""Raw responses of a real vLLM 0.32 (see the README there), kept in the repository so the suite is self-contained."""

MSG: list[ChatCompletionMessageParam] = [{"role": "user", "content": "What is 2+3? Answer with the number."}]
TOOL_MSG: list[ChatCompletionMessageParam] = [{"role": "user", "content": "What is 2+3? Use the add tool."}]
ADD_TOOL: ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
# The real model ran out of its 40 tokens inside the arguments; a verbose call makes the mock do the same.
VERBOSE_ADD = Scenario(
    tool_call=ToolCallSpec("add", {"a": 2, "b": 3, "note": "adding two small numbers together for the user"})
)
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
IDS = {"return_token_ids": True}
FORCED = {"tools": [ADD_TOOL], "tool_choice": {"type": "function", "function": {"name": "add"}}}
REQUIRED = {"tools": [ADD_TOOL], "tool_choice": "required"}
USAGE = {"stream": True, "stream_options": {"include_usage": True}}

# file -> (path, request body, scenario), parsed from the fixtures README's table
CASES: dict[str, tuple[str, dict[str, Any], Scenario | None]] = {
    "chat-nonstream-n2-ids-logprobs.json": (
        CHAT,
        {"messages": MSG, "n": 2, **IDS, "logprobs": True, "top_logprobs": 2, "max_tokens": 12},
        None,
    ),
    "chat-stream-ids-logprobs-usage.sse": (
        CHAT,
        {"messages": MSG, **IDS, "logprobs": True, **USAGE, "max_tokens": 8},
        None,
    ),
    "chat-stream-plain.sse": (CHAT, {"messages": MSG, "stream": True, "max_tokens": 8}, None),
    "chat-stream-tools-ids.sse": (CHAT, {"messages": MSG, "tools": [ADD_TOOL], **IDS, "stream": True}, None),
    "chat-nonstream-forced-tool-ids.json": (
        CHAT,
        {"messages": TOOL_MSG, **FORCED, **IDS, "max_tokens": 40},
        VERBOSE_ADD,
    ),
    "chat-stream-forced-tool-ids.sse": (
        CHAT,
        {"messages": TOOL_MSG, **FORCED, **IDS, "stream": True, "max_tokens": 40},
        VERBOSE_ADD,
    ),
    "completions-nonstream-ids.json": (
        COMPLETIONS,
        {"prompt": "2+3=", **IDS, "logprobs": 1, "max_tokens": 6},
        None,
    ),
    "completions-stream-ids.sse": (
        COMPLETIONS,
        {"prompt": "2+3=", **IDS, "stream": True, "max_tokens": 6},
        None,
    ),
    "chat-stream-n2-ids-logprobs-usage.sse": (
        CHAT,
        {"messages": MSG, "n": 2, **IDS, "logprobs": True, **USAGE, "max_tokens": 6},
        None,
    ),
    "chat-stream-required-tool-ids-logprobs.sse": (
        CHAT,
        {"messages": TOOL_MSG, **REQUIRED, **IDS, "logprobs": True, "stream": True, "max_tokens": 40},
        VERBOSE_ADD,
    ),
    "chat-nonstream-required-tool-ids.json": (
        CHAT,
        {"messages": TOOL_MSG, **REQUIRED, **IDS, "max_tokens": 40},
        VERBOSE_ADD,
    ),
    "multiturn-two-calls.json": ("multiturn", {}, None),
    "tokenize-messages.json": (
        "/tokenize",
        {"model": "smollm2", "messages": MSG, "add_generation_prompt": True},
        None,
    ),
    "error-unknown-model.json": (CHAT, {"model": "nope", "messages": MSG}, None),
    "error-too-long.json": (CHAT, {"messages": MSG, "max_tokens": 4000}, None),
}


# -- helpers --------------------------------------------------------------------------------------------------


def shape(value: Any, key: str | None = None) -> Any:
    """Field placement without values: key structure, null vs present, JSON type; lists by their elements' shapes."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "str"
    if isinstance(value, list):
        return ["list", *_distinct(shape(v, key) for v in value)]
    if key == "top_logprobs" and "token" not in value:  # completions: a token -> logprob map, keys are data
        return ["map", *_distinct(shape(v) for v in value.values())]
    return {k: shape(v, k) for k, v in value.items()}


def _distinct(shapes: Any) -> list[Any]:
    unique = {json.dumps(s, sort_keys=True): s for s in shapes}
    return [unique[k] for k in sorted(unique)]


def sse_events(raw: str) -> list[Any]:
    assert raw.endswith("\n\n"), "a stream ends with a blank line"
    events = []
    for block in raw.split("\n\n")[:-1]:
        assert block.startswith("data: "), block
        data = block[len("data: ") :]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


def sse_shape(events: list[Any]) -> dict[str, Any]:
    content = [i for i, e in enumerate(events) if isinstance(e, dict) and e.get("choices")]
    usage = [e for e in events if isinstance(e, dict) and e.get("choices") == [] and "usage" in e]
    return {
        "first": shape(events[0]),
        "middle": _distinct(shape(events[i]) for i in content[1:-1]),
        "last_content": shape(events[content[-1]]),
        "usage": [shape(u) for u in usage],
        "done_last": events[-1] == "[DONE]",
    }


def content_of(events: list[Any], index: int = 0) -> str:
    return "".join(
        c["delta"].get("content") or ""
        for e in events
        if isinstance(e, dict)
        for c in e.get("choices", [])
        if c["index"] == index
    )


async def next_event(resp: aiohttp.ClientResponse) -> Any:
    """The next SSE data payload, read line by line as it arrives."""
    while True:
        line = (await resp.content.readline()).decode()
        assert line, "stream ended"
        if line.startswith("data: "):
            data = line[len("data: ") :].rstrip("\n")
            await resp.content.readline()
            return data if data == "[DONE]" else json.loads(data)


@pytest.fixture
def mock() -> MockVLLM:
    return MockVLLM(("smollm2",), seed=0, max_model_len=2048)


@pytest.fixture
async def base(mock: MockVLLM) -> AsyncIterator[str]:
    async with running_mock(mock) as url:
        yield url.removesuffix("/v1")


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
async def client(base: str) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0) as c:
        yield c


async def post(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Any:
    async with http.post(url, json={"model": "smollm2", **body}) as resp:
        text = await resp.text()
        return sse_events(text) if resp.content_type == "text/event-stream" else json.loads(text)


async def chat(http: aiohttp.ClientSession, base: str, **body: Any) -> Any:
    return await post(http, base + CHAT, body)


# -- conformance with the real captures -----------------------------------------------------------------------


def test_conformance_table_covers_every_fixture_file() -> None:
    assert {p.name for p in FIXTURES.iterdir() if p.suffix in (".json", ".sse")} == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
async def test_mock_matches_fixture_field_placement(
    name: str, mock: MockVLLM, base: str, http: aiohttp.ClientSession
) -> None:
    path, body, scenario = CASES[name]
    if scenario is not None:
        mock.enqueue(scenario)
    if path == "multiturn":
        turn1 = await chat(http, base, messages=MSG, **IDS)
        again = [*MSG, {"role": "assistant", "content": turn1["choices"][0]["message"]["content"]}]
        again.append({"role": "user", "content": "Now add 4."})
        got: Any = {
            "turn1": turn1,
            "turn2_request_messages": again,
            "turn2": await chat(http, base, messages=again, **IDS),
        }
    else:
        got = await post(http, base + path, body)
    raw = (FIXTURES / name).read_text()
    if name.endswith(".sse"):
        assert sse_shape(got) == sse_shape(sse_events(raw))
    else:
        assert shape(got) == shape(json.loads(raw))


async def test_streams_are_framed_like_vllm(base: str, http: aiohttp.ClientSession) -> None:
    async with http.post(base + CHAT, json={"model": "smollm2", "messages": MSG, "stream": True}) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        raw = await resp.text()
    assert raw.startswith('data: {"id":"chatcmpl-')
    assert raw.endswith("data: [DONE]\n\n")


# -- determinism and sampling knobs ---------------------------------------------------------------------------


async def test_same_seed_and_prompt_give_the_same_reply(base: str, http: aiohttp.ClientSession) -> None:
    first = await chat(http, base, messages=MSG, **IDS)
    second = await chat(http, base, messages=MSG, **IDS)
    assert first["choices"][0]["token_ids"] == second["choices"][0]["token_ids"]
    assert first["id"] != second["id"]


async def test_request_seed_changes_the_reply(base: str, http: aiohttp.ClientSession) -> None:
    a = await chat(http, base, messages=MSG, seed=1)
    b = await chat(http, base, messages=MSG, seed=2)
    assert a["choices"][0]["message"]["content"] != b["choices"][0]["message"]["content"]


async def test_mock_seed_changes_the_reply(http: aiohttp.ClientSession) -> None:
    replies = []
    for seed in (0, 1):
        async with running_mock(MockVLLM(seed=seed)) as url:
            replies.append((await post(http, url + "/chat/completions", {"messages": MSG}))["choices"][0])
    assert replies[0]["message"]["content"] != replies[1]["message"]["content"]


async def test_finished_reply_ends_with_eos_id(base: str, http: aiohttp.ClientSession) -> None:
    choice = (await chat(http, base, messages=MSG, **IDS))["choices"][0]
    assert (choice["finish_reason"], choice["token_ids"][-1]) == ("stop", 2)


async def test_max_tokens_cuts_the_reply_with_length(base: str, http: aiohttp.ClientSession) -> None:
    body = await chat(http, base, messages=MSG, max_tokens=3, **IDS)
    assert body["choices"][0]["finish_reason"] == "length"
    assert len(body["choices"][0]["token_ids"]) == body["usage"]["completion_tokens"] == 3


async def test_stop_string_cuts_the_reply(mock: MockVLLM, base: str, http: aiohttp.ClientSession) -> None:
    mock.enqueue(Scenario(content="alpha beta STOP gamma"))
    choice = (await chat(http, base, messages=MSG, stop=["STOP"]))["choices"][0]
    assert (choice["message"]["content"], choice["finish_reason"], choice["stop_reason"]) == (
        "alpha beta ",
        "stop",
        "STOP",
    )


async def test_n2_stream_interleaves_choices_and_sums_usage(base: str, http: aiohttp.ClientSession) -> None:
    events = await chat(http, base, messages=MSG, n=2, max_tokens=4, temperature=0.7, **IDS, **USAGE)
    order = [e["choices"][0]["index"] for e in events if isinstance(e, dict) and e["choices"]]
    assert order == [0, 1, 0, 1, 0, 1, 0, 1, 0, 1]
    assert events[-2]["usage"]["completion_tokens"] == 8


async def test_stream_and_whole_reply_say_the_same(client: openai.AsyncOpenAI) -> None:
    whole = await client.chat.completions.create(model="smollm2", messages=MSG)
    stream = await client.chat.completions.create(model="smollm2", messages=MSG, stream=True)
    pieces = [chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices]
    assert "".join(pieces) == whole.choices[0].message.content


# -- tokenizer and multi-turn prefix property -----------------------------------------------------------------


async def test_tokenize_messages_equals_chat_prompt_token_ids(base: str, http: aiohttp.ClientSession) -> None:
    tokenized = await post(http, base + "/tokenize", {"messages": MSG, "add_generation_prompt": True})
    reply = await chat(http, base, messages=MSG, **IDS)
    assert tokenized["tokens"] == reply["prompt_token_ids"]
    assert tokenized["count"] == reply["usage"]["prompt_tokens"]


async def test_tokenize_prompt_equals_completion_prompt_token_ids(
    base: str, http: aiohttp.ClientSession
) -> None:
    tokenized = await post(http, base + "/tokenize", {"prompt": "2+3="})
    reply = await post(http, base + COMPLETIONS, {"prompt": "2+3=", **IDS})
    assert tokenized["tokens"] == reply["choices"][0]["prompt_token_ids"]


async def test_turn2_prompt_extends_turn1_prompt_and_completion(
    base: str, http: aiohttp.ClientSession
) -> None:
    turn1 = await chat(http, base, messages=MSG, **IDS)
    answer = turn1["choices"][0]
    messages = [
        *MSG,
        {"role": "assistant", "content": answer["message"]["content"]},
        {"role": "user", "content": "+4?"},
    ]
    turn2 = await chat(http, base, messages=messages, **IDS)
    prefix = turn1["prompt_token_ids"] + answer["token_ids"]
    assert turn2["prompt_token_ids"][: len(prefix)] == prefix
    assert len(turn2["prompt_token_ids"]) > len(prefix)


async def test_echoed_tool_call_extends_the_prompt_too(
    mock: MockVLLM, base: str, http: aiohttp.ClientSession
) -> None:
    mock.enqueue(Scenario(tool_call=ToolCallSpec("add", {"a": 2, "b": 3})))
    turn1 = await chat(http, base, messages=TOOL_MSG, tools=[ADD_TOOL], **IDS)
    answer = turn1["choices"][0]
    echoed = {"role": "assistant", "content": None, "tool_calls": answer["message"]["tool_calls"]}
    tool_reply = {"role": "tool", "tool_call_id": echoed["tool_calls"][0]["id"], "content": "5"}
    turn2 = await chat(http, base, messages=[*TOOL_MSG, echoed, tool_reply], tools=[ADD_TOOL], **IDS)
    prefix = turn1["prompt_token_ids"] + answer["token_ids"]
    assert turn2["prompt_token_ids"][: len(prefix)] == prefix


# -- endpoints and errors ---------------------------------------------------------------------------------------


async def test_models_lists_served_models_in_vllm_shape(client: openai.AsyncOpenAI) -> None:
    models = await client.models.list()
    assert [m.id for m in models.data] == ["smollm2"]
    extra = models.data[0].model_extra or {}
    assert (models.data[0].owned_by, extra["max_model_len"], extra["parent"]) == ("vllm", 2048, None)


async def test_health_is_an_empty_200(base: str, http: aiohttp.ClientSession) -> None:
    async with http.get(base + "/health") as resp:
        assert (resp.status, await resp.read()) == (200, b"")


async def test_unknown_model_is_a_404_naming_the_aliases(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        await client.chat.completions.create(model="nope", messages=MSG)
    assert "Valid aliases: smollm2." in err.value.message


async def test_too_many_max_tokens_is_a_400_with_param(base: str, http: aiohttp.ClientSession) -> None:
    async with http.post(base + CHAT, json={"model": "smollm2", "messages": MSG, "max_tokens": 4000}) as resp:
        assert resp.status == 400
        assert (await resp.json())["error"]["param"] == "max_tokens"


async def test_malformed_json_is_a_400(base: str, http: aiohttp.ClientSession) -> None:
    async with http.post(base + CHAT, data=b"{not json") as resp:
        assert resp.status == 400
        assert (await resp.json())["error"]["type"] == "BadRequestError"


# -- scenarios --------------------------------------------------------------------------------------------------


async def test_scenario_fixed_text(mock: MockVLLM, client: openai.AsyncOpenAI) -> None:
    mock.enqueue(Scenario(content="#### 42"))
    reply = await client.chat.completions.create(model="smollm2", messages=MSG)
    assert reply.choices[0].message.content == "#### 42"


async def test_scenario_tool_call_whole(mock: MockVLLM, client: openai.AsyncOpenAI) -> None:
    mock.enqueue(Scenario(tool_call=ToolCallSpec("add", {"a": 2, "b": 3})))
    reply = await client.chat.completions.create(model="smollm2", messages=TOOL_MSG, tools=[ADD_TOOL])
    choice = reply.choices[0]
    assert (choice.finish_reason, choice.message.content) == ("tool_calls", None)
    assert choice.message.tool_calls is not None
    call = choice.message.tool_calls[0]
    assert call.id.startswith("chatcmpl-tool-")
    assert call.type == "function"
    assert (call.function.name, json.loads(call.function.arguments)) == ("add", {"a": 2, "b": 3})


async def test_scenario_tool_call_streamed_reassembles(mock: MockVLLM, client: openai.AsyncOpenAI) -> None:
    mock.enqueue(Scenario(tool_call=ToolCallSpec("add", {"a": 2, "b": 3})))
    stream = await client.chat.completions.create(
        model="smollm2",
        messages=TOOL_MSG,
        tools=[ADD_TOOL],
        stream=True,
    )
    names, args, finish = [], "", None
    async for chunk in stream:
        for call in chunk.choices[0].delta.tool_calls or []:
            names += [call.function.name] if call.function and call.function.name else []
            args += call.function.arguments or "" if call.function else ""
        finish = chunk.choices[0].finish_reason or finish
    assert (names, json.loads(args), finish) == (["add"], {"a": 2, "b": 3}, "tool_calls")


async def test_several_tool_calls_in_one_reply_whole_streamed_and_echoed_back(
    mock: MockVLLM, client: openai.AsyncOpenAI, base: str, http: aiohttp.ClientSession
) -> None:
    """Parallel tool calls, as Codex and the Agents SDK meet them: two calls in one reply, each streamed by its
    index, and the reply echoed back as history extends the prompt exactly (one hermes block a line)."""
    calls = (ToolCallSpec("add", {"a": 2, "b": 3}), ToolCallSpec("add", {"a": 4, "b": 5}))
    mock.enqueue(Scenario(tool_calls=calls), times=3)
    whole = await client.chat.completions.create(model="smollm2", messages=TOOL_MSG, tools=[ADD_TOOL])
    got = [
        (c.function.name, json.loads(c.function.arguments)) for c in whole.choices[0].message.tool_calls or []
    ]
    assert got == [("add", {"a": 2, "b": 3}), ("add", {"a": 4, "b": 5})]
    assert whole.choices[0].finish_reason == "tool_calls"
    stream = await client.chat.completions.create(
        model="smollm2", messages=TOOL_MSG, tools=[ADD_TOOL], stream=True
    )
    args: dict[int, str] = {}
    async for chunk in stream:
        for call in chunk.choices[0].delta.tool_calls or []:
            args[call.index] = args.get(call.index, "") + ((call.function and call.function.arguments) or "")
    assert [json.loads(args[i]) for i in sorted(args)] == [{"a": 2, "b": 3}, {"a": 4, "b": 5}]
    turn1 = await chat(http, base, messages=TOOL_MSG, tools=[ADD_TOOL], **IDS)
    answer = turn1["choices"][0]
    echoed = {"role": "assistant", "content": None, "tool_calls": answer["message"]["tool_calls"]}
    replies = [{"role": "tool", "tool_call_id": c["id"], "content": "x"} for c in echoed["tool_calls"]]
    turn2 = await chat(http, base, messages=[*TOOL_MSG, echoed, *replies], tools=[ADD_TOOL], **IDS)
    prefix = turn1["prompt_token_ids"] + answer["token_ids"]
    assert turn2["prompt_token_ids"][: len(prefix)] == prefix


async def test_required_tool_choice_calls_a_tool_unscripted(base: str, http: aiohttp.ClientSession) -> None:
    message = (await chat(http, base, messages=TOOL_MSG, **REQUIRED))["choices"][0]["message"]
    assert set(json.loads(message["tool_calls"][0]["function"]["arguments"])) == {"a", "b"}


async def test_tool_call_without_tools_stays_text(
    mock: MockVLLM, base: str, http: aiohttp.ClientSession
) -> None:
    mock.enqueue(Scenario(tool_call=ToolCallSpec("add", {"a": 1})))
    message = (await chat(http, base, messages=MSG))["choices"][0]["message"]
    assert message["content"].startswith("<tool_call>\n")
    assert "tool_calls" not in message


async def test_scenario_error_reply(mock: MockVLLM, client: openai.AsyncOpenAI) -> None:
    mock.enqueue(Scenario(error=ErrorReply(503, "engine is sleeping")))
    with pytest.raises(openai.InternalServerError) as err:
        await client.chat.completions.create(model="smollm2", messages=MSG)
    assert err.value.status_code == 503


async def test_scenario_matches_by_user_substring(
    mock: MockVLLM, base: str, http: aiohttp.ClientSession
) -> None:
    mock.enqueue(Scenario(content="matched"), match="Answer with")
    other = await chat(http, base, messages=[{"role": "user", "content": "hello"}])
    hit = await chat(http, base, messages=MSG)
    assert other["choices"][0]["message"]["content"] != "matched"
    assert hit["choices"][0]["message"]["content"] == "matched"


async def test_scenario_serves_its_times_then_falls_back(
    mock: MockVLLM, base: str, http: aiohttp.ClientSession
) -> None:
    mock.enqueue(Scenario(content="twice"), times=2, when=lambda req: req.get("max_tokens") is None)
    replies = [(await chat(http, base, messages=MSG))["choices"][0]["message"]["content"] for _ in range(3)]
    assert replies[:2] == ["twice", "twice"]
    assert replies[2] != "twice"


async def test_hook_supplies_text_for_a_known_subset(
    mock: MockVLLM, base: str, http: aiohttp.ClientSession
) -> None:
    def wrong_on_two_plus_three(req: dict[str, Any]) -> Scenario | None:
        return Scenario(text_fn=lambda r: "#### 6") if "2+3" in json.dumps(req["messages"]) else None

    mock.hook = wrong_on_two_plus_three
    assert (await chat(http, base, messages=MSG))["choices"][0]["message"]["content"] == "#### 6"
    other = await chat(http, base, messages=[{"role": "user", "content": "hi"}])
    assert other["choices"][0]["message"]["content"] != "#### 6"


async def test_http_scenario_api_queues_clears_and_logs(
    mock: MockVLLM, base: str, http: aiohttp.ClientSession
) -> None:
    async with http.post(base + "/mock/scenarios", json=[{"content": "over http", "match": "2+3"}]) as resp:
        assert (await resp.json())["queued"] == 1
    assert (await chat(http, base, messages=MSG))["choices"][0]["message"]["content"] == "over http"
    async with http.post(base + "/mock/scenarios", json=[{"content": "never", "times": None}]) as resp:
        assert resp.status == 200
    async with http.delete(base + "/mock/scenarios") as resp:
        assert (await resp.json())["cleared"] == 1
    async with http.get(base + "/mock/requests") as resp:
        logged = await resp.json()
    assert [r["path"] for r in logged] == [CHAT]
    assert logged[0]["body"]["messages"] == MSG


async def test_http_scenario_api_rejects_unknown_keys(base: str, http: aiohttp.ClientSession) -> None:
    async with http.post(base + "/mock/scenarios", json=[{"contnet": "typo"}]) as resp:
        assert resp.status == 400


async def test_request_log_is_a_bounded_ring(http: aiohttp.ClientSession) -> None:
    mock = MockVLLM(request_log_size=2)
    async with running_mock(mock) as url:
        for i in range(3):
            await post(http, url + "/chat/completions", {"messages": [{"role": "user", "content": str(i)}]})
    assert [r.body["messages"][0]["content"] for r in mock.requests] == ["1", "2"]


# -- fault modes --------------------------------------------------------------------------------------------------


async def test_latency_delays_the_headers(mock: MockVLLM, base: str, http: aiohttp.ClientSession) -> None:
    mock.enqueue(Scenario(latency_s=0.2))
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with http.post(base + CHAT, json={"model": "smollm2", "messages": MSG, "stream": True}) as resp:
        assert loop.time() - started >= 0.2
        assert resp.status == 200


async def test_ttft_delays_the_first_chunk_after_headers(
    mock: MockVLLM, base: str, http: aiohttp.ClientSession
) -> None:
    mock.enqueue(Scenario(ttft_s=0.2))
    loop = asyncio.get_running_loop()
    async with http.post(base + CHAT, json={"model": "smollm2", "messages": MSG, "stream": True}) as resp:
        headers_at = loop.time()
        await next_event(resp)
        assert loop.time() - headers_at >= 0.2


async def test_chunk_delay_spaces_the_chunks(mock: MockVLLM, base: str, http: aiohttp.ClientSession) -> None:
    mock.enqueue(Scenario(chunk_delay_s=0.05))
    loop = asyncio.get_running_loop()
    # From before the request: the third chunk leaves the mock 2 x 0.05 s after the first, which leaves after the
    # request was sent. (Timed from the first chunk's read, a late read made the gap look short: 0.0994 s.)
    sent_at = loop.time()
    async with http.post(base + CHAT, json={"model": "smollm2", "messages": MSG, "stream": True}) as resp:
        for _ in range(3):
            await next_event(resp)
        assert loop.time() - sent_at >= 0.1


async def test_mid_stream_error_frame_then_done(
    mock: MockVLLM, base: str, http: aiohttp.ClientSession
) -> None:
    mock.enqueue(Scenario(error_frame_after=2))
    events = await chat(http, base, messages=MSG, stream=True)
    assert len(events) == 4
    assert events[2]["error"]["code"] == 500
    assert events[3] == "[DONE]"


async def test_reset_mid_stream_is_a_payload_error(
    mock: MockVLLM, base: str, http: aiohttp.ClientSession
) -> None:
    mock.enqueue(Scenario(reset_after=3))
    async with http.post(base + CHAT, json={"model": "smollm2", "messages": MSG, "stream": True}) as resp:
        for _ in range(3):
            await next_event(resp)
        with pytest.raises(aiohttp.ClientPayloadError):
            await resp.content.read()
    await mock.wait_streams_closed()


async def test_stall_holds_the_stream_until_the_client_leaves(
    mock: MockVLLM, base: str, http: aiohttp.ClientSession
) -> None:
    mock.enqueue(Scenario(stall_after=2))
    async with http.post(base + CHAT, json={"model": "smollm2", "messages": MSG, "stream": True}) as resp:
        await next_event(resp)
        await next_event(resp)
        await mock.wait_until(lambda m: m.stalled_streams == 1)
        assert (mock.chunks_sent, mock.in_flight, resp.content.at_eof()) == (2, 1, False)
        resp.close()
    await mock.wait_until(lambda m: m.open_streams == 0 and m.peer_disconnects == 1)


async def test_client_leaving_mid_stream_closes_the_mock_stream(
    mock: MockVLLM, base: str, http: aiohttp.ClientSession
) -> None:
    mock.enqueue(Scenario(chunk_delay_s=0.05))
    async with http.post(base + CHAT, json={"model": "smollm2", "messages": MSG, "stream": True}) as resp:
        await next_event(resp)
        assert mock.open_streams == 1
        resp.close()
    await mock.wait_streams_closed()
    assert mock.peer_disconnects == 1


async def test_reset_before_a_whole_reply_is_a_disconnect(mock: MockVLLM, client: openai.AsyncOpenAI) -> None:
    mock.enqueue(Scenario(reset_after=0))
    with pytest.raises(openai.APIConnectionError):
        await client.chat.completions.create(model="smollm2", messages=MSG)


async def test_running_mock_yields_a_v1_base_url(mock: MockVLLM) -> None:
    async with running_mock(mock) as url:
        assert url.startswith("http://127.0.0.1:")
        assert url.endswith("/v1")


async def test_prompt_plus_max_tokens_over_the_context_is_a_400(http: aiohttp.ClientSession) -> None:
    async with running_mock(MockVLLM(max_model_len=64)) as url:
        body = await post(http, url + "/chat/completions", {"messages": MSG, "max_tokens": 60})
    assert body["error"]["param"] == "max_tokens"
    assert body["error"]["code"] == 400


@pytest.mark.parametrize("n", [10**22, 257])
async def test_a_huge_n_is_a_400_not_a_mock_that_fills_the_memory(
    base: str, http: aiohttp.ClientSession, n: int
) -> None:
    async with http.post(
        base + "/v1/chat/completions", json={"model": "smollm2", "messages": MSG, "n": n}
    ) as r:
        assert (r.status, (await r.json())["error"]["param"]) == (400, "n")
