"""The anthropic addon: how it rewrites a flow (body, path, targets), reshapes answers and errors, and, in a real
gateway, what the client gets and what the record keeps (both views, the commit point, rejected calls)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from agl_lite.addons import DEFAULT_CHAIN
from agl_lite.addons.anthropic import Anthropic
from agl_lite.capture.client_view import CLIENT_VIEW, ClientView
from agl_lite.core.flow import Flow, Response, UpstreamTarget, error_response
from agl_lite.core.routes import HttpRoute
from agl_lite.core.server import Gateway
from agl_lite.errors import BadRequest, ModelNotFound, TooManyRequests
from agl_lite.store.records import CallOutcome
from agl_lite.store.rules import STORE, Store
from agl_lite.testing import MockVLLM, running_mock
from agl_lite.testing.addons import FlowRecorder
from agl_lite.testing.flows import make_flow
from agl_lite.testing.servers import serve_app
from tests.conftest import ADMIN_KEY, GatewayFactory, gateway_url
from tests.integration.test_commit_point import GatedStore, ProvideStore

ROUTES: tuple[HttpRoute, ...] = (
    *Anthropic.routes,
    HttpRoute("models", "GET", "/v1/models", Anthropic.routes[0].scope),
)
BODY = {"model": "claude-x", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}
ANTHROPIC_HEADERS = {"anthropic-version": "2023-06-01", "anthropic-beta": "tools-2024", "x-api-key": "k"}


def messages_flow(body: Any = None, path: str = "/v1/messages", query: str = "beta=true") -> Flow:
    flow = make_flow(
        "POST",
        path,
        json_body=BODY if body is None else body,
        headers=ANTHROPIC_HEADERS,
        routes=ROUTES,
        query_string=query,
    )
    flow.upstreams = [
        UpstreamTarget(URL(base + path.partition("/v1")[2] + "?" + query, encoded=True), name=base)
        for base in ("http://10.0.0.1:8000/v1", "http://10.0.0.2/vllm/v1")
    ]
    return flow


# --- the request side ------------------------------------------------------------------------------------------------


def test_a_messages_flow_becomes_a_chat_completions_flow() -> None:
    flow = messages_flow()
    original = flow.request.body
    Anthropic().request(flow)
    req = flow.request
    assert (
        req.body == original
    )  # the client's bytes stay what they were; what goes upstream is the translation
    assert (
        json.loads(req.upstream_body())
        == req.json()
        == {"model": "claude-x", "messages": BODY["messages"], "max_tokens": 20}
    )
    assert (req.path, req.query_string) == ("/v1/chat/completions", "")
    assert [str(t.url) for t in flow.upstreams] == [
        "http://10.0.0.1:8000/v1/chat/completions",
        "http://10.0.0.2/vllm/v1/chat/completions",
    ]
    assert "anthropic-version" not in req.headers
    assert "anthropic-beta" not in req.headers
    view = flow.metadata[CLIENT_VIEW]
    assert isinstance(view, ClientView)
    assert (view.api, view.request) == ("messages", original)
    assert view.client_id is not None
    assert view.client_id.startswith("msg_")


def test_an_attributed_messages_flow_keeps_its_prefix() -> None:
    flow = messages_flow(path="/r/ro-1/a/at-1/v1/messages")
    Anthropic().request(flow)
    assert flow.request.path == "/r/ro-1/a/at-1/v1/chat/completions"


def test_count_tokens_goes_to_tokenize_beside_v1() -> None:
    flow = messages_flow(path="/v1/messages/count_tokens")
    Anthropic().request(flow)
    assert [str(t.url) for t in flow.upstreams] == [
        "http://10.0.0.1:8000/tokenize",
        "http://10.0.0.2/vllm/tokenize",
    ]
    assert json.loads(flow.request.upstream_body())["add_generation_prompt"] is True
    assert CLIENT_VIEW not in flow.metadata  # not a generation: nothing for capture
    assert flow.request.path == "/v1/messages/count_tokens"


def test_a_bad_request_is_a_400_that_changes_nothing() -> None:
    flow = messages_flow({"model": "claude-x", "messages": BODY["messages"]})
    before = (
        flow.request.upstream_body(),
        flow.request.path,
        [str(t.url) for t in flow.upstreams],
        dict(flow.request.headers),
    )
    with pytest.raises(BadRequest, match="max_tokens"):
        Anthropic().request(flow)
    after = (
        flow.request.upstream_body(),
        flow.request.path,
        [str(t.url) for t in flow.upstreams],
        dict(flow.request.headers),
    )
    assert after == before
    assert CLIENT_VIEW not in flow.metadata


def test_the_billing_header_option_reaches_the_translation() -> None:
    header = {"type": "text", "text": "x-anthropic-billing-header: cch=1;"}
    body = {**BODY, "system": [header]}
    addon = Anthropic()
    addon.configure(None, Anthropic.Options(strip_billing_header=False))  # type: ignore[arg-type]
    flow = messages_flow(body)
    addon.request(flow)
    assert flow.request.json()["messages"][0] == {"role": "system", "content": header["text"]}


def test_the_probe_routes_answer_200_without_a_body() -> None:
    for path in ("/", "/r/ro-1/a/at-1"):
        flow = make_flow("HEAD", path, routes=ROUTES)
        Anthropic().request(flow)
        assert flow.response is not None
        assert (flow.response.status, flow.response.body) == (200, b"")


# --- the response side -----------------------------------------------------------------------------------------------


def test_an_error_the_gateway_answered_is_reshaped_with_its_status_and_headers() -> None:
    flow = messages_flow()
    flow.response = error_response(TooManyRequests("budget spent", headers={"Retry-After": "3"}))
    Anthropic().response_headers(flow)
    assert flow.response.status == 429
    assert flow.response.headers["Retry-After"] == "3"
    assert json.loads(flow.response.body or b"") == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "budget spent"},
    }


def test_an_upstream_error_body_is_reshaped_at_the_end() -> None:
    flow = messages_flow()
    Anthropic().request(flow)
    flow.response = Response(400, CIMultiDict({"Content-Type": "application/json"}), from_upstream=True)
    Anthropic().response_headers(flow)
    (transform,) = flow.response.transforms
    assert transform(b'{"error": {"message": "too long", ') == b""
    assert json.loads(transform(b'"code": 400}}') + transform.flush())["error"] == {
        "type": "invalid_request_error",
        "message": "too long",
    }


def test_models_are_reshaped_only_for_anthropic_clients() -> None:
    listing = {"object": "list", "data": [{"id": "m", "object": "model", "created": 0}]}
    for headers, anthropic in (({"anthropic-version": "2023-06-01"}, True), ({}, False)):
        flow = make_flow("GET", "/v1/models", headers=headers, routes=ROUTES)
        flow.response = Response(200, CIMultiDict(), body=json.dumps(listing).encode())
        Anthropic().response_headers(flow)
        got = json.loads(flow.response.body or b"")
        assert ("has_more" in got) is anthropic


def test_other_routes_are_left_alone() -> None:
    route = HttpRoute("chat_completions", "POST", "/v1/chat/completions", Anthropic.routes[0].scope)
    flow = make_flow("POST", "/v1/chat/completions", json_body={"model": "m"}, routes=(route,))
    flow.response = error_response(ModelNotFound("no"))
    before = flow.response.body
    Anthropic().request(flow)
    Anthropic().response_headers(flow)
    assert flow.response.body == before
    assert not flow.response.transforms


def test_anthropic_sits_after_route_and_before_capture_in_the_default_chain() -> None:
    chain = list(DEFAULT_CHAIN)
    assert chain.index("route") < chain.index("anthropic") < chain.index("capture")


# --- in a real gateway ------------------------------------------------------------------------------------------

REASONING_STREAM = [
    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}], "prompt_token_ids": [1, 2, 3]},
    {"choices": [{"index": 0, "delta": {"reasoning": "Two plus "}, "token_ids": [10]}]},
    {"choices": [{"index": 0, "delta": {"reasoning": "three."}, "token_ids": [11]}]},
    {"choices": [{"index": 0, "delta": {"content": "5"}, "token_ids": [12]}]},
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "stop_reason": None, "token_ids": [2]}]},
    {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}},
]


class Replay:
    """A vLLM-shaped upstream that streams a fixed answer (with reasoning, which the mock vLLM does not produce)."""

    def __init__(self) -> None:
        self.bodies: list[Any] = []
        self.paths: list[str] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.bodies.append(await request.json())
        self.paths.append(request.path_qs)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        head = {"id": "chatcmpl-r", "object": "chat.completion.chunk", "created": 1, "model": "served"}
        for chunk in REASONING_STREAM:
            await resp.write(b"data: " + json.dumps({**head, **chunk}).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp


@dataclass
class Setup:
    gateway: Gateway
    replay: Replay
    probe: FlowRecorder

    @property
    def store(self) -> Store:
        return self.gateway.addons.ctx.services.require(STORE, by="test")

    async def post(self, path: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        hdrs = {"x-api-key": ADMIN_KEY, "anthropic-version": "2023-06-01", **(headers or {})}
        async with (
            aiohttp.ClientSession() as s,
            s.post(gateway_url(self.gateway) + path, json=body, headers=hdrs) as r,
        ):
            return r.status, await r.read()


CHAIN = ("store", "auth", "route", "anthropic", "capture", "sink")


@pytest.fixture
async def setup(gateway_factory: GatewayFactory) -> AsyncIterator[Setup]:
    replay, probe = Replay(), FlowRecorder()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", replay.handle)
    async with (
        serve_app(app) as url,
        gateway_factory(
            {"qwen": [url + "/v1"]},
            aliases={"qwen": ["claude-x"]},
            chain=CHAIN,
            addons={"store": {"backend": "memory"}},
            extra_addons=[probe],
        ) as gw,
    ):
        yield Setup(gw, replay, probe)


def sse_events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in raw.decode().split("\n\n")[:-1]:
        name, data = block.split("\n")
        out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


async def test_reasoning_streams_as_a_thinking_block_and_the_record_keeps_both_views(setup: Setup) -> None:
    status, raw = await setup.post("/v1/messages?beta=true", {**BODY, "stream": True})
    assert status == 200
    evs = sse_events(raw)
    deltas = [d["delta"] for n, d in evs if n == "content_block_delta"]
    assert deltas == [
        {"type": "thinking_delta", "thinking": "Two plus "},
        {"type": "thinking_delta", "thinking": "three."},
        {"type": "text_delta", "text": "5"},
    ]
    assert [n for n, _ in evs][:2] == ["message_start", "ping"]
    assert setup.replay.paths == ["/v1/chat/completions"]  # no ?beta=true upstream
    rec = await setup.probe.record()
    assert (rec.api, rec.outcome, rec.requested_model, rec.model) == (
        "messages",
        CallOutcome.OK,
        "claude-x",
        "qwen",
    )
    assert rec.request == {**BODY, "stream": True}
    assert rec.upstream_request["messages"] == BODY["messages"]
    assert rec.upstream_request["stream_options"] == {"include_usage": True}
    assert rec.client_response["content"] == [
        {"type": "thinking", "thinking": "Two plus three.", "signature": ""},
        {"type": "text", "text": "5"},
    ]
    start = evs[0][1]["message"]
    assert rec.client_id == start["id"] == rec.client_response["id"]
    assert rec.response_id == "chatcmpl-r"
    assert rec.prompt_token_ids is not None
    assert rec.prompt_token_ids.tolist() == [1, 2, 3]
    assert rec.choices[0].token_ids.tolist() == [10, 11, 12, 2]
    (stored,) = await setup.store.calls(None)
    assert stored.to_json() == rec.to_json()  # both views survive the store


async def test_an_unknown_model_is_an_anthropic_404_and_a_rejected_messages_record(setup: Setup) -> None:
    status, raw = await setup.post("/v1/messages", {**BODY, "model": "gpt-9"})
    assert status == 404
    assert json.loads(raw)["error"]["type"] == "not_found_error"
    rec = await setup.probe.record()
    assert (rec.api, rec.outcome, rec.status) == ("messages", CallOutcome.REJECTED, 404)
    assert rec.request == {**BODY, "model": "gpt-9"}
    assert rec.upstream_request is None
    assert rec.client_response is None
    assert setup.replay.bodies == []


@pytest.mark.parametrize(
    ("body", "raw"),
    [({"model": "claude-x", "messages": [{"role": "user", "content": "hi"}]}, None), (None, b"{not json")],
)
async def test_bad_input_is_an_anthropic_400_and_a_rejected_record(
    setup: Setup, body: Any, raw: bytes | None
) -> None:
    headers = {"x-api-key": ADMIN_KEY, "Content-Type": "application/json"}
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            gateway_url(setup.gateway) + "/v1/messages", data=raw or json.dumps(body), headers=headers
        ) as r,
    ):
        status, answer = r.status, await r.json()
    assert status == 400
    assert answer["type"] == "error"
    assert answer["error"]["type"] == "invalid_request_error"
    rec = await setup.probe.record()
    assert (rec.api, rec.outcome) == ("messages", CallOutcome.REJECTED)
    assert setup.replay.bodies == []


async def test_a_wrong_key_is_an_anthropic_401_and_leaves_no_record(setup: Setup) -> None:
    status, raw = await setup.post("/v1/messages", BODY, headers={"x-api-key": "wrong-key-0123456789"})
    assert (status, json.loads(raw)["error"]["type"]) == (401, "authentication_error")
    (flow,) = await setup.probe.wait()
    assert "capture.record" not in flow.metadata


async def test_the_probe_needs_no_key(setup: Setup) -> None:
    async with aiohttp.ClientSession() as s:
        for path in ("/", "/r/ro-1/a/at-1"):
            async with s.head(gateway_url(setup.gateway) + path) as r:
                assert r.status == 200


async def test_the_end_of_the_stream_waits_for_the_commit(gateway_factory: GatewayFactory) -> None:
    store = GatedStore()
    async with (
        running_mock(MockVLLM(("smollm2",))) as url,
        gateway_factory(
            {"smollm2": [url]},
            chain=("auth", "route", "anthropic", "capture", "sink"),
            extra_addons=[ProvideStore(store)],
        ) as gw,
        aiohttp.ClientSession() as s,
        s.post(
            gateway_url(gw) + "/v1/messages",
            json={**BODY, "model": "smollm2", "stream": True},
            headers={"x-api-key": ADMIN_KEY},
        ) as r,
    ):
        first = await asyncio.wait_for(r.content.readuntil(b"\n\n"), 5)
        assert first.startswith(b"event: message_start")
        await asyncio.wait_for(store.waiting.wait(), 5)  # the sink is committing
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(r.content.readuntil(b"event: message_stop"), 0.3)
        store.gate.set()
        rest = await asyncio.wait_for(r.content.read(), 5)
        assert rest.endswith(b'event: message_stop\ndata: {"type":"message_stop"}\n\n')
    (call,) = await store.calls(None)
    assert (call.api, call.outcome) == ("messages", CallOutcome.OK)
