"""The client's exceptions: what the server answered (mapped from its JSON error `type`) or why it could not.

    AglLiteError
    └── ClientError                 anything the client raises on purpose
        ├── ConnectionFailed        the server could not be reached (refused, reset, DNS) after the retries
        ├── RequestTimeout          no answer within the timeout
        ├── DrainTimeout            paused(): in-flight calls did not drain in time (the gateway was resumed)
        ├── MissingDependency       an optional extra is not installed (parquet export needs pyarrow)
        └── ApiError                the server answered an error; also an `agl_lite.errors.HttpError`
            ├── BadRequestError      400 invalid_request                       (also errors.BadRequest)
            ├── AuthError            401 unauthorized                          (also errors.Unauthorized)
            ├── ForbiddenError       403 forbidden                             (also errors.Forbidden)
            ├── NotFoundError        404 not_found, model_not_found            (also errors.NotFound)
            ├── ConflictError        409 conflict                              (also errors.Conflict)
            ├── PayloadTooLargeError 413 payload_too_large                     (also errors.PayloadTooLarge)
            ├── RateLimitedError     429 rate_limited                          (also errors.TooManyRequests)
            ├── UnavailableError     503 service_unavailable                   (also errors.ServiceUnavailable)
            └── ServerError          any other 5xx (internal_error, upstream_error, ...)

Each ApiError subclasses the server-side error of the same meaning, so a runner that catches
`agl_lite.errors.Conflict` works the same against the in-process store and against this client.
"""

from __future__ import annotations

from typing import Any

from agl_lite.errors import (
    AglLiteError,
    BadRequest,
    Conflict,
    Forbidden,
    HttpError,
    NotFound,
    PayloadTooLarge,
    ServiceUnavailable,
    TooManyRequests,
    Unauthorized,
)

__all__ = [
    "ApiError",
    "AuthError",
    "BadRequestError",
    "ClientError",
    "ConflictError",
    "ConnectionFailed",
    "DrainTimeout",
    "ForbiddenError",
    "MissingDependency",
    "NotFoundError",
    "PayloadTooLargeError",
    "RateLimitedError",
    "RequestTimeout",
    "ServerError",
    "UnavailableError",
    "error_from_response",
]


class ClientError(AglLiteError):
    """Base of every error the client raises on purpose."""


class ConnectionFailed(ClientError):
    """The server could not be reached (connection refused or reset, name not resolved) after the retries."""


class RequestTimeout(ClientError):
    """The server did not answer within the timeout."""


class DrainTimeout(ClientError):
    """In-flight LLM calls did not drain within the timeout of `paused()`; the gateway was resumed."""

    def __init__(self, message: str, in_flight: int) -> None:
        super().__init__(message)
        self.in_flight = in_flight


class MissingDependency(ClientError):
    """An optional dependency is not installed; the message says which extra to install."""


class ApiError(ClientError, HttpError):
    """The server answered with an error: `status_code`, `error_type` (its stable `type`) and `message`."""

    def __init__(
        self, message: str, *, status_code: int, error_type: str, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.error_type = error_type
        self.retry_after = retry_after
        """Seconds the server asked the client to wait (its Retry-After header), if it said."""

    def __str__(self) -> str:
        return f"{self.error_type} ({self.status_code}): {self.message}"


class BadRequestError(ApiError, BadRequest): ...


class AuthError(ApiError, Unauthorized): ...


class ForbiddenError(ApiError, Forbidden): ...


class NotFoundError(ApiError, NotFound): ...


class ConflictError(ApiError, Conflict): ...


class PayloadTooLargeError(ApiError, PayloadTooLarge): ...


class RateLimitedError(ApiError, TooManyRequests): ...


class UnavailableError(ApiError, ServiceUnavailable): ...


class ServerError(ApiError): ...


_TYPED: tuple[type[ApiError], ...] = (
    BadRequestError,
    AuthError,
    ForbiddenError,
    NotFoundError,
    ConflictError,
    PayloadTooLargeError,
    RateLimitedError,
    UnavailableError,
)
_BY_TYPE: dict[str, type[ApiError]] = {c.type: c for c in _TYPED} | {"model_not_found": NotFoundError}
_BY_STATUS: dict[int, type[ApiError]] = {c.status: c for c in _TYPED}


def _retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None  # an HTTP date: rare enough to fall back on the backoff
    return seconds if seconds >= 0 else None


def error_from_response(status: int, body: Any, retry_after: str | None = None) -> ApiError:
    """The typed error for an error answer: by the JSON `type` when the body has one, else by status."""
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        error_type = str(error.get("type") or "")
        message = str(error.get("message") or "")
    else:
        error_type, message = "", body if isinstance(body, str) else ""
    cls = _BY_TYPE.get(error_type) or _BY_STATUS.get(status)
    if cls is None:
        cls = ServerError if status >= 500 else ApiError
    return cls(
        message.strip()[:2000] or f"HTTP {status}",
        status_code=status,
        error_type=error_type or f"http_{status}",
        retry_after=_retry_after(retry_after),
    )
