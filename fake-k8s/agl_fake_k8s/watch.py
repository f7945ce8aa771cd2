"""Watches: newline-delimited JSON events over a chunked response, as `?watch=true` gets them from a real server.

A watch without a resourceVersion (or "0") starts with synthetic ADDED events for the current state; one with a
resourceVersion replays the history after it, or gets a single ERROR 410 Expired event when that history is gone.
Objects entering or leaving a selector arrive as ADDED/DELETED. Bookmarks, timeoutSeconds and dropping every watch
(a fault) are handled here; registering a watch and taking its snapshot happen in one synchronous step.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from aiohttp import web

from agl_fake_k8s.meta import encode, typed
from agl_fake_k8s.observe import RequestCounters
from agl_fake_k8s.resources import JOBS, PODS, Resource
from agl_fake_k8s.selectors import FieldSelector, LabelSelector
from agl_fake_k8s.status import expired
from agl_fake_k8s.storage import Event, Storage

__all__ = ["WATCH_HEADERS", "WatchHub", "WatchRequest", "serve_watch"]

WATCH_HEADERS = {"Cache-Control": "no-cache, private", "Content-Type": "application/json"}


@dataclass(frozen=True, slots=True)
class WatchRequest:
    resource: Resource
    namespace: str | None
    labels: LabelSelector
    fields: FieldSelector
    resource_version: int | None
    """None for "" and "0": start from the current state."""
    timeout_s: float | None
    bookmarks: bool
    send_initial_events: bool = False


@dataclass(frozen=True, slots=True)
class _Bookmark:
    rv: int
    initial_events_end: bool = False


@dataclass(frozen=True, slots=True)
class _Drop:
    abrupt: bool


_Item = bytes | _Bookmark | _Drop


def bookmark_line(resource: Resource, rv: int, *, initial_events_end: bool = False) -> bytes:
    """A BOOKMARK event: a nearly empty object of the watched kind that carries only a resourceVersion."""
    metadata: dict[str, object] = {"resourceVersion": str(rv), "creationTimestamp": None}
    if initial_events_end:
        metadata["annotations"] = {"k8s.io/initial-events-end": "true"}
    obj: dict[str, object] = {"kind": resource.kind, "apiVersion": resource.api_version, "metadata": metadata}
    if resource is JOBS:
        obj["spec"] = {"template": {"metadata": {"creationTimestamp": None}, "spec": {"containers": None}}}
        obj["status"] = {}
    elif resource is PODS:
        obj["spec"] = {"containers": None}
        obj["status"] = {}
    return encode({"type": "BOOKMARK", "object": obj})


@dataclass(eq=False)
class Watcher:
    request: WatchRequest
    queue: asyncio.Queue[_Item] = field(default_factory=asyncio.Queue)

    def passes(self, obj: dict[str, object] | None) -> bool:
        if obj is None:
            return False
        metadata = obj["metadata"]
        assert isinstance(metadata, dict)
        if self.request.namespace is not None and metadata.get("namespace") != self.request.namespace:
            return False
        return self.request.labels.matches(metadata.get("labels")) and self.request.fields.matches(obj)

    def line_for(self, event: Event) -> bytes | None:
        """The line this watcher gets for `event`, if any (selector transitions turn into ADDED/DELETED)."""
        if event.resource is not self.request.resource:
            return None
        now_passes = self.passes(event.obj)
        if event.type != "MODIFIED":
            return event.line() if now_passes else None
        before_passed = self.passes(event.old)
        if now_passes:
            return event.line("MODIFIED" if before_passed else "ADDED")
        return event.line("DELETED") if before_passed else None


class WatchHub:
    """Every open watch; fed synchronously by the storage on each write."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage
        self._watchers: set[Watcher] = set()
        self.expire_next = 0
        storage.subscribe(self._on_event)

    def _on_event(self, event: Event) -> None:
        for watcher in self._watchers:
            if (line := watcher.line_for(event)) is not None:
                watcher.queue.put_nowait(line)

    def open(self, request: WatchRequest, *, force_expiry: bool) -> tuple[Watcher | None, list[bytes]]:
        """Register a watch and return the lines it starts with; (None, [ERROR line]) when its RV expired."""
        storage, rv = self._storage, request.resource_version
        watcher = Watcher(request)
        if rv is None:
            objects = storage.items(request.resource, request.namespace)
            initial = [
                encode({"type": "ADDED", "object": typed(request.resource, o)})
                for o in objects
                if watcher.passes(o)
            ]
            if request.send_initial_events:
                initial.append(bookmark_line(request.resource, storage.rv, initial_events_end=True))
        else:
            events = None if force_expiry else storage.events_after(rv)
            if events is None:
                oldest = storage.rv if force_expiry else storage.compacted
                error = expired(f"too old resource version: {rv} ({oldest})")
                return None, [encode({"type": "ERROR", "object": error.body()})]
            initial = [line for e in events if (line := watcher.line_for(e)) is not None]
        self._watchers.add(watcher)
        return watcher, initial

    def close(self, watcher: Watcher) -> None:
        self._watchers.discard(watcher)

    def drop(self, *, resource: Resource | None = None, abrupt: bool = False) -> int:
        """End every open watch (of `resource`); returns how many. Abrupt ones lose their connection mid-stream."""
        dropped = [w for w in self._watchers if resource is None or w.request.resource is resource]
        for watcher in dropped:
            watcher.queue.put_nowait(_Drop(abrupt))
        return len(dropped)

    def bookmark_now(self) -> int:
        """Queue a BOOKMARK on every watch that asked for them; returns how many."""
        wanting = [w for w in self._watchers if w.request.bookmarks]
        for watcher in wanting:
            watcher.queue.put_nowait(_Bookmark(self._storage.rv))
        return len(wanting)

    @property
    def storage_rv(self) -> int:
        return self._storage.rv


