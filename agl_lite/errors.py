"""The one exception tree of agl-lite; library errors are mapped onto it at the boundary.

    AglLiteError
    ├── ConfigError            bad config file or value; start-up stops with its message
    ├── AddonLoadError         an addon name or "module:Class" string that cannot be resolved
    └── HttpError              answered to the client as JSON {"error": {"type", "message"}}
        ├── BadRequest          400 invalid_request
        ├── Unauthorized        401 unauthorized
        ├── Forbidden           403 forbidden
        ├── NotFound            404 not_found (ModelNotFound: 404 model_not_found)
        ├── MethodNotAllowed    405 method_not_allowed
        ├── BodyTimeout         408 request_timeout (a request body slower than server.body_timeout_s)
        ├── Conflict            409 conflict (an illegal state transition, a cap reached)
        ├── PayloadTooLarge     413 payload_too_large
        ├── UnsupportedMediaType 415 unsupported_media_type (a Content-Encoding other than gzip or deflate)
        ├── TooManyRequests     429 rate_limited
        ├── InternalError       500 internal_error
        ├── UpstreamError       502 upstream_error (UpstreamTimeout: 504 upstream_timeout)
        ├── ServiceUnavailable  503 service_unavailable (held past its bound, the store's queue full, the store's
        │                       database not writable; ShuttingDown: 503 shutting_down)
        └── InsufficientStorage 507 insufficient_storage (the store's disk is full; QuotaExceeded: 507
                                quota_exceeded, a rollout's storage quota is used up)

Each HttpError carries a stable `type` string that clients map on; `message` is for humans and never holds a key.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "AddonLoadError",
    "AglLiteError",
    "BadRequest",
    "BodyTimeout",
    "ConfigError",
    "Conflict",
    "ExpectationFailed",
    "Forbidden",
    "HttpError",
    "InsufficientStorage",
    "InternalError",
    "MethodNotAllowed",
    "ModelNotFound",
    "NotFound",
    "PayloadTooLarge",
    "QuotaExceeded",
    "ServiceUnavailable",
    "ShuttingDown",
    "TooManyRequests",
    "Unauthorized",
    "UnsupportedMediaType",
    "UpstreamError",
    "UpstreamTimeout",
]


class AglLiteError(Exception):
    """Base of every error agl-lite raises on purpose."""


class ConfigError(AglLiteError):
    """A config file or value is invalid; the message names the key and the file."""


class AddonLoadError(ConfigError):
    """An addon name or import string cannot be resolved to a class."""


class HttpError(AglLiteError):
    """An error answered to the HTTP client as a JSON body."""

    status: ClassVar[int] = 500
    type: ClassVar[str] = "internal_error"

    def __init_subclass__(cls, *, status: int | None = None, type: str | None = None, **kwargs: Any) -> None:
        """`class NotFound(HttpError, status=404, type="not_found")`: its status and stable type, declared."""
        super().__init_subclass__(**kwargs)
        if status is not None:
            cls.status = status
        if type is not None:
            cls.type = type

    def __init__(self, message: str, *, headers: dict[str, str] | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}
        self.extra = extra

    def body(self) -> dict[str, Any]:
        """The JSON error body: `{"error": {"type", "message", "code", ...extra}}`."""
        return {"error": {"type": self.type, "message": self.message, "code": self.status, **self.extra}}


class BadRequest(HttpError, status=400, type="invalid_request"): ...


class Unauthorized(HttpError, status=401, type="unauthorized"): ...


class Forbidden(HttpError, status=403, type="forbidden"): ...


class NotFound(HttpError, status=404, type="not_found"): ...


class ModelNotFound(NotFound, type="model_not_found"): ...


class MethodNotAllowed(HttpError, status=405, type="method_not_allowed"): ...


class BodyTimeout(HttpError, status=408, type="request_timeout"):
    """The client's request body did not arrive in time (not to be confused with the client library's
    `agl_lite.client.RequestTimeout`: no answer from the gateway in time)."""


class Conflict(HttpError, status=409, type="conflict"): ...


class PayloadTooLarge(HttpError, status=413, type="payload_too_large"): ...


class UnsupportedMediaType(HttpError, status=415, type="unsupported_media_type"): ...


class ExpectationFailed(HttpError, status=417, type="expectation_failed"): ...


class TooManyRequests(HttpError, status=429, type="rate_limited"): ...


class InternalError(HttpError, status=500, type="internal_error"): ...


class UpstreamError(HttpError, status=502, type="upstream_error"): ...


class UpstreamTimeout(UpstreamError, status=504, type="upstream_timeout"): ...


class ServiceUnavailable(HttpError, status=503, type="service_unavailable"): ...


class ShuttingDown(ServiceUnavailable, type="shutting_down"):
    """The gateway stopped before the exchange ended (its shutdown timeout ran out)."""


class InsufficientStorage(HttpError, status=507, type="insufficient_storage"):
    """The store's disk is full: nothing was written; retry once space is back."""


class QuotaExceeded(InsufficientStorage, type="quota_exceeded"):
    """A rollout has used its storage quota (`[addons.store] max_rollout_bytes`): retrying does not help."""
