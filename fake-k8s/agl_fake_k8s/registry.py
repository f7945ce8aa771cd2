"""The API server's rules for each write: admission, defaults, validation, optimistic concurrency, deletion.

Both the HTTP layer and the in-process controllers (Job controller, GC, scheduler, kubelet) write through a
`Registry`, so a controller's write obeys the same rules as a client's. Every refusal is an `ApiError`.
Synchronous on purpose: a read-modify-write never interleaves with another write.
"""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agl_fake_k8s import defaults, validation
from agl_fake_k8s.lists import ListResult, list_objects
from agl_fake_k8s.managed_fields import record_write
from agl_fake_k8s.meta import (
    JsonObj,
    copy_json,
    generated_name,
    meta,
    new_uid,
    now,
    order_metadata,
    typed,
)
from agl_fake_k8s.patch import apply_patch
from agl_fake_k8s.resources import JOBS, PODS, SECRETS, Resource
from agl_fake_k8s.schema import BINDING, SCHEMAS, check
from agl_fake_k8s.selectors import FieldSelector, LabelSelector
from agl_fake_k8s.status import (
    ApiError,
    FieldError,
    already_exists,
    bad_request,
    conflict,
    invalid,
    not_found,
)
from agl_fake_k8s.storage import Storage

__all__ = ["DeleteOptions", "ListResult", "Registry"]

_MODIFIED = "the object has been modified; please apply your changes to the latest version and try again"
_SERVER_META = (
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generateName",
    "namespace",
    "managedFields",
    "selfLink",
    "generation",
)
_PROPAGATIONS = ("Foreground", "Background", "Orphan")
_DEFAULTS: dict[str, Callable[[JsonObj], None]] = {
    "Job": defaults.default_job,
    "Pod": defaults.default_pod,
    "Secret": defaults.default_secret,
}
_VALIDATE: dict[str, Callable[[JsonObj], list[FieldError]]] = {
    "Job": validation.validate_job,
    "Pod": validation.validate_pod,
    "Secret": validation.validate_secret,
}
_VALIDATE_UPDATE: dict[str, Callable[[JsonObj, JsonObj], list[FieldError]]] = {
    "Job": validation.validate_job_update,
    "Pod": validation.validate_pod_update,
    "Secret": validation.validate_secret_update,
}


@dataclass(frozen=True, slots=True)
class DeleteOptions:
    propagation_policy: str | None = None
    grace_period_s: int | None = None
    orphan_dependents: bool | None = None
    precondition_uid: str | None = None
    precondition_rv: str | None = None
    dry_run: bool = False


def _sorted_map(value: Any) -> Any:
    return dict(sorted(value.items())) if isinstance(value, dict) else value


def _sort_maps(obj: JsonObj) -> None:
    """Go marshals maps with sorted keys: labels, annotations, selectors and data come back sorted."""
    for holder in (meta(obj), ((obj.get("spec") or {}).get("template") or {}).get("metadata")):
        if isinstance(holder, dict):
            for key in ("labels", "annotations"):
                if key in holder:
                    holder[key] = _sorted_map(holder[key])
    selector = (obj.get("spec") or {}).get("selector")
    if isinstance(selector, dict) and "matchLabels" in selector:
        selector["matchLabels"] = _sorted_map(selector["matchLabels"])
    if "data" in obj:
        obj["data"] = _sorted_map(obj["data"])


