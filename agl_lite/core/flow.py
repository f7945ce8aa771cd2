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

from agl_lite.core import jsoncodec
from agl_lite.errors import BadRequest, HttpError

if TYPE_CHECKING:
    from agl_lite.core.routes import HttpRoute

__all__ = [
    "BodyRefused",
    "Flow",
    "Refuse",
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


# Two optional members, which the core looks up on a transform (`core.server`): `refuse(err)`, the end a client is
# owed in place of its own when the end is refused; and `ended()`, for a translation into a stream without
# `[DONE]`: whether the upstream's `[DONE]` reached it. The core then ends the client's stream there, as at the
# `[DONE]` of a stream it relays as it is: the transforms are flushed, and what they owe (the translation's last
# events) is held until `response_end` (the record) is done.


class BodyRefused(Exception):
    """Raised by a `WholeBody` conversion whose upstream body is not what it converts (a translation given HTML, a
    `204`, a JSON that is no completion): the client gets `status` with `body` (JSON) in place of the upstream's
    status, headers and body."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.body = body


class Refuse:
    """Transform for a body no conversion can read (encoded, say): nothing of it is kept or passed on, and at its
    end the client gets `status` with `body` instead (`BodyRefused`)."""

    __slots__ = ("_body", "_status")

    def __init__(self, status: int, body: bytes) -> None:
        self._status = status
        self._body = body

    def __call__(self, chunk: bytes) -> bytes:
        return b""

    def flush(self) -> bytes:
        raise BodyRefused(self._status, self._body)


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
    """The client's request. It owns the bytes that go upstream: `body` is what the client sent (decoded), and
    addons change what is sent only through `set_fields` and `replace_json`, never by assigning bytes; the body is
    then written again once per upstream attempt, by `core.jsoncodec` (see `upstream_body`)."""

    method: str
    path: str
    query_string: str
    headers: CIMultiDict[str]
    body: bytes
    """The body as the client sent it (after its Content-Encoding was undone); set by the core only."""
    path_params: Mapping[str, str] = field(default_factory=dict)
    # What goes upstream, the request's own business (not constructor arguments):
    # the JSON parsed once, and whether the stdlib parser read it (then the stdlib encoder writes it back);
    _json: Any = field(default=None, init=False)
    _json_loaded: bool = field(default=False, init=False)
    _python_only: bool = field(default=False, init=False)
    # the bytes changes apply to (`body`, or a replacement's), the members set on top of them, and whether none of
    # those was in its object (then they are spliced into its bytes);
    _base: bytes | None = field(default=None, init=False)
    _fields: dict[str, Any] | None = field(default=None, init=False)
    _new: bool = field(default=True, init=False)
    # what goes upstream without any target's fields, once written.
    _encoded: bytes | None = field(default=None, init=False)

    def json(self) -> Any:
        """The client's body as parsed once, with the changes addons made (an upstream target's own fields, such
        as its served model, are not in it); invalid JSON is a 400. Treat it as read-only: change it through
        `set_fields` or `replace_json`."""
        if not self._json_loaded:
            if not self.body:
                raise BadRequest("request body is empty; a JSON body is required")
            self._json, self._python_only = jsoncodec.parse(self.body)
            self._json_loaded = True
        return self._json

    @property
    def python_only(self) -> bool:
        """Whether the stdlib parser read the body (`NaN`, integers past 64 bits...): then orjson would read
        `upstream_body()` otherwise than `json()` holds it."""
        self.json()
        return self._python_only

    def json_object(self) -> dict[str, Any]:
        """`json()` when it is a JSON object; anything else is a 400."""
        obj = self.json()
        if not isinstance(obj, dict):
            raise BadRequest("request body must be a JSON object")
        return obj

    def set_fields(self, fields: Mapping[str, Any]) -> None:
        """Set top-level members of the JSON object sent upstream; `json()` shows them at once. Members the object
        did not have are spliced into its bytes; changing one it had writes the body whole."""
        obj = self.json_object()
        if self._new and (not obj or any(k in obj for k in fields)):
            self._new = False
        if not self._python_only and jsoncodec.has_non_finite(fields):
            self._python_only = True  # an addon's NaN goes upstream as NaN, as a client's does
        obj.update(fields)
        if self._fields is None:
            self._fields = {}
        self._fields.update(fields)
        self._encoded = None

    def replace_json(self, obj: Any) -> None:
        """Send `obj` upstream instead of the client's body (a translation): written here, once; `json()` returns
        it from now on, and `body` keeps what the client sent."""
        self.json()  # (how the client's body was read decides how its values are written)
        self._base = jsoncodec.dumps(obj, python_only=self._python_only)
        self._json, self._fields, self._new, self._encoded = obj, None, True, None

    def upstream_body(self, fields: Mapping[str, Any] | None = None) -> bytes:
        """The bytes to send upstream, with `fields` (an upstream target's own top-level members, such as the
        model name it serves) on top: the client's bytes when nothing changed, else written by `core.jsoncodec`."""
        if self._encoded is None:
            self._encoded = self._write(self._fields)
        if not fields:
            return self._encoded
        obj = self.json_object()
        if not obj or any(k in obj for k in fields):
            return jsoncodec.dumps({**obj, **fields}, python_only=self._python_only)
        return self._write({**(self._fields or {}), **fields})

    def _write(self, fields: dict[str, Any] | None) -> bytes:
        base = self.body if self._base is None else self._base
        if not fields:
            return base
        if self._new:
            spliced = jsoncodec.with_members(base, fields, python_only=self._python_only)
            if spliced is not None:
                return spliced
        return jsoncodec.dumps({**self.json_object(), **fields}, python_only=self._python_only)


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

    def encoded(self) -> str | None:
        """Why its body cannot be read as it came: a Content-Encoding other than identity (the core asks upstreams
        for identity), said in words; None for a readable body."""
        encoding = self.headers.get("Content-Encoding", "identity").lower()
        return None if encoding == "identity" else f"the upstream answered with Content-Encoding {encoding}"


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
