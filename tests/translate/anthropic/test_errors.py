"""Error bodies of the gateway and of the upstream, reshaped into Anthropic error objects the SDK validates."""

from __future__ import annotations

import json

import pytest
from anthropic.types.shared import ErrorResponse

from agl_lite.errors import ModelNotFound, TooManyRequests
from agl_lite.translate.anthropic.errors import error_event, error_status, error_type, reshape_error


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (409, "invalid_request_error"),
        (413, "request_too_large"),
        (422, "invalid_request_error"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (502, "api_error"),
        (503, "overloaded_error"),
        (504, "timeout_error"),
        (529, "overloaded_error"),
    ],
)
def test_error_type_of_each_status(status: int, kind: str) -> None:
    assert error_type(status) == kind


def test_a_gateway_error_keeps_its_message_and_validates_with_the_sdk() -> None:
    err = ModelNotFound("model 'x' is not routed here", param="model", known_models=["m"])
    body = json.loads(reshape_error(err.status, json.dumps(err.body()).encode()))
    assert body == {
        "type": "error",
        "error": {"type": "not_found_error", "message": "model 'x' is not routed here"},
    }
    ErrorResponse.model_validate(body)


def test_vllms_error_shapes_keep_their_message() -> None:
    new = {
        "error": {"message": "max_tokens is too large", "type": "BadRequestError", "param": None, "code": 400}
    }
    old = {"object": "error", "message": "max_tokens is too large", "type": "BadRequestError", "code": 400}
    for body in (new, old):
        got = json.loads(reshape_error(400, json.dumps(body).encode()))
        assert got["error"] == {"type": "invalid_request_error", "message": "max_tokens is too large"}


def test_a_body_that_is_not_json_becomes_the_message() -> None:
    got = json.loads(reshape_error(502, b"Bad Gateway"))
    assert got["error"] == {"type": "api_error", "message": "Bad Gateway"}
    assert json.loads(reshape_error(500, b""))["error"]["message"] == "HTTP 500"


def test_an_anthropic_error_stays_as_it_is() -> None:
    body = {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}
    assert json.loads(reshape_error(429, json.dumps(body).encode())) == body


def test_error_event_is_an_sse_error_event() -> None:
    raw = error_event(TooManyRequests.status, "budget spent")
    name, data = raw.decode().removesuffix("\n\n").split("\n")
    assert name == "event: error"
    assert json.loads(data.removeprefix("data: "))["error"] == {
        "type": "rate_limit_error",
        "message": "budget spent",
    }


def test_in_band_error_status_comes_from_its_code() -> None:
    assert error_status({"error": {"code": 503}}, 500) == 503
    assert error_status({"error": {"code": "oops"}}, 500) == 500
    assert error_status({"error": "text"}, 502) == 502
