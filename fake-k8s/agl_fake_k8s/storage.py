"""The fake's etcd: objects by resource, namespace and name, one global resourceVersion, a bounded event history.

Writes are synchronous and never await, so a read-modify-write by a controller is atomic, and every write is
pushed at once to the subscribers (watches, controllers) as an `Event`. It owns resourceVersions and history;
it must not default, validate or decide deletion rules (registry.py does).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from agl_fake_k8s.meta import JsonObj, encode, order_metadata, typed
from agl_fake_k8s.resources import RESOURCES, Resource

__all__ = ["Event", "Storage"]

Key = tuple[str, str]


@dataclass(slots=True)
class Event:
    """One committed write: the object after it (for DELETED, its last state) and the object before it."""

    rv: int
    type: str
    resource: Resource
    obj: JsonObj
    old: JsonObj | None
    _lines: dict[str, bytes] = field(default_factory=dict)

    @property
    def namespace(self) -> str:
        return str(self.obj["metadata"].get("namespace", ""))

    @property
    def name(self) -> str:
        return str(self.obj["metadata"]["name"])

    def line(self, event_type: str | None = None) -> bytes:
        """The watch line for this event (encoded once per type, shared by every watcher)."""
        event_type = event_type or self.type
        if event_type not in self._lines:
            source = self.obj
            if event_type == "DELETED" and self.type == "MODIFIED" and self.old is not None:
                # The object left the watcher's selector: real servers send its previous content, at the new RV.
                source = {**self.old, "metadata": {**self.old["metadata"], "resourceVersion": str(self.rv)}}
            self._lines[event_type] = encode({"type": event_type, "object": typed(self.resource, source)})
        return self._lines[event_type]


class Storage:
    def __init__(self, *, history_limit: int) -> None:
        self._objects: dict[str, dict[Key, JsonObj]] = {}
        self._rv = 1
        self._history: deque[Event] = deque()
        self._history_limit = history_limit
        self._compacted = 1
        """The oldest resourceVersion a watch may still start from (all events after it are in the history)."""
        self._subscribers: list[Callable[[Event], None]] = []
        self._owned: dict[str, set[tuple[str, str, str]]] = {}

    @property
    def rv(self) -> int:
        return self._rv

    @property
    def compacted(self) -> int:
        return self._compacted

    # reads

    def get(self, resource: Resource, namespace: str, name: str) -> JsonObj | None:
        return self._objects.get(resource.plural, {}).get((namespace, name))

    def items(self, resource: Resource, namespace: str | None = None) -> list[JsonObj]:
        """Objects in key order (namespace, then name), as etcd lists them."""
        objects = self._objects.get(resource.plural, {})
        keys = sorted(k for k in objects if namespace is None or k[0] == namespace)
        return [objects[k] for k in keys]

    def dependents(self, uid: str) -> list[tuple[Resource, JsonObj]]:
        """Objects whose ownerReferences name `uid`."""
        by_plural = {r.plural: r for r in RESOURCES}
        out = []
        for plural, namespace, name in sorted(self._owned.get(uid, ())):
            obj = self._objects.get(plural, {}).get((namespace, name))
            if obj is not None:
                out.append((by_plural[plural], obj))
        return out

    # writes

    def _commit(self, event_type: str, resource: Resource, obj: JsonObj, old: JsonObj | None) -> JsonObj:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        order_metadata(obj)
        key = (str(obj["metadata"].get("namespace", "")), str(obj["metadata"]["name"]))
        objects = self._objects.setdefault(resource.plural, {})
        if event_type == "DELETED":
            objects.pop(key, None)
        else:
            objects[key] = obj
        self._index_owners(resource, key, old, None if event_type == "DELETED" else obj)
        event = Event(self._rv, event_type, resource, obj, old)
        self._history.append(event)
        if len(self._history) > self._history_limit:
            self._compacted = self._history.popleft().rv
        for subscriber in list(self._subscribers):
            subscriber(event)
        return obj

    def _index_owners(self, resource: Resource, key: Key, old: JsonObj | None, new: JsonObj | None) -> None:
        entry = (resource.plural, *key)
        for obj, add in ((old, False), (new, True)):
            for ref in (obj or {}).get("metadata", {}).get("ownerReferences") or []:
                uid = ref.get("uid")
                if add:
                    self._owned.setdefault(uid, set()).add(entry)
                elif uid in self._owned:
                    self._owned[uid].discard(entry)
                    if not self._owned[uid]:
                        del self._owned[uid]

    def create(self, resource: Resource, obj: JsonObj) -> JsonObj:
        return self._commit("ADDED", resource, obj, None)

    def update(self, resource: Resource, obj: JsonObj, old: JsonObj) -> JsonObj:
        return self._commit("MODIFIED", resource, obj, old)

    def delete(self, resource: Resource, obj: JsonObj) -> JsonObj:
        """Remove `obj` (a copy of the stored one); its DELETED event carries a new resourceVersion."""
        namespace, name = obj["metadata"].get("namespace", ""), obj["metadata"]["name"]
        return self._commit("DELETED", resource, obj, self.get(resource, namespace, name))

    # history and subscribers

    def events_after(self, rv: int) -> list[Event] | None:
        """The events after `rv`, or None when some of them were compacted away (410 Expired)."""
        if rv < self._compacted:
            return None
        newer: list[Event] = []
        for event in reversed(self._history):
            if event.rv <= rv:
                break
            newer.append(event)
        return newer[::-1]

    def state_at(self, resource: Resource, rv: int) -> list[JsonObj] | None:
        """The resource's objects as they were at `rv` (None when the history no longer reaches back so far)."""
        after = self.events_after(rv)
        if after is None:
            return None
        state = dict(self._objects.get(resource.plural, {}))
        for event in reversed(after):
            if event.resource is not resource:
                continue
            key = (event.namespace, event.name)
            if event.type == "ADDED":
                state.pop(key, None)
            elif event.old is not None:
                state[key] = event.old
        return [state[k] for k in sorted(state)]

    def compact(self) -> None:
        """Forget the whole history, as an API server restart does: every older resourceVersion expires."""
        self._history.clear()
        self._compacted = self._rv

    def subscribe(self, callback: Callable[[Event], None]) -> Callable[[], None]:
        """Call `callback` synchronously on every committed write; returns the unsubscribe function.

        Callbacks must not write (they run inside the write); they queue work.
        """
        self._subscribers.append(callback)
        return lambda: self._subscribers.remove(callback) if callback in self._subscribers else None
