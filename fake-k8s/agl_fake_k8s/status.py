"""Kubernetes `Status` bodies and the one exception that carries them, shaped like a real API server's.

Every refusal of the fake API server is an `ApiError` built here, so the status code, `reason`, `details`
(group, plural-or-Kind, name, causes) and the message wording stay in one place.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from agl_fake_k8s.resources import Resource

__all__ = [
    "ApiError",
    "FieldError",
    "already_exists",
    "bad_request",
    "conflict",
    "expired",
    "invalid",
    "method_not_allowed",
    "not_found",
    "path_not_found",
    "success",
    "too_many_requests",
    "unauthorized",
    "unsupported_media_type",
]

_CAUSES = {
    "Invalid value": "FieldValueInvalid",
    "Required value": "FieldValueRequired",
    "Duplicate value": "FieldValueDuplicate",
    "Not found": "FieldValueNotFound",
    "Unsupported value": "FieldValueNotSupported",
    "Forbidden": "FieldValueForbidden",
    "Too long": "FieldValueTooLong",
}
_VALUE_LESS = {"Required value", "Forbidden", "Too long"}


class ApiError(Exception):
    """A request the API server refuses: answered with `status` as the HTTP code and `body()` as JSON."""

    def __init__(
        self,
        status: int,
        reason: str,
        message: str,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message
        self.details = details
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
        body["message"] = self.message
        body["reason"] = self.reason
        if self.details is not None:
            body["details"] = self.details
        body["code"] = self.status
        return body


def go_quote(value: Any) -> str:
    """A value the way Go's %v/%q prints it in a field error (strings quoted, numbers bare)."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class FieldError:
    """One field validation error, as apimachinery's field.Error prints it."""

    kind: str
    """"Invalid value", "Required value", "Duplicate value", "Not found", "Unsupported value", "Forbidden"."""
    field: str
    value: Any = None
    detail: str = ""

    def body(self) -> str:
        text = self.kind if self.kind in _VALUE_LESS else f"{self.kind}: {go_quote(self.value)}"
        return f"{text}: {self.detail}" if self.detail else text

    def __str__(self) -> str:
        return f"{self.field}: {self.body()}"


def _details(resource: Resource, name: str, *, kind: str | None = None) -> dict[str, Any]:
    details: dict[str, Any] = {"name": name}
    if resource.group:
        details["group"] = resource.group
    details["kind"] = kind or resource.plural
    return details


def not_found(resource: Resource, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{resource.qualified} "{name}" not found', _details(resource, name))


def already_exists(resource: Resource, name: str) -> ApiError:
    message = f'{resource.qualified} "{name}" already exists'
    return ApiError(409, "AlreadyExists", message, _details(resource, name))


def conflict(resource: Resource, name: str, why: str) -> ApiError:
    message = f'Operation cannot be fulfilled on {resource.qualified} "{name}": {why}'
    return ApiError(409, "Conflict", message, _details(resource, name))


def invalid(resource: Resource, name: str, errors: list[FieldError]) -> ApiError:
    """422 Invalid: one error bare, several in brackets; one cause per error (duplicates merged, as Go does)."""
    texts = list(dict.fromkeys(str(e) for e in errors))
    joined = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    message = f'{resource.qualified_kind} "{name}" is invalid: {joined}'
    details = _details(resource, name, kind=resource.kind)
    details["causes"] = [
        {"reason": _CAUSES.get(e.kind, "FieldValueInvalid"), "message": e.body(), "field": e.field}
        for e in errors
    ]
    return ApiError(422, "Invalid", message, details)


def expired(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


def too_many_requests(retry_after_s: int) -> ApiError:
    """What API Priority and Fairness answers when it sheds a request."""
    return ApiError(
        429,
        "TooManyRequests",
        "Too many requests, please try again later.",
        {"retryAfterSeconds": retry_after_s},
        headers={"Retry-After": str(retry_after_s)},
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def unauthorized() -> ApiError:
    return ApiError(401, "Unauthorized", "Unauthorized")


def method_not_allowed() -> ApiError:
    return ApiError(
        405, "MethodNotAllowed", "the server does not allow this method on the requested resource", {}
    )


def path_not_found() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource", {})


def unsupported_media_type(accepted: list[str]) -> ApiError:
    message = f"the body of the request was in an unknown format - accepted media types include: {', '.join(accepted)}"
    return ApiError(415, "UnsupportedMediaType", message, {})


def success(resource: Resource, name: str, uid: str) -> dict[str, Any]:
    """The body of a delete that removed an object whose registry does not return it (Jobs, Secrets)."""
    details = _details(resource, name)
    details["uid"] = uid
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}
