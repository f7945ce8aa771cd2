"""The record of a finished flow: one per call, in order, none for the gateway's own refusals."""

from __future__ import annotations

import itertools

from multidict import CIMultiDict

from agl_lite.addons.router import Router
from agl_lite.capture.plan import NOTHING
from agl_lite.capture.record import MAX_FAILED_REQUEST_BYTES, api_of, new_call, record_of
from agl_lite.core.flow import Response, json_response
from agl_lite.store.records import CallOutcome
from agl_lite.testing.flows import make_flow

CHAT = "/v1/chat/completions"


def test_the_api_is_known_from_an_llm_routes_path_and_nothing_else_is_captured() -> None:
    paths = [("POST", CHAT), ("POST", "/v1/completions"), ("GET", "/v1/models")]
    apis = [api_of(make_flow(m, p, json_body={}, routes=Router.routes)) for m, p in paths]
    assert apis == ["chat", "completions", None]


def test_order_keys_increase_even_for_a_call_dated_before_the_last_one() -> None:
    first = new_call("chat", b"{}", NOTHING)
    late = new_call("chat", b"{}", NOTHING, at_ns=1, forwarded=False)  # answered before capture saw it
    keys = [first.order_key, late.order_key, *(new_call("chat", b"{}", NOTHING).order_key for _ in range(20))]
    assert all(a < b for a, b in itertools.pairwise(keys))


def test_the_gateways_own_refusal_before_any_upstream_leaves_no_record() -> None:
    flow = make_flow("POST", CHAT, json_body={"model": "m"}, routes=Router.routes)
    call = new_call("chat", flow.request.body, NOTHING)
    flow.response = json_response(429, {"error": {"type": "rate_limited", "message": "over budget"}})
    assert record_of(flow, call, None) is None
    flow.response = json_response(404, {"error": {"type": "model_not_found", "message": "no model m"}})
    rec = record_of(flow, call, None)
    assert rec is not None
    assert (rec.outcome, rec.error) == (CallOutcome.REJECTED, "model_not_found: no model m")


def test_a_failed_call_keeps_no_large_request() -> None:
    big = {"model": "m", "messages": [{"role": "user", "content": "x" * MAX_FAILED_REQUEST_BYTES}]}
    flow = make_flow("POST", CHAT, json_body=big, routes=Router.routes)
    call = new_call("chat", flow.request.body, NOTHING)
    flow.response = Response(502, CIMultiDict(), body=b"{}", from_upstream=True)
    rec = record_of(flow, call, None)
    assert rec is not None
    assert rec.outcome is CallOutcome.UPSTREAM_ERROR
    assert rec.request == {
        "omitted": "the request of a call that did not succeed",
        "bytes": len(call.original),
    }