async def serve_watch(
    http_request: web.Request,
    hub: WatchHub,
    request: WatchRequest,
    *,
    counters: RequestCounters,
    force_expiry: bool,
    bookmark_interval_s: float,
) -> web.StreamResponse:
    watcher, initial = hub.open(request, force_expiry=force_expiry)
    response = web.StreamResponse(status=200, headers=WATCH_HEADERS)
    response.enable_chunked_encoding()
    counters.watch_opened()
    try:
        await response.prepare(http_request)
        for line in initial:
            await response.write(line)
        if watcher is not None and not await _stream(
            http_request, response, hub, watcher, bookmark_interval_s
        ):
            return response
        await response.write_eof()
        return response
    except ConnectionError:  # the client went away mid-stream: nothing to answer, nothing wrong
        return response
    finally:
        if watcher is not None:
            hub.close(watcher)
        counters.watch_closed()


async def _stream(
    http_request: web.Request,
    response: web.StreamResponse,
    hub: WatchHub,
    watcher: Watcher,
    bookmark_interval_s: float,
) -> bool:
    """Relay the watcher's events until its timeout or a drop; False when the connection was cut."""
    loop = asyncio.get_running_loop()
    request = watcher.request
    deadline = loop.time() + request.timeout_s if request.timeout_s is not None else None
    next_bookmark = loop.time() + bookmark_interval_s if request.bookmarks else None
    while True:
        wake = min((t for t in (deadline, next_bookmark) if t is not None), default=None)
        try:
            item = await asyncio.wait_for(
                watcher.queue.get(), None if wake is None else max(wake - loop.time(), 0)
            )
        except TimeoutError:
            now = loop.time()
            if deadline is not None and now >= deadline:
                if request.bookmarks:  # a 1.20 server sends its bookmark just before the deadline
                    await response.write(bookmark_line(request.resource, hub.storage_rv))
                return True
            await response.write(bookmark_line(request.resource, hub.storage_rv))
            next_bookmark = now + bookmark_interval_s
            continue
        if isinstance(item, _Drop):
            if item.abrupt and http_request.transport is not None:
                http_request.transport.abort()
                return False
            return True
        if isinstance(item, _Bookmark):
            await response.write(bookmark_line(request.resource, item.rv))
        else:
            await response.write(item)
