"""The agl-lite client: the store API and gateway controls over HTTP (async `AglLiteClient`, and
`SyncAglLiteClient` for scripts and notebooks). The `agl-client` CLI lives in `agl_lite.client.cli`."""

from agl_lite.client.client import AglLiteClient
from agl_lite.client.completions import Completions
from agl_lite.client.errors import (
    ApiError,
    AuthError,
    BadRequestError,
    ClientError,
    ConflictError,
    ConnectionFailed,
    DrainTimeout,
    ForbiddenError,
    NotFoundError,
    PayloadTooLargeError,
    RateLimitedError,
    RequestTimeout,
    ServerError,
    UnavailableError,
)
from agl_lite.client.results import AttemptEnv, GatewayState, StartedAttempt, WaitResult
from agl_lite.client.retry import RetryPolicy
from agl_lite.client.settings import Timeouts
from agl_lite.client.sync import SyncAglLiteClient

__all__ = [
    "AglLiteClient",
    "ApiError",
    "AttemptEnv",
    "AuthError",
    "BadRequestError",
    "ClientError",
    "Completions",
    "ConflictError",
    "ConnectionFailed",
    "DrainTimeout",
    "ForbiddenError",
    "GatewayState",
    "NotFoundError",
    "PayloadTooLargeError",
    "RateLimitedError",
    "RequestTimeout",
    "RetryPolicy",
    "ServerError",
    "StartedAttempt",
    "SyncAglLiteClient",
    "Timeouts",
    "UnavailableError",
    "WaitResult",
]
