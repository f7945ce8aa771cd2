"""The capture addon: what it injects, what the client sees, and the one record per LLM flow, in a real gateway.

Token ids are checked independently: a replay upstream sends the raw bytes of real vLLM captures and a parser
written here computes the expected ids; with the mock vLLM, the expected ids come from asking the mock directly.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web
from multidict import CIMultiDict

from agl_lite.addons.capture import Capture
from agl_lite.addons.router import Router
from agl_lite.core.contract import derive_key
from agl_lite.core.flow import Flow, Response
from agl_lite.core.server import Gateway
from agl_lite.errors import ConfigError
from agl_lite.store.records import CallOutcome, LLMCall
from agl_lite.testing import MockVLLM, Scenario, ToolCallSpec, running_mock
from agl_lite.testing.addons import FlowRecorder
from agl_lite.testing.flows import make_flow
from agl_lite.testing.gateway import write_config
from agl_lite.testing.servers import serve_app
from tests.conftest import ADMIN_KEY, GatewayFactory, gateway_url

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32-cpu"
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
MSG = [{"role": "user", "content": "What is 2+3? Answer with the number."}]
ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
    },
}
FORCED = {"tools": [ADD_TOOL], "tool_choice": {"type": "function", "function": {"name": "add"}}}
REQUIRED = {"tools": [ADD_TOOL], "tool_choice": "required"}

# fixture -> (path, what a client that asks for nothing extra sends for it)
REPLAYS: dict[str, tuple[str, dict[str, Any]]] = {
    "chat-nonstream-n2-ids-logprobs.json": (
        CHAT,
        {"messages": MSG, "n": 2, "logprobs": True, "top_logprobs": 2},
    ),
    "chat-stream-ids-logprobs-usage.sse": (CHAT, {"messages": MSG, "logprobs": True, "stream": True}),
    "chat-stream-plain.sse": (CHAT, {"messages": MSG, "stream": True, "max_tokens": 8}),
    "chat-stream-tools-ids.sse": (CHAT, {"messages": MSG, "tools": [ADD_TOOL], "stream": True}),
    "chat-nonstream-forced-tool-ids.json": (CHAT, {"messages": MSG, **FORCED, "max_tokens": 40}),
    "chat-stream-forced-tool-ids.sse": (CHAT, {"messages": MSG, **FORCED, "stream": True, "max_tokens": 40}),
    "completions-nonstream-ids.json": (COMPLETIONS, {"prompt": "2+3=", "logprobs": 1, "max_tokens": 6}),
    "completions-stream-ids.sse": (COMPLETIONS, {"prompt": "2+3=", "stream": True, "max_tokens": 6}),
    "chat-stream-n2-ids-logprobs-usage.sse": (
        CHAT,
        {"messages": MSG, "n": 2, "logprobs": True, "stream": True},
    ),
    "chat-stream-required-tool-ids-logprobs.sse": (
        CHAT,
        {"messages": MSG, **REQUIRED, "logprobs": True, "stream": True, "max_tokens": 40},
    ),
    "chat-nonstream-required-tool-ids.json": (CHAT, {"messages": MSG, **REQUIRED, "max_tokens": 40}),
}


# --- an independent reading of the captures ----------------------------------------------------------------------


def fixture_objects(raw: bytes, stream: bool) -> list[dict[str, Any]]:
    if not stream:
        return [json.loads(raw)]
    return [json.loads(line[len(b"data: ") :]) for line in raw.splitlines() if line.startswith(b"data: {")]


def expected(raw: bytes, stream: bool) -> dict[str, Any]:
    """Per choice: ids, logprobs; prompt ids; usage — straight from the bytes with the stdlib json."""
    ids: dict[int, list[int]] = {}
    logprobs: dict[int, list[float]] = {}
    prompt: list[int] | None = None
    usage = None
    for obj in fixture_objects(raw, stream):
        prompt = prompt or obj.get("prompt_token_ids")
        usage = obj.get("usage") or usage
        for c in obj["choices"]:
            ids.setdefault(c["index"], []).extend(c.get("token_ids") or [])
            prompt = prompt or c.get("prompt_token_ids")
            if lp := c.get("logprobs"):
                values = [e["logprob"] for e in lp["content"]] if "content" in lp else lp["token_logprobs"]
                logprobs.setdefault(c["index"], []).extend(values)
    return {"ids": ids, "prompt": prompt, "logprobs": logprobs, "usage": usage}


def client_events(raw: bytes) -> list[Any]:
    return [
        "[DONE]" if line == b"data: [DONE]" else json.loads(line[len(b"data: ") :])
        for line in raw.splitlines()
        if line.startswith(b"data: ")
    ]


# --- servers --------------------------------------------------------------------------------------------------------


@dataclass
class Replay:
    """An upstream that answers with the raw bytes of a capture, event by event, optionally stopping early."""

    raw: bytes = b""
    stream: bool = False
    status: int = 200
    stop_before_done: bool = False
    bodies: list[Any] = field(default_factory=list)

    def load(self, name: str, **kw: Any) -> None:
        self.raw, self.stream = (FIXTURES / name).read_bytes(), name.endswith(".sse")
        for k, v in kw.items():
            setattr(self, k, v)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.bodies.append(await request.json())
        if not self.stream:
            return web.Response(body=self.raw, status=self.status, content_type="application/json")
        resp = web.StreamResponse(status=self.status, headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        raw = self.raw[: self.raw.index(b"data: [DONE]")] if self.stop_before_done else self.raw
        for event in raw.split(b"\n\n")[:-1]:
            await resp.write(event + b"\n\n")
        await resp.write_eof()
        return resp


@dataclass
class ReplaySetup:
    replay: Replay
    gateway: Gateway
    probe: FlowRecorder

    async def post(self, path: str, body: dict[str, Any], key: str = ADMIN_KEY) -> tuple[int, bytes]:
        headers = {"Authorization": f"Bearer {key}"}
        url = gateway_url(self.gateway) + path
        async with aiohttp.ClientSession() as s, s.post(url, json=body, headers=headers) as resp:
            return resp.status, await resp.read()


@pytest.fixture
async def rs(gateway_factory: GatewayFactory) -> AsyncIterator[ReplaySetup]:
    replay, probe = Replay(), FlowRecorder()
    app = web.Application()
    app.router.add_post(CHAT, replay.handle)
    app.router.add_post(COMPLETIONS, replay.handle)
    async with (
        serve_app(app) as url,
        gateway_factory({"smollm2": [url + "/v1"]}, extra_addons=[Capture(), probe]) as gw,
    ):
        yield ReplaySetup(replay, gw, probe)


@dataclass
class MockSetup:
    mock: MockVLLM
    mock_url: str
    gateway: Gateway
    probe: FlowRecorder

    def via(self, prefix: str = "", key: str = ADMIN_KEY) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=gateway_url(self.gateway) + prefix + "/v1", api_key=key, max_retries=0
        )

    async def direct_raw(self, path: str, body: dict[str, Any]) -> bytes:
        async with (
            aiohttp.ClientSession() as s,
            s.post(self.mock_url + path.removeprefix("/v1"), json=body) as r,
        ):
            return await r.read()

    async def via_raw(self, path: str, body: dict[str, Any]) -> bytes:
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        async with (
            aiohttp.ClientSession() as s,
            s.post(gateway_url(self.gateway) + path, json=body, headers=headers) as r,
        ):
            return await r.read()

    async def expected_ids(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """Ask the mock itself (deterministic by seed and prompt) for the ids, non-streamed."""
        raw = await self.direct_raw(path, {**body, "stream": False, "return_token_ids": True})
        return expected(raw, stream=False)


@pytest.fixture
async def ms(gateway_factory: GatewayFactory) -> AsyncIterator[MockSetup]:
    mock, probe = MockVLLM(("smollm2",), seed=7), FlowRecorder()
    async with (
        running_mock(mock) as url,
        gateway_factory({"smollm2": [url]}, extra_addons=[Capture(), probe]) as gw,
    ):
        yield MockSetup(mock, url, gw, probe)


def ids_of(rec: LLMCall) -> dict[int, list[int]]:
    return {c.index: c.token_ids.tolist() for c in rec.choices}


# --- records from real captures -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(REPLAYS), ids=str)
async def test_record_ids_equal_an_independent_parse_of_the_capture(rs: ReplaySetup, name: str) -> None:
    path, body = REPLAYS[name]
    rs.replay.load(name)
    status, _ = await rs.post(path, {"model": "smollm2", **body})
    rec = await rs.probe.record()
    want = expected(rs.replay.raw, rs.replay.stream)
    assert status == 200
    api = "chat" if path == CHAT else "completions"
    assert (rec.outcome, rec.stream, rec.api) == (CallOutcome.OK, rs.replay.stream, api)
    assert ids_of(rec) == want["ids"]
    assert (rec.prompt_token_ids.tolist() if rec.prompt_token_ids is not None else None) == want["prompt"]
    for c in rec.choices:
        if c.index in want["logprobs"]:
            assert c.logprobs is not None
            assert c.logprobs.tolist() == pytest.approx(want["logprobs"][c.index], rel=1e-6)
        else:
            assert c.logprobs is None
    assert rec.usage == want["usage"]
    assert rec.complete is (None if want["usage"] is None or not any(want["ids"].values()) else True)


async def test_record_api_served_model_and_response_id(rs: ReplaySetup) -> None:
    rs.replay.load("completions-stream-ids.sse")
    await rs.post(COMPLETIONS, {"model": "smollm2", **REPLAYS["completions-stream-ids.sse"][1]})
    rec = await rs.probe.record()
    assert (rec.api, rec.served_model, rec.model, rec.requested_model) == (
        "completions",
        "smollm2",
        "smollm2",
        "smollm2",
    )
    assert rec.response_id == rec.client_id == "cmpl-82a69ac69e5a7ea5"
    assert rec.upstream is not None
    assert rec.upstream.startswith("http://127.0.0.1:")


async def test_upstream_gets_ids_and_usage_injected_into_a_stream(rs: ReplaySetup) -> None:
    rs.replay.load("chat-stream-plain.sse")
    await rs.post(CHAT, {"model": "smollm2", "messages": MSG, "stream": True, "stream_options": {"x": 1}})
    (sent,) = rs.replay.bodies
    assert sent["return_token_ids"] is True
    assert sent["stream_options"] == {"x": 1, "include_usage": True}


async def test_upstream_gets_no_stream_options_when_not_streaming(rs: ReplaySetup) -> None:
    rs.replay.load("chat-nonstream-forced-tool-ids.json")
    await rs.post(CHAT, {"model": "smollm2", "messages": MSG})
    (sent,) = rs.replay.bodies
    assert sent["return_token_ids"] is True
    assert "stream_options" not in sent


async def test_record_keeps_the_clients_body_and_the_sampling_sent(rs: ReplaySetup) -> None:
    rs.replay.load("chat-stream-plain.sse")
    body = {"model": "smollm2", "messages": MSG, "stream": True, "temperature": 0.5, "top_p": 0.9, "seed": 3}
    await rs.post(CHAT, body)
    rec = await rs.probe.record()
    assert rec.request == body
    assert rec.sampling == {
        "temperature": 0.5,
        "top_p": 0.9,
        "seed": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }


async def test_client_that_did_not_ask_sees_no_ids_and_no_usage_event(rs: ReplaySetup) -> None:
    name = "chat-stream-n2-ids-logprobs-usage.sse"
    rs.replay.load(name)
    _, raw = await rs.post(CHAT, {"model": "smollm2", **REPLAYS[name][1]})
    events = client_events(raw)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(ev["choices"] and "usage" not in ev for ev in chunks)
    assert {c["token_ids"] for ev in chunks for c in ev["choices"] if "token_ids" in c} == {None}
    assert [ev.get("prompt_token_ids", "absent") for ev in chunks[:2]] == [None, None]
    assert all(c["logprobs"] is not None for ev in chunks[2:] for c in ev["choices"])  # asked for: kept


@pytest.mark.parametrize(
    "name", ["chat-stream-n2-ids-logprobs-usage.sse", "chat-nonstream-n2-ids-logprobs.json"]
)
async def test_client_that_asked_for_ids_and_usage_gets_the_upstream_bytes_unchanged(
    rs: ReplaySetup, name: str
) -> None:
    rs.replay.load(name)
    path, body = REPLAYS[name]
    asked = {"return_token_ids": True} | (
        {"stream_options": {"include_usage": True}} if rs.replay.stream else {}
    )
    _, raw = await rs.post(path, {"model": "smollm2", **body, **asked})
    assert raw == rs.replay.raw


async def test_stream_that_ends_without_done_is_truncated_and_keeps_its_ids(rs: ReplaySetup) -> None:
    name = "chat-stream-ids-logprobs-usage.sse"
    rs.replay.load(name, stop_before_done=True)
    await rs.post(CHAT, {"model": "smollm2", **REPLAYS[name][1]})
    rec = await rs.probe.record()
    assert rec.outcome is CallOutcome.TRUNCATED
    assert ids_of(rec) == expected(rs.replay.raw, True)["ids"]


async def test_upstream_error_status_is_upstream_error_with_its_message(rs: ReplaySetup) -> None:
    rs.replay.load("error-too-long.json", status=400)
    status, _ = await rs.post(CHAT, {"model": "smollm2", "messages": MSG, "max_tokens": 4000})
    rec = await rs.probe.record()
    assert status == 400
    assert (rec.outcome, rec.status) == (CallOutcome.UPSTREAM_ERROR, 400)
    assert rec.error is not None
    assert "max_model_len=2048" in rec.error
    assert rec.choices == []


async def test_unknown_model_is_recorded_as_rejected(rs: ReplaySetup) -> None:
    body = {"model": "gpt-5", "messages": MSG, "temperature": 0.2}
    status, _ = await rs.post(CHAT, body)
    rec = await rs.probe.record()
    assert status == 404
    assert (rec.outcome, rec.status, rec.api) == (CallOutcome.REJECTED, 404, "chat")
    assert (rec.requested_model, rec.model, rec.upstream) == ("gpt-5", None, None)
    assert rec.request == body
    assert rec.error is not None
    assert rec.error.startswith("model_not_found")
    assert rec.order_key > 0
    assert rs.replay.bodies == []


async def test_unauthenticated_call_leaves_no_record(rs: ReplaySetup) -> None:
    status, _ = await rs.post(CHAT, {"model": "smollm2", "messages": MSG}, key="wrong-key-0123456789")
    (flow,) = await rs.probe.wait(1)
    assert status == 401
    assert "capture.record" not in flow.metadata


async def test_every_flow_gets_exactly_one_record_with_increasing_order_keys(rs: ReplaySetup) -> None:
    rs.replay.load("chat-stream-plain.sse")
    for body in ({"model": "smollm2"}, {"model": "nope"}, {"model": "smollm2"}):
        await rs.post(CHAT, {**body, "messages": MSG, "stream": True})
    flows = await rs.probe.wait(3)
    records = [f.metadata["capture.record"] for f in flows]
    assert [r.outcome for r in records] == [CallOutcome.OK, CallOutcome.REJECTED, CallOutcome.OK]
    assert len({r.id for r in records}) == 3
    keys = [r.order_key for r in records]
    assert keys == sorted(keys)
    assert len(set(keys)) == 3


async def test_attributed_call_carries_rollout_attempt_and_timings(rs: ReplaySetup) -> None:
    rs.replay.load("chat-stream-plain.sse")
    await rs.post(
        "/r/ro-1/a/at-9" + CHAT,
        {"model": "smollm2", "messages": MSG, "stream": True},
        derive_key(ADMIN_KEY, "ro-1"),
    )
    rec = await rs.probe.record()
    assert (rec.rollout_id, rec.attempt_id) == ("ro-1", "at-9")
    assert rec.t_first_byte is not None
    assert rec.t_end is not None
    assert rec.t_start <= rec.t_first_byte <= rec.t_end


async def test_model_version_set_by_an_earlier_addon_is_recorded(gateway_factory: GatewayFactory) -> None:
    class Stamp:
        def request(self, flow: Flow) -> None:
            flow.metadata["route.model_version"] = "step-42"

    replay, probe = Replay(), FlowRecorder()
    replay.load("chat-nonstream-forced-tool-ids.json")
    app = web.Application()
    app.router.add_post(CHAT, replay.handle)
    async with (
        serve_app(app) as url,
        gateway_factory({"smollm2": [url + "/v1"]}, extra_addons=[Stamp(), Capture(), probe]) as gw,
    ):
        await ReplaySetup(replay, gw, probe).post(CHAT, {"model": "smollm2", "messages": MSG})
        assert (await probe.record()).model_version == "step-42"


async def test_unreachable_upstream_is_an_upstream_error(gateway_factory: GatewayFactory) -> None:
    probe = FlowRecorder()
    app = web.Application()
    async with serve_app(app) as url:
        pass  # the port is free again: nothing listens there
    async with gateway_factory({"smollm2": [url + "/v1"]}, extra_addons=[Capture(), probe]) as gw:
        status, _ = await ReplaySetup(Replay(), gw, probe).post(CHAT, {"model": "smollm2", "messages": MSG})
        rec = await probe.record()
    assert status == 502
    assert (rec.outcome, rec.status) == (CallOutcome.UPSTREAM_ERROR, 502)
    assert rec.error is not None
    assert "cannot connect" in rec.error


# --- the real openai SDK against the mock vLLM ---------------------------------------------------------------------


async def test_sdk_streamed_n2_record_has_the_mocks_ids(ms: MockSetup) -> None:
    body: dict[str, Any] = {"model": "smollm2", "messages": MSG, "n": 2, "max_tokens": 12, "seed": 1}
    want = await ms.expected_ids(CHAT, body)
    stream = await ms.via().chat.completions.create(**body, stream=True)
    async for _ in stream:
        pass
    rec = await ms.probe.record()
    assert ids_of(rec) == want["ids"]
    assert rec.prompt_token_ids is not None
    assert rec.prompt_token_ids.tolist() == want["prompt"]
    assert (rec.outcome, rec.complete) == (CallOutcome.OK, True)
    assert rec.usage is not None
    assert rec.usage["completion_tokens"] == sum(map(len, want["ids"].values()))


async def test_sdk_non_streamed_record_has_the_mocks_ids(ms: MockSetup) -> None:
    body: dict[str, Any] = {"model": "smollm2", "messages": MSG, "max_tokens": 20}
    want = await ms.expected_ids(CHAT, body)
    completion = await ms.via().chat.completions.create(**body)
    rec = await ms.probe.record()
    assert ids_of(rec) == want["ids"]
    assert rec.prompt_token_ids is not None
    assert rec.prompt_token_ids.tolist() == want["prompt"]
    assert rec.choices[0].text == completion.choices[0].message.content
    assert rec.complete is True


async def test_sdk_completions_streamed_record_has_the_mocks_ids(ms: MockSetup) -> None:
    body: dict[str, Any] = {"model": "smollm2", "prompt": "2+3=", "max_tokens": 6, "seed": 3}
    want = await ms.expected_ids(COMPLETIONS, body)
    stream = await ms.via().completions.create(**body, stream=True)
    text = "".join([c.choices[0].text async for c in stream if c.choices])
    rec = await ms.probe.record()
    assert ids_of(rec) == want["ids"]
    assert rec.prompt_token_ids is not None
    assert rec.prompt_token_ids.tolist() == want["prompt"]
    assert (rec.api, rec.choices[0].text, rec.complete) == ("completions", text, True)


@pytest.mark.parametrize("stream", [False, True])
async def test_completions_with_several_prompts_are_kept_but_not_complete(
    ms: MockSetup, stream: bool
) -> None:
    """A record holds one prompt's ids: choices generated from other prompts must not train on the first's."""
    body: dict[str, Any] = {"model": "smollm2", "prompt": [[1, 2], [3, 4, 5, 6]], "max_tokens": 4, "seed": 3}
    if stream:
        async for _ in await ms.via().completions.create(**body, stream=True):
            pass
    else:
        await ms.via().completions.create(**body)
    rec = await ms.probe.record()
    assert (rec.outcome, len(rec.choices), rec.complete) == (CallOutcome.OK, 2, False)
    assert rec.error is not None
    assert "several prompts" in rec.error


async def test_sdk_streamed_tool_call_record_has_ids_and_the_joined_call(ms: MockSetup) -> None:
    ms.mock.enqueue(Scenario(tool_call=ToolCallSpec("add", {"a": 2, "b": 3})), times=2)
    body: dict[str, Any] = {"model": "smollm2", "messages": MSG, "tools": [ADD_TOOL], "max_tokens": 200}
    want = await ms.expected_ids(CHAT, body)
    stream = await ms.via().chat.completions.create(**body, stream=True)
    async for _ in stream:
        pass
    rec = await ms.probe.record()
    (choice,) = rec.choices
    assert ids_of(rec) == want["ids"]
    assert [(t["function"]["name"], t["function"]["arguments"]) for t in choice.tool_calls] == [
        ("add", '{"a": 2, "b": 3}')
    ]
    assert (choice.finish_reason, choice.text, rec.complete) == ("tool_calls", None, True)


def normalized(raw: bytes) -> bytes:
    """Response ids, tool-call ids and timestamps differ between two calls; everything else must not."""
    return re.sub(rb'"created":\d+', b'"created":0', re.sub(rb'"id":"[^"]*"', b'"id":"x"', raw))


VIEW_CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat-stream": (CHAT, {"messages": MSG, "stream": True, "n": 2}),
    "chat-whole": (CHAT, {"messages": MSG, "n": 2}),
    "chat-stream-tool": (CHAT, {"messages": MSG, "tools": [ADD_TOOL], "stream": True}),
    "completions-stream": (COMPLETIONS, {"prompt": "2+3=", "stream": True, "max_tokens": 6}),
    "completions-whole": (COMPLETIONS, {"prompt": "2+3=", "max_tokens": 6}),
}
ASKED = {"return_token_ids": True}


@pytest.mark.parametrize("case", sorted(VIEW_CASES))
@pytest.mark.parametrize("asked", [False, True], ids=["asked-nothing", "asked-ids-and-usage"])
async def test_client_view_equals_what_the_mock_sends_without_the_gateway(
    ms: MockSetup, case: str, asked: bool
) -> None:
    path, body = VIEW_CASES[case]
    body = {"model": "smollm2", "max_tokens": 30, **body}
    if asked:
        body |= ASKED | ({"stream_options": {"include_usage": True}} if body.get("stream") else {})
    if "tools" in body:
        ms.mock.enqueue(Scenario(tool_call=ToolCallSpec("add", {"a": 2, "b": 3})), times=2)
    direct = await ms.direct_raw(path, body)
    via = await ms.via_raw(path, body)
    if body.get("stream") and not asked:
        # the stream's fingerprint rides on the usage event the client did not ask for and does not get
        direct = re.sub(rb',"system_fingerprint":"[^"]*"', b"", direct)
    assert normalized(via) == normalized(direct)
    assert (b'"token_ids":[' in via) is asked


async def test_mid_stream_error_frame_is_an_upstream_error_with_partial_ids(ms: MockSetup) -> None:
    body: dict[str, Any] = {"model": "smollm2", "messages": MSG, "max_tokens": 20}
    want = await ms.expected_ids(CHAT, body)
    ms.mock.enqueue(Scenario(error_frame_after=3))
    stream = await ms.via().chat.completions.create(**body, stream=True)
    with pytest.raises(openai.APIError):
        async for _ in stream:
            pass
    rec = await ms.probe.record()
    assert rec.outcome is CallOutcome.UPSTREAM_ERROR
    assert rec.error is not None
    assert "mock mid-stream failure" in rec.error
    assert ids_of(rec) == {0: want["ids"][0][:2]}  # role chunk + two tokens went out before the error


async def test_upstream_reset_mid_stream_is_an_upstream_error(ms: MockSetup) -> None:
    ms.mock.enqueue(Scenario(reset_after=3))
    body: dict[str, Any] = {"model": "smollm2", "messages": MSG}
    stream = await ms.via().chat.completions.create(**body, stream=True)
    with pytest.raises(openai.APIError):
        async for _ in stream:
            pass
    rec = await ms.probe.record()
    assert rec.outcome is CallOutcome.UPSTREAM_ERROR
    assert rec.error is not None
    assert "mid-response" in rec.error
    assert rec.complete is None


async def test_client_disconnect_keeps_the_ids_received_so_far(ms: MockSetup) -> None:
    body: dict[str, Any] = {"model": "smollm2", "messages": MSG, "max_tokens": 20}
    want = await ms.expected_ids(CHAT, body)
    ms.mock.enqueue(Scenario(stall_after=3))
    stream = await ms.via().chat.completions.create(**body, stream=True)
    async for _ in stream:
        break
    await ms.mock.wait_until(lambda m: m.stalled_streams == 1)
    await stream.close()
    rec = await ms.probe.record()
    assert rec.outcome is CallOutcome.CLIENT_DISCONNECTED
    assert ids_of(rec) == {0: want["ids"][0][:2]}
    await ms.mock.wait_until(lambda m: m.open_streams == 0)


async def test_logprobs_option_records_logprobs_the_client_does_not_see(
    gateway_factory: GatewayFactory,
) -> None:
    mock, probe = MockVLLM(("smollm2",), seed=7), FlowRecorder()
    spec = "agl_lite.addons.capture:Capture"
    async with (
        running_mock(mock) as url,
        gateway_factory(
            {"smollm2": [url]},
            chain=("auth", "route", spec),
            addons={spec: {"logprobs": True, "top_logprobs": 2}},
            extra_addons=[probe],
        ) as gw,
    ):
        client = openai.AsyncOpenAI(base_url=gateway_url(gw) + "/v1", api_key=ADMIN_KEY, max_retries=0)
        completion = await client.chat.completions.create(model="smollm2", messages=MSG, max_tokens=10)  # type: ignore[arg-type]
        rec = await probe.record()
    assert completion.choices[0].logprobs is None
    (choice,) = rec.choices
    assert choice.logprobs is not None
    assert len(choice.logprobs) == len(choice.token_ids) > 0
    assert (rec.sampling["logprobs"], rec.sampling["top_logprobs"]) == (True, 2)


# --- unit: the request side -----------------------------------------------------------------------------------------


def routed_flow(body: dict[str, Any], path: str = CHAT, backend: str = "vllm") -> Flow:
    flow = make_flow("POST", path, json_body=body, routes=Router.routes)
    flow.metadata["route.backend"] = backend
    return flow


def test_client_options_are_left_as_asked_and_nothing_is_injected() -> None:
    body = {"model": "m", "stream": True, "return_token_ids": True, "stream_options": {"include_usage": True}}
    flow = routed_flow(dict(body))
    Capture().request(flow)
    assert flow.request.json() == body
    assert "capture.injected" not in flow.metadata


def test_injected_fields_are_named_in_metadata() -> None:
    flow = routed_flow({"model": "m", "stream": True})
    Capture().request(flow)
    assert flow.metadata["capture.injected"] == {
        "return_token_ids": True,
        "stream_options": {"include_usage": True},
    }


def test_injection_appends_to_the_clients_bytes_without_re_encoding() -> None:
    raw = b'{ "model" : "m",\n  "messages": [{"role": "user", "content": "caf\\u00e9"}] }\n'
    flow = make_flow("POST", CHAT, body=raw, routes=Router.routes)
    flow.metadata["route.backend"] = "vllm"
    Capture().request(flow)
    assert flow.request.upstream_body() == raw.rstrip()[:-1] + b',"return_token_ids":true}'
    assert flow.request.json()["return_token_ids"] is True


def test_a_field_the_client_set_otherwise_is_replaced_not_duplicated() -> None:
    flow = routed_flow({"model": "m", "return_token_ids": False, "stream": True, "stream_options": {"x": 1}})
    Capture().request(flow)
    sent = flow.request.upstream_body()
    assert sent.count(b"return_token_ids") == 1
    assert sent.count(b"stream_options") == 1
    assert json.loads(sent) == {
        "model": "m",
        "return_token_ids": True,
        "stream": True,
        "stream_options": {"x": 1, "include_usage": True},
    }


def test_non_vllm_backend_gets_no_injection() -> None:
    flow = routed_flow({"model": "m", "stream": True}, backend="openai")
    Capture().request(flow)
    assert flow.request.json() == {"model": "m", "stream": True}
    assert isinstance(flow.metadata["capture.order_key"], int)


@pytest.mark.parametrize(
    ("path", "client_lp", "sent"),
    [
        (CHAT, None, {"logprobs": True, "top_logprobs": 3}),
        (CHAT, True, {"logprobs": True}),
        (COMPLETIONS, None, {"logprobs": 3}),
        (COMPLETIONS, 0, {"logprobs": 0}),
    ],
)
def test_logprobs_are_injected_only_where_the_client_did_not_ask(
    path: str, client_lp: Any, sent: dict[str, Any]
) -> None:
    capture = Capture()
    capture.options = Capture.Options(logprobs=True, top_logprobs=3)
    body: dict[str, Any] = {"model": "m"} | ({} if client_lp is None else {"logprobs": client_lp})
    flow = routed_flow(body, path)
    capture.request(flow)
    got = flow.request.json()
    assert {k: got[k] for k in ("logprobs", "top_logprobs") if k in got} == sent


def test_order_keys_strictly_increase() -> None:
    capture, keys = Capture(), []
    for _ in range(50):
        flow = routed_flow({"model": "m"})
        capture.request(flow)
        keys.append(flow.metadata["capture.order_key"])
    assert all(a < b for a, b in itertools.pairwise(keys))


def test_non_llm_route_is_not_captured() -> None:
    flow = make_flow("GET", "/v1/models", routes=Router.routes)
    Capture().request(flow)
    assert "capture.order_key" not in flow.metadata


def test_configure_rejects_negative_top_logprobs(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"m": ["http://127.0.0.1:1/v1"]})
    with pytest.raises(ConfigError, match="top_logprobs"):
        Capture().configure(config, Capture.Options(top_logprobs=-1))


def test_configure_without_options_uses_the_defaults(tmp_path: Path) -> None:
    capture = Capture()
    capture.configure(write_config(tmp_path, {"m": ["http://127.0.0.1:1/v1"]}), None)
    assert capture.options == Capture.Options()


def upstream_flow(headers: dict[str, str] | None = None) -> Flow:
    flow = routed_flow({"model": "m", "messages": MSG})
    flow.metadata["auth.role"] = "admin"
    capture = Capture()
    capture.request(flow)
    hdrs = CIMultiDict({"Content-Type": "application/json", **(headers or {})})
    flow.response = Response(200, hdrs, from_upstream=True)
    return flow


def test_a_second_end_hook_does_not_replace_the_record() -> None:
    flow, capture = upstream_flow(), Capture()
    capture.response_end(flow)
    first = flow.metadata["capture.record"]
    capture.error(flow)
    assert flow.metadata["capture.record"] is first


def test_an_encoded_upstream_body_is_neither_rewritten_nor_parsed() -> None:
    flow, capture = upstream_flow({"Content-Encoding": "gzip"}), Capture()
    capture.response_headers(flow)
    assert flow.response is not None
    assert (flow.response.taps, flow.response.transforms) == ([], [])
    capture.response_end(flow)
    rec = flow.metadata["capture.record"]
    assert rec.outcome is CallOutcome.UPSTREAM_ERROR
    assert rec.error == "the upstream answered with Content-Encoding gzip"
