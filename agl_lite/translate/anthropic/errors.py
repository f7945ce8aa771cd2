"""Anthropic error objects: the `error.type` each HTTP status stands for, and any error body of the gateway or of
the upstream (`{"error": {...}}`, vLLM's older `{"object": "error", ...}`) reshaped into
`{"type": "error", "error": {"type", "message"}}`, as a body or as an `event: error` of a stream.
"""

from __future__ import annotations

from typing import Any

import orjson

from agl_lite.core.jsoncodec import loads_or_none

__all__ = ["error_body", "error_event", "error_status", "error_type", "reshape_error"]

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def error_type(status: int) -> str:
    """The Anthropic `error.type` of an HTTP status (other 4xx: `invalid_request_error`, other 5xx: `api_error`)."""
    known = _TYPES.get(status)
    if known is not None:
        return known
    return "invalid_request_error" if status < 500 else "api_error"


def error_body(status: int, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type(status), "message": message}}


def error_event(status: int, message: str) -> bytes:
    """An `event: error` of an Anthropic stream (what the SDKs raise as an API error)."""
    return b"event: error\ndata: " + orjson.dumps(error_body(status, message)) + b"\n\n"


def _message(obj: Any) -> str | None:
    if not isinstance(obj, dict):
        return None
    if obj.get("type") == "error" and isinstance(obj.get("error"), dict):
        obj = obj["error"]  # already Anthropic-shaped
    elif "error" in obj:
        obj = obj["error"]
        if isinstance(obj, str):
            return obj
    msg = obj.get("message") if isinstance(obj, dict) else None
    return msg if isinstance(msg, str) and msg else None


def error_status(obj: Any, default: int) -> int:
    """The HTTP status an in-band error object names (`code`), else `default`."""
    err = obj.get("error") if isinstance(obj, dict) else None
    code = err.get("code") if isinstance(err, dict) else None
    return code if isinstance(code, int) and not isinstance(code, bool) and 400 <= code < 600 else default


def reshape_error(status: int, body: bytes | None) -> bytes:
    """An error body of the gateway or the upstream as an Anthropic error object, keeping its message."""
    obj = loads_or_none(body)
    message = _message(obj)
    if message is None:
        text = (body or b"").decode("utf-8", "replace").strip()
        message = text[:500] if text else f"HTTP {status}"
    return orjson.dumps(error_body(status, message))
