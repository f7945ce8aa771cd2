"""The Flow: the one object that travels through the addon chain for each HTTP exchange.

It owns the request (parsed JSON cached once), the response (status, headers, a body or a stream with its taps and
transforms), the upstream plan, error, timings and namespaced metadata. It must not do I/O.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from multidict import CIMultiDict
from yarl import URL

from agl_lite.core import json_limits
from agl_lite.errors import BadRequest, HttpError

if TYPE_CHECKING:
    from agl_lite.core.routes import HttpRoute

__all__ = [
    "Flow",
    "Request",
    "Response",
    "Tap",
    "Transform",
    "UpstreamObserver",
    "UpstreamTarget",
    "WholeBody",
    "flush_transforms",
    "json_response",
]

_flow_ids = itertools.count(1)

Tap = Callable[[bytes], None]
"""Sees each upstream chunk exactly as it arrived; must be cheap and must not keep the bytes from the client."""


class Transform(Protocol):
    """Rewrites what the client receives, chunk by chunk; never holds bytes beyond the current SSE event."""

    def __call__(self, chunk: bytes) -> bytes: ...

    def flush(self) -> bytes:
        """Bytes still owed to the client when the upstream body ends (before the final bytes are written)."""
        ...


class WholeBody:
    """Transform for a plain (non-streamed) body: held until `flush()`, then converted in one go (its last chunk
    waits for `response_end` anyway, so holding the rest costs the client nothing)."""

    __slots__ = ("_convert", "_parts")

    def __init__(self, convert: Callable[[bytes], bytes]) -> None:
        self._convert = convert
        self._parts: list[bytes] = []

    def __call__(self, chunk: bytes) -> bytes:
        self._parts.append(chunk)
        return b""

    def flush(self) -> bytes:
        body = b"".join(self._parts)
        self._parts.clear()
        return self._convert(body)


def flush_transforms(transforms: list[Transform]) -> bytes:
    """What the transforms still owe at the end of the body: each one's leftovers go through those after it
    before they are flushed in turn."""
    out = b""
    for i, t in enumerate(transforms):
        owed = t.flush()
        for later in transforms[i + 1 :]:
            if owed:
                owed = later(owed)
        out += owed
    return out


class UpstreamObserver(Protocol):
    """Told about each upstream attempt so a router can count in-flight calls and cool failing upstreams down."""

    def attempt_started(self, target: UpstreamTarget) -> None: ...

    def attempt_ended(self, target: UpstreamTarget, *, ok: bool) -> None: ...


@dataclass(slots=True, eq=False)
class UpstreamTarget:
    """One place the core may forward the request to; a flow holds them in the order to try."""

    url: URL
    """Full URL of the upstream endpoint for this request (query string included)."""
    headers: dict[str, str] = field(default_factory=dict)
    """Headers set on the upstream request (the upstream's own credential); they replace the client's."""
    json_patch: dict[str, Any] | None = None
    """Top-level JSON fields overridden for this target only (e.g. the served model name)."""
    name: str = ""
    """Short label for logs and records (e.g. the upstream's base URL)."""
    observer: UpstreamObserver | None = None


@dataclass(slots=True, eq=False)
class Request:
    method: str
    path: str
    query_string: str
    headers: CIMultiDict[str]
    body: bytes
    path_params: Mapping[str, str] = field(default_factory=dict)
    _json: Any = None
    _json_loaded: bool = False
    _json_dirty: bool = False

    def json(self) -> Any:
        """The body parsed as JSON, once; invalid JSON is a 400."""
        if not self._json_loaded:
            if not self.body:
                raise BadRequest("request body is empty; a JSON body is required")
            self._json = json_limits.loads(self.body)
            self._json_loaded = True
        return self._json

    def json_object(self) -> dict[str, Any]:
        """The body as a JSON object; anything else is a 400."""
        obj = self.json()
        if not isinstance(obj, dict):
            raise BadRequest("request body must be a JSON object")
        return obj

    def mark_json_changed(self) -> None:
        """Call after mutating the object returned by `json()`; the body is re-serialised once, at forward time."""
        self._json_dirty = True

    def upstream_body(self, patch: dict[str, Any] | None = None) -> bytes:
        """The bytes to send upstream: the original body unless the JSON was changed or a patch applies."""
        if patch:
            return json.dumps({**self.json_object(), **patch}, separators=(",", ":")).encode()
        if self._json_dirty:
            self.body = json.dumps(self._json, separators=(",", ":")).encode()
            self._json_dirty = False
        return self.body


@dataclass(slots=True, eq=False)
class Response:
    status: int
    headers: CIMultiDict[str]
    body: bytes | None = None
    """The whole body for short-circuit responses; None while (or when) the body is streamed."""
    is_event_stream: bool = False
    from_upstream: bool = False
    taps: list[Tap] = field(default_factory=list)
    transforms: list[Transform] = field(default_factory=list)


def json_response(status: int, obj: Any, headers: Mapping[str, str] | None = None) -> Response:
    """A short-circuit JSON response."""
    hdrs: CIMultiDict[str] = CIMultiDict({"Content-Type": "application/json"})
    if headers:
        hdrs.update(headers)
    return Response(status=status, headers=hdrs, body=json.dumps(obj).encode())


def error_response(exc: HttpError) -> Response:
    """The JSON response for an HttpError."""
    return json_response(exc.status, exc.body(), exc.headers)


@dataclass(slots=True, eq=False)
class Flow:
    """One HTTP exchange. Addons share data only through its fields and namespaced `metadata` keys."""

    request: Request
    route: HttpRoute
    id: int = field(default_factory=lambda: next(_flow_ids))
    response: Response | None = None
    error: HttpError | None = None
    """Set when the exchange failed (upstream down, reset mid-stream, timeout); the client saw an error."""
    client_disconnected: bool = False
    upstreams: list[UpstreamTarget] = field(default_factory=list)
    """Where to forward, in order; the core tries the next one only before any byte reached the client."""
    upstream: UpstreamTarget | None = None
    """The target being tried, then the one that answered (or the last one that failed)."""
    retried: list[tuple[str, str]] = field(default_factory=list)
    """(upstream name, error type) of each attempt that failed and that a later target replaced: the flow may
    end well, and those failures still count (metrics)."""
    ended: bool = False
    """`response_end` or `error` has fired: the core fires `error` for a flow that ends without either."""
    abort_error: HttpError | None = None
    """Why the gateway cut the flow (`abort`): its client's answer and its record's error."""
    canceller: Callable[[], object] | None = None
    """Set by the core: stops the flow's handling wherever it waits."""
    metadata: dict[str, Any] = field(default_factory=dict)
    t_start: float = field(default_factory=time.monotonic)
    t_start_wall: float = field(default_factory=time.time)
    t_first_byte: float | None = None
    t_end: float | None = None
    bytes_to_client: int = 0

    def abort(self, error: HttpError) -> None:
        """Cut the flow now, wherever it is (an addon, the upstream's headers, mid-stream), unless it reached its
        end: the upstream is dropped and the client gets `error` (an error event mid-stream). A rollout that ended
        cuts its calls in flight this way."""
        if self.ended or self.abort_error is not None:
            return
        self.abort_error = error
        if self.canceller is not None:
            self.canceller()
