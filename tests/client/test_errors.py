"""The server's JSON error `type` maps onto the client's typed errors, which are also the server's own classes."""

from __future__ import annotations

import pytest

from agl_lite import errors
from agl_lite.client import errors as client_errors
from agl_lite.client.errors import ApiError, error_from_response


def body(error_type: str, message: str = "why") -> dict[str, object]:
    return {"error": {"type": error_type, "message": message, "code": 0}}


@pytest.mark.parametrize(
    ("status", "error_type", "cls", "server_cls"),
    [
        (400, "invalid_request", client_errors.BadRequestError, errors.BadRequest),
        (401, "unauthorized", client_errors.AuthError, errors.Unauthorized),
        (403, "forbidden", client_errors.ForbiddenError, errors.Forbidden),
        (404, "not_found", client_errors.NotFoundError, errors.NotFound),
        (404, "model_not_found", client_errors.NotFoundError, errors.NotFound),
        (409, "conflict", client_errors.ConflictError, errors.Conflict),
        (413, "payload_too_large", client_errors.PayloadTooLargeError, errors.PayloadTooLarge),
        (429, "rate_limited", client_errors.RateLimitedError, errors.TooManyRequests),
        (503, "service_unavailable", client_errors.UnavailableError, errors.ServiceUnavailable),
        (502, "upstream_error", client_errors.ServerError, errors.HttpError),
        (500, "internal_error", client_errors.ServerError, errors.HttpError),
    ],
)
def test_error_type_maps_to_its_class(
    status: int, error_type: str, cls: type[ApiError], server_cls: type[errors.HttpError]
) -> None:
    exc = error_from_response(status, body(error_type))
    assert type(exc) is cls
    assert isinstance(exc, server_cls)
    assert isinstance(exc, client_errors.ClientError)
    assert (exc.status_code, exc.error_type, exc.message) == (status, error_type, "why")


def test_a_body_without_a_type_maps_by_status() -> None:
    assert type(error_from_response(409, "plain text")) is client_errors.ConflictError
    assert type(error_from_response(504, None)) is client_errors.ServerError
    assert type(error_from_response(418, {})) is ApiError


def test_retry_after_seconds_are_kept() -> None:
    assert error_from_response(503, body("service_unavailable"), "7").retry_after == 7.0
    assert (
        error_from_response(503, body("service_unavailable"), "Wed, 21 Oct 2026 07:28:00 GMT").retry_after
        is None
    )


def test_message_names_type_and_status() -> None:
    assert str(error_from_response(404, body("not_found", "rollout 'x' not found"))) == (
        "not_found (404): rollout 'x' not found"
    )
