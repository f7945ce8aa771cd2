"""The responses addon: how it rewrites a flow (body, path, targets) and leaves a bad one as it came; and, in a
real gateway, the commit point (the stream's end waits for the record; a record that cannot be committed fails the
response), errors in the Responses shape, a call refused before its translation still recorded."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from yarl import URL

from agl_lite.addons.responses import Responses
from agl_lite.capture.client_view import CLIENT_VIEW, ClientView
from agl_lite.core.flow import Flow, UpstreamTarget
from agl_lite.errors import BadRequest, InsufficientStorage
from agl_lite.store.records import CallOutcome
from agl_lite.testing import MockVLLM, Scenario, running_mock
from agl_lite.testing.flows import make_flow
from tests.conftest import ADMIN_KEY, GatewayFactory, gateway_url
from tests.integration.test_commit_point import GatedStore, ProvideStore

BODY = {"model": "gpt-5", "input": "hi", "instructions": "Be brief."}
CHAIN = ("auth", "route", "responses", "capture", "sink")


def responses_flow(body: Any = None, path: str = "/v1/responses") -> Flow:
    flow = make_flow("POST", path, json_body=BODY if body is None else body, routes=Responses.routes)
    flow.upstreams = [
        UpstreamTarget(URL(base + "/responses", encoded=True), name=base)
        for base in ("http://10.0.0.1:8000/v1", "http://10.0.0.2/vllm/v1")
    ]
    return flow


async def test_a_responses_flow_becomes_a_chat_completions_flow() -> None:
    flow = responses_flow(path="/r/ro-1/a/at-1/v1/responses")
    original = flow.request.body
    await Responses().request(flow)
    req = flow.request
    assert req.path == "/r/ro-1/a/at-1/v1/chat/completions"
    assert [str(t.url) for t in flow.upstreams] == [
        "http://10.0.0.1:8000/v1/chat/completions",
        "http://10.0.0.2/vllm/v1/chat/completions",
    ]
    assert json.loads(req.upstream_body())["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]
    view = flow.metadata[CLIENT_VIEW]
    assert isinstance(view, ClientView)
    assert (view.api, view.request, req.body) == ("responses", original, original)
    assert view.client_id is not None
    assert view.client_id.startswith("resp_")


async def test_a_bad_request_is_a_400_that_changes_nothing() -> None:
    flow = responses_flow({"model": "gpt-5", "input": "hi", "tools": [{"type": "web_search"}]})
    before = (flow.request.upstream_body(), flow.request.path, [str(t.url) for t in flow.upstreams])
    with pytest.raises(BadRequest, match=r"tools\[0\].type"):
        await Responses().request(flow)
    assert (flow.request.upstream_body(), flow.request.path, [str(t.url) for t in flow.upstreams]) == before
    assert CLIENT_VIEW not in flow.metadata


async def test_the_end_of_the_stream_waits_for_the_commit(gateway_factory: GatewayFactory) -> None:
    store = GatedStore()
    mock = MockVLLM(("smollm2",))
    mock.enqueue(Scenario(content="Hello there."), times=None)
    async with (
        running_mock(mock) as url,
        gateway_factory({"smollm2": [url]}, chain=CHAIN, extra_addons=[ProvideStore(store)]) as gw,
        aiohttp.ClientSession() as s,
        s.post(
            gateway_url(gw) + "/v1/responses",
            json={**BODY, "model": "smollm2", "stream": True},
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        ) as r,
    ):
        first = await asyncio.wait_for(r.content.readuntil(b"\n\n"), 5)
        assert first.startswith(b"event: response.created")
        await asyncio.wait_for(store.waiting.wait(), 5)  # the sink is committing
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(r.content.readuntil(b"event: response.completed"), 0.3)
        store.gate.set()
        rest = await asyncio.wait_for(r.content.read(), 5)
        assert b"event: response.completed" in rest
    (call,) = await store.calls(None)
    assert (call.api, call.outcome) == ("responses", CallOutcome.OK)
    assert call.client_response["status"] == "completed"


class FullStore(GatedStore):
    """A store whose disk is full: no record can be committed."""

    async def _write(self, fn: Any) -> Any:
        raise InsufficientStorage("the store's disk is full; nothing was written, retry later")


@pytest.mark.parametrize("stream", [True, False])
async def test_a_record_that_cannot_be_committed_fails_the_response(
    gateway_factory: GatewayFactory, stream: bool
) -> None:
    mock = MockVLLM(("smollm2",))
    mock.enqueue(Scenario(content="Hello there."), times=None)
    async with (
        running_mock(mock) as url,
        gateway_factory({"smollm2": [url]}, chain=CHAIN, extra_addons=[ProvideStore(FullStore())]) as gw,
        aiohttp.ClientSession() as s,
        s.post(
            gateway_url(gw) + "/v1/responses",
            json={**BODY, "model": "smollm2", "stream": stream},
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        ) as r,
    ):
        raw = await r.read()
    if stream:
        assert b"response.completed" not in raw
        assert raw.rstrip().splitlines()[-2] == b"event: response.failed"
    else:
        assert r.status == 507
        error = json.loads(raw)["error"]
        assert (error["type"], error["message"]) == (
            "server_error",
            "the store's disk is full; nothing was written, retry later",
        )


async def test_an_unknown_model_is_refused_in_the_responses_shape_and_recorded(
    gateway_factory: GatewayFactory,
) -> None:
    store = GatedStore()
    store.gate.set()
    async with (
        running_mock(MockVLLM(("smollm2",))) as url,
        gateway_factory({"smollm2": [url]}, chain=CHAIN, extra_addons=[ProvideStore(store)]) as gw,
        aiohttp.ClientSession() as s,
        s.post(
            gateway_url(gw) + "/v1/responses", json=BODY, headers={"Authorization": f"Bearer {ADMIN_KEY}"}
        ) as r,
    ):
        assert r.status == 404
        error = (await r.json())["error"]
    assert error["type"] == "invalid_request_error"
    assert "gpt-5" in error["message"]
    (call,) = await store.calls(None)
    assert (call.api, call.outcome) == ("responses", CallOutcome.REJECTED)