class Registry:
    def __init__(self, storage: Storage, *, namespaces: frozenset[str] | None = None) -> None:
        self.storage = storage
        self._namespaces = namespaces

    # admission

    def _admit(self, resource: Resource, body: Any, namespace: str) -> JsonObj:
        """A private copy of a client's object, type-checked, without kind/apiVersion, in the URL's namespace."""
        if not isinstance(body, dict):
            raise bad_request(
                f'{resource.kind} in version "{resource.version}" cannot be handled as a '
                f"{resource.kind}: the body must be a JSON object"
            )
        api_version, kind = body.get("apiVersion"), body.get("kind")
        if api_version not in (None, "", resource.api_version):
            raise bad_request(
                f"the API version in the data ({api_version}) does not match the expected API version "
                f"({resource.api_version})"
            )
        if kind not in (None, "", resource.kind):
            raise bad_request(
                f"the kind in the data ({kind}) does not match the expected kind ({resource.kind})"
            )
        if error := check(body, SCHEMAS[resource.kind], resource.kind):
            raise bad_request(
                f'{resource.kind} in version "{resource.version}" cannot be handled as a {resource.kind}: {error}'
            )
        obj: JsonObj = copy_json({k: v for k, v in body.items() if k not in ("kind", "apiVersion")})
        metadata = meta(obj)
        for key in ("labels", "annotations", "finalizers", "ownerReferences", "managedFields"):
            if key in metadata and not metadata[key]:  # Go omits empty maps and lists: `{}` is no change
                del metadata[key]
        if metadata.get("namespace") not in (None, "", namespace):
            raise bad_request(
                "the namespace of the provided object does not match the namespace sent on the request"
            )
        metadata["namespace"] = namespace
        if resource is SECRETS:
            for key, value in (obj.get("data") or {}).items():
                try:
                    base64.b64decode(value or "", validate=True)
                except binascii.Error:
                    raise bad_request(
                        f'Secret in version "v1" cannot be handled as a Secret: illegal base64 data in data[{key}]'
                    ) from None
        return obj

    def _check_namespace(self, namespace: str) -> None:
        if self._namespaces is not None and namespace not in self._namespaces:
            details = {"name": namespace, "kind": "namespaces"}
            raise ApiError(404, "NotFound", f'namespaces "{namespace}" not found', details)

    # reads

    def get(self, resource: Resource, namespace: str, name: str) -> JsonObj:
        obj = self.storage.get(resource, namespace, name)
        if obj is None:
            raise not_found(resource, name)
        return obj

    def list(
        self,
        resource: Resource,
        namespace: str | None,
        *,
        label_selector: LabelSelector | None = None,
        field_selector: FieldSelector | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
        resource_version: str | None = None,
        resource_version_match: str | None = None,
    ) -> ListResult:
        return list_objects(
            self.storage,
            resource,
            namespace,
            label_selector=label_selector,
            field_selector=field_selector,
            limit=limit,
            continue_token=continue_token,
            resource_version=resource_version,
            resource_version_match=resource_version_match,
        )

    # writes

    def create(
        self, resource: Resource, namespace: str, body: Any, *, manager: str, dry_run: bool = False
    ) -> JsonObj:
        self._check_namespace(namespace)
        obj = self._admit(resource, body, namespace)
        metadata = meta(obj)
        for key in (
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
        ):
            metadata.pop(key, None)
        metadata.pop("managedFields", None)
        if not metadata.get("name") and metadata.get("generateName"):
            metadata["name"] = generated_name(metadata["generateName"])
            while self.storage.get(resource, namespace, metadata["name"]) is not None:
                metadata["name"] = generated_name(metadata["generateName"])
        _DEFAULTS[resource.kind](obj)
        owned = copy_json(obj)
        if resource is PODS:
            defaults.admit_pod(obj)
        timestamp = now()
        metadata["uid"] = new_uid()
        metadata["creationTimestamp"] = timestamp
        self._prepare_create(resource, obj)
        name = str(metadata.get("name") or "")
        if errors := _VALIDATE[resource.kind](obj):
            raise invalid(resource, name, errors)
        if self.storage.get(resource, namespace, name) is not None:
            raise already_exists(resource, name)
        _sort_maps(obj)
        record_write(
            obj, None, manager=manager, api_version=resource.api_version, time=timestamp, owned=owned
        )
        order_metadata(obj)
        if dry_run:
            return obj
        return self.storage.create(resource, obj)

    def _prepare_create(self, resource: Resource, obj: JsonObj) -> None:
        metadata = meta(obj)
        if resource is JOBS and isinstance(obj.get("spec"), dict):
            spec = obj["spec"]
            template = spec.get("template")
            if isinstance(template, dict) and not spec.get("manualSelector"):
                template_meta = template.setdefault("metadata", {})
                labels = template_meta.setdefault("labels", {}) or {}
                labels.setdefault("controller-uid", metadata["uid"])
                labels.setdefault("job-name", metadata.get("name", ""))
                template_meta["labels"] = labels
                selector = spec.get("selector") or {}
                match_labels = selector.get("matchLabels") or {}
                match_labels.setdefault("controller-uid", metadata["uid"])
                spec["selector"] = {**selector, "matchLabels": match_labels}
                obj["spec"] = defaults.order_job_spec(spec)
            obj["status"] = {}
        elif resource is PODS:
            obj["status"] = {"phase": "Pending", "qosClass": defaults.pod_qos_class(obj.get("spec") or {})}

    def update(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        body: Any,
        *,
        manager: str,
        subresource: str | None = None,
        dry_run: bool = False,
    ) -> JsonObj:
        new = self._admit(resource, body, namespace)
        if meta(new).get("name") != name:
            given = meta(new).get("name") or ""
            raise bad_request(f"the name of the object ({given}) does not match the name on the URL ({name})")
        old = self.get(resource, namespace, name)
        given_rv = meta(new).get("resourceVersion")
        if given_rv and given_rv != old["metadata"]["resourceVersion"]:
            raise conflict(resource, name, _MODIFIED)
        return self._commit_update(
            resource, old, new, manager=manager, subresource=subresource, dry_run=dry_run
        )

    def patch(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        patch: Any,
        content_type: str,
        *,
        manager: str,
        subresource: str | None = None,
        dry_run: bool = False,
    ) -> JsonObj:
        old = self.get(resource, namespace, name)
        patched = apply_patch(typed(resource, old), patch, content_type)
        if not isinstance(patched, dict):
            raise bad_request("the patch did not produce an object")
        given_rv = (patched.get("metadata") or {}).get("resourceVersion")
        if given_rv and given_rv != old["metadata"]["resourceVersion"]:
            raise conflict(resource, name, _MODIFIED)
        new = self._admit(resource, patched, namespace)
        if meta(new).get("name") != name:
            given = meta(new).get("name") or ""
            raise bad_request(f"the name of the object ({given}) does not match the name on the URL ({name})")
        return self._commit_update(
            resource, old, new, manager=manager, subresource=subresource, dry_run=dry_run
        )

    def mutate(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        change: Callable[[JsonObj], object],
        *,
        manager: str,
        subresource: str | None = None,
    ) -> JsonObj | None:
        """A controller's read-modify-write: `change` edits a copy in place (returning False skips the write).

        None when the object is gone. Atomic, since nothing else runs between the read and the write.
        """
        old = self.storage.get(resource, namespace, name)
        if old is None:
            return None
        new: JsonObj = copy_json(old)
        if change(new) is False:
            return old
        return self._commit_update(
            resource, old, new, manager=manager, subresource=subresource, dry_run=False
        )

    def _commit_update(
        self,
        resource: Resource,
        old: JsonObj,
        new: JsonObj,
        *,
        manager: str,
        subresource: str | None,
        dry_run: bool,
    ) -> JsonObj:
        name = old["metadata"]["name"]
        if subresource == "status":
            status = new.get("status") or {}
            new = copy_json(old)
            new["status"] = (
                defaults.order_pod_status(status) if resource is PODS else defaults.order_job_status(status)
            )
        else:
            metadata = meta(new)
            for key in _SERVER_META:
                if key in old["metadata"]:
                    metadata[key] = old["metadata"][key]
                else:
                    metadata.pop(key, None)
            if resource.has_status and "status" in old:
                new["status"] = copy_json(old["status"])
            elif resource.has_status:
                new.pop("status", None)
            _DEFAULTS[resource.kind](new)
            if errors := _VALIDATE_UPDATE[resource.kind](new, old):
                raise invalid(resource, name, errors)
            _sort_maps(new)
        meta(new)["resourceVersion"] = old["metadata"]["resourceVersion"]
        meta(new)["managedFields"] = old["metadata"].get("managedFields") or []
        if new == old:
            return old  # a no-op write is not a write: no new resourceVersion, no event
        record_write(new, old, manager=manager, api_version=resource.api_version, time=now())
        order_metadata(new)
        if dry_run:
            return new
        metadata = new["metadata"]
        if (
            metadata.get("deletionTimestamp")
            and not metadata.get("finalizers")
            and not metadata.get("deletionGracePeriodSeconds")
        ):
            return self.storage.delete(resource, new)  # the last finalizer went: the deletion completes
        return self.storage.update(resource, new, old)

    def delete(
        self, resource: Resource, namespace: str, name: str, options: DeleteOptions, *, manager: str
    ) -> tuple[JsonObj, bool]:
        """Delete per `options`; returns the object and whether it is gone (False: pending grace or finalizers)."""
        old = self.get(resource, namespace, name)
        uid, rv = old["metadata"]["uid"], old["metadata"]["resourceVersion"]
        if options.precondition_uid and options.precondition_uid != uid:
            why = f"Precondition failed: UID in precondition: {options.precondition_uid}, UID in object meta: {uid}"
            raise conflict(resource, name, why)
        if options.precondition_rv and options.precondition_rv != rv:
            why = (
                f"Precondition failed: ResourceVersion in precondition: {options.precondition_rv}, "
                f"ResourceVersion in object meta: {rv}"
            )
            raise conflict(resource, name, why)
        policy = options.propagation_policy
        if policy is None and options.orphan_dependents is not None:
            policy = "Orphan" if options.orphan_dependents else "Background"
        policy = policy or resource.default_propagation
        if policy not in _PROPAGATIONS:
            supported = ", ".join(f'"{p}"' for p in _PROPAGATIONS)
            raise ApiError(
                422,
                "Invalid",
                f'DeleteOptions.meta.k8s.io "" is invalid: propagationPolicy: Unsupported value: "{policy}": '
                f"supported values: {supported}",
            )
        new: JsonObj = copy_json(old)
        metadata = meta(new)
        finalizers = [
            f for f in metadata.get("finalizers") or [] if f not in ("orphan", "foregroundDeletion")
        ]
        if policy == "Orphan":
            finalizers.append("orphan")
        elif policy == "Foreground":
            finalizers.append("foregroundDeletion")
        if finalizers:
            metadata["finalizers"] = finalizers
        else:
            metadata.pop("finalizers", None)
        grace = self._grace_period(resource, old, options)
        deleting = metadata.get("deletionTimestamp") is not None
        if grace > 0:
            current = metadata.get("deletionGracePeriodSeconds")
            if not deleting or current is None or grace < current:
                metadata["deletionTimestamp"] = time.strftime(
                    "%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + grace)
                )
                metadata["deletionGracePeriodSeconds"] = grace
        elif finalizers:
            if not deleting:
                metadata["deletionTimestamp"] = now()
            metadata["deletionGracePeriodSeconds"] = 0
        else:
            if options.dry_run:
                return new, True
            return self.storage.delete(resource, new), True
        if options.dry_run or new == old:
            return new if options.dry_run else old, False
        # A delete is no update by the caller: the finalizers and deletionTimestamp it sets belong to no manager.
        return self.storage.update(resource, new, old), False

    @staticmethod
    def _grace_period(resource: Resource, obj: JsonObj, options: DeleteOptions) -> int:
        """Seconds a pod gets to terminate; 0 for other kinds, unscheduled pods and finished pods."""
        if resource is not PODS:
            return 0
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        if not spec.get("nodeName") or status.get("phase") in ("Succeeded", "Failed"):
            return 0
        if options.grace_period_s is not None:
            return max(options.grace_period_s, 0)
        grace = spec.get("terminationGracePeriodSeconds")
        return 30 if grace is None else max(int(grace), 0)

    def bind(self, namespace: str, name: str, body: Any, *, manager: str) -> None:
        """pods/{name}/binding: what the scheduler does; the pod gets its node and a PodScheduled condition."""
        if not isinstance(body, dict) or (error := check(body, BINDING, "Binding")):
            raise bad_request(
                f'Binding in version "v1" cannot be handled as a Binding: {error or "not an object"}'
            )
        node = (body.get("target") or {}).get("name")
        if not node:
            raise invalid(PODS, name, [FieldError("Required value", "target.name")])
        pod = self.get(PODS, namespace, name)
        if (assigned := (pod.get("spec") or {}).get("nodeName")) or pod["metadata"].get("deletionTimestamp"):
            why = (
                f'pod {name} is already assigned to node "{assigned}"'
                if assigned
                else f"pod {name} is being deleted, cannot be assigned to a host"
            )
            details = {"name": name, "kind": "pods/binding"}
            raise ApiError(
                409, "Conflict", f'Operation cannot be fulfilled on pods/binding "{name}": {why}', details
            )
        new: JsonObj = copy_json(pod)
        new["spec"]["nodeName"] = node
        new["spec"] = defaults.order_pod_spec(new["spec"])
        status = new.setdefault("status", {})
        conditions = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
        scheduled = {
            "type": "PodScheduled",
            "status": "True",
            "lastProbeTime": None,
            "lastTransitionTime": now(),
        }
        status["conditions"] = [scheduled, *conditions]
        new["status"] = defaults.order_pod_status(status)
        # Binding is not an update of the pod by the caller: it records no managedFields entry.
        self.storage.update(PODS, new, pod)
