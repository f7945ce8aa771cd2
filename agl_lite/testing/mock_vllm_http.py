"""HTTP plumbing shared by the mock vLLM's handlers: JSON replies, vLLM error bodies, body reading and checks.

It owns how the mock reads requests and writes non-streamed replies; it must not hold mock state.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from agl_lite.testing.mock_vllm_scenario import ErrorReply

__all__ = [
    "ApiError",
    "RecordedRequest",
    "check_model",
    "error_response",
    "int_field",
    "json_response",
    "read_json",
]

_JSON_HEADERS = {"Content-Type": "application/json"}


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    path: str
    headers: dict[str, str]
    body: Any
    """Parsed JSON, or the raw text when it was not JSON."""


class ApiError(Exception):
    """A request vLLM would refuse; answered with its error body."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.reply = ErrorReply(status=status, message=message, param=param)


def json_response(body: Any, status: int = 200) -> web.Response:
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":"))  # vLLM's compact, UTF-8 bodies
    return web.Response(status=status, text=text, headers=_JSON_HEADERS)


def error_response(reply: ErrorReply) -> web.Response:
    return json_response(reply.to_body(), reply.status)


def int_field(body: dict[str, Any], key: str, default: int | None) -> int | None:
    value = body.get(key, default)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise ApiError(400, f"{key} must be an integer, got {value!r}", key)
    return value


async def read_json(request: web.Request, record: Callable[[RecordedRequest], None]) -> dict[str, Any]:
    """The request's JSON object, recorded first (raw text when malformed) so tests see what was sent."""
    raw = await request.read()
    headers = dict(request.headers)
    try:
        body = json.loads(raw)
    except ValueError as exc:
        record(RecordedRequest(request.path, headers, raw.decode("utf-8", "replace")))
        raise ApiError(400, f"JSON decode error: {exc}") from None
    record(RecordedRequest(request.path, headers, body))
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    return body


def check_model(served: Sequence[str], body: dict[str, Any]) -> str:
    model = body.get("model") or served[0]
    if model not in served:
        aliases = ", ".join(served)
        raise ApiError(404, f"The model `{model}` does not exist. Valid aliases: {aliases}.", "model")
    return str(model)
