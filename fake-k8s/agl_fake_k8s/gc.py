"""The garbage collector: dependents (ownerReferences) of deleted owners are deleted, orphaned or waited for.

Background deletion removes the owner at once and its dependents afterwards; Orphan (the "orphan" finalizer)
strips the ownerReferences first and then lets the owner go; Foreground ("foregroundDeletion") deletes the
dependents first. A dependent whose owners all no longer exist (same name, other uid, or gone) is deleted too.
"""

from __future__ import annotations

from typing import Any

from agl_fake_k8s.controller import Controller
from agl_fake_k8s.meta import JsonObj
from agl_fake_k8s.registry import DeleteOptions, Registry
from agl_fake_k8s.resources import RESOURCES, Resource
from agl_fake_k8s.status import ApiError
from agl_fake_k8s.storage import Event

__all__ = ["GarbageCollector"]

MANAGER = "kube-controller-manager"
_BY_KIND = {r.kind: r for r in RESOURCES}
# ("owner", plural, namespace, name) finalizes an owner; ("orphan-check", plural, namespace, name) checks a dependent
Key = tuple[str, str, str, str]


class GarbageCollector(Controller[Key]):
    name = "garbage-collector"

    def __init__(self, registry: Registry) -> None:
        super().__init__(registry.storage)
        self.registry = registry
        self._resources = {r.plural: r for r in RESOURCES}

    def initial_keys(self) -> list[Key]:
        keys: list[Key] = []
        for resource in RESOURCES:
            for obj in self.storage.items(resource):
                metadata = obj["metadata"]
                keys.append(("owner", resource.plural, metadata["namespace"], metadata["name"]))
                if metadata.get("ownerReferences"):
                    keys.append(("orphan-check", resource.plural, metadata["namespace"], metadata["name"]))
        return keys

    def keys_for(self, event: Event) -> list[Key]:
        metadata = event.obj["metadata"]
        keys: list[Key] = []
        if event.type == "DELETED":
            keys += [
                ("orphan-check", r.plural, o["metadata"]["namespace"], o["metadata"]["name"])
                for r, o in self.storage.dependents(metadata["uid"])
            ]
        elif metadata.get("deletionTimestamp") and {"orphan", "foregroundDeletion"} & set(
            metadata.get("finalizers") or []
        ):
            keys.append(("owner", event.resource.plural, event.namespace, event.name))
        if event.type == "ADDED" and metadata.get("ownerReferences"):
            keys.append(("orphan-check", event.resource.plural, event.namespace, event.name))
        for ref in (event.old or event.obj)["metadata"].get("ownerReferences") or []:
            owner = _BY_KIND.get(ref.get("kind"))
            if owner is not None and event.type == "DELETED":  # a foreground owner may now be free to go
                keys.append(("owner", owner.plural, event.namespace, ref.get("name", "")))
        return keys

    def reconcile(self, key: Key) -> None:
        what, plural, namespace, name = key
        resource = self._resources[plural]
        obj = self.storage.get(resource, namespace, name)
        if obj is None:
            return
        if what == "owner":
            self._finalize_owner(resource, obj)
        else:
            self._check_owners(resource, obj)

    def _owner_exists(self, namespace: str, ref: dict[str, Any]) -> bool | None:
        """Whether the referenced owner exists with that uid; None for kinds the fake does not serve."""
        owner = _BY_KIND.get(ref.get("kind", ""))
        if owner is None:
            return None
        found = self.storage.get(owner, namespace, ref.get("name", ""))
        return found is not None and found["metadata"]["uid"] == ref.get("uid")

    def _check_owners(self, resource: Resource, obj: JsonObj) -> None:
        metadata = obj["metadata"]
        refs = metadata.get("ownerReferences") or []
        exists = [self._owner_exists(metadata["namespace"], r) for r in refs]
        if not refs or any(e is not False for e in exists) or metadata.get("deletionTimestamp"):
            if refs and False in exists and any(e is True for e in exists):
                gone = {r.get("uid") for r, e in zip(refs, exists, strict=True) if e is False}
                self._drop_refs(resource, obj, gone)
            return
        self._delete(resource, metadata["namespace"], metadata["name"], "Background")

    def _finalize_owner(self, resource: Resource, obj: JsonObj) -> None:
        metadata = obj["metadata"]
        finalizers = metadata.get("finalizers") or []
        if not metadata.get("deletionTimestamp"):
            return
        dependents = self.storage.dependents(metadata["uid"])
        if "orphan" in finalizers:
            for dep_resource, dependent in dependents:
                self._drop_refs(dep_resource, dependent, {metadata["uid"]})
            self._remove_finalizer(resource, obj, "orphan")
        elif "foregroundDeletion" in finalizers:
            if dependents:
                for dep_resource, dependent in dependents:
                    if not dependent["metadata"].get("deletionTimestamp"):
                        meta = dependent["metadata"]
                        self._delete(dep_resource, meta["namespace"], meta["name"], "Foreground")
                return  # the owner goes when its last dependent's DELETED event re-queues it
            self._remove_finalizer(resource, obj, "foregroundDeletion")

    def _drop_refs(self, resource: Resource, obj: JsonObj, uids: set[Any]) -> None:
        def drop(target: JsonObj) -> bool:
            refs = target["metadata"].get("ownerReferences") or []
            kept = [r for r in refs if r.get("uid") not in uids]
            if len(kept) == len(refs):
                return False
            if kept:
                target["metadata"]["ownerReferences"] = kept
            else:
                target["metadata"].pop("ownerReferences", None)
            return True

        metadata = obj["metadata"]
        self.registry.mutate(resource, metadata["namespace"], metadata["name"], drop, manager=MANAGER)

    def _remove_finalizer(self, resource: Resource, obj: JsonObj, finalizer: str) -> None:
        def remove(target: JsonObj) -> bool:
            finalizers = [f for f in target["metadata"].get("finalizers") or [] if f != finalizer]
            if finalizers:
                target["metadata"]["finalizers"] = finalizers
            else:
                target["metadata"].pop("finalizers", None)
            return True

        metadata = obj["metadata"]
        self.registry.mutate(resource, metadata["namespace"], metadata["name"], remove, manager=MANAGER)

    def _delete(self, resource: Resource, namespace: str, name: str, policy: str) -> None:
        try:
            self.registry.delete(
                resource, namespace, name, DeleteOptions(propagation_policy=policy), manager=MANAGER
            )
        except ApiError as error:
            if error.status != 404:
                raise
