"""The JSON types of the fields the fake reads, checked once at admission so a wrong type is a 400, not a crash.

Only fields some part of the fake interprets are described; unknown fields pass through untouched (a real
server would drop them). null is accepted anywhere and means "unset", as Go's decoder treats it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["BINDING", "DELETE_OPTIONS", "SCHEMAS", "check"]


@dataclass(frozen=True, slots=True)
class ListOf:
    item: Schema


@dataclass(frozen=True, slots=True)
class MapOf:
    value: Schema


class Quantity:
    """A resource quantity: "500m", "1Gi" or a bare number."""


Schema = object
"""A schema is a Python type (str, int, bool), Quantity, ListOf, MapOf, or a dict of field -> schema; checked at
run time by `check`, so the alias stays loose for the type checker."""

_STATE = {
    "waiting": {"reason": str, "message": str},
    "running": {"startedAt": str},
    "terminated": {"exitCode": int, "signal": int, "reason": str, "message": str, "startedAt": str},
}
_CONTAINER_STATUS = {
    "name": str,
    "image": str,
    "imageID": str,
    "ready": bool,
    "started": bool,
    "restartCount": int,
    "state": _STATE,
    "lastState": _STATE,
}
_CONDITION = {"type": str, "status": str, "reason": str, "message": str}
_OWNER_REFERENCE = {
    "apiVersion": str,
    "kind": str,
    "name": str,
    "uid": str,
    "controller": bool,
    "blockOwnerDeletion": bool,
}
_OBJECT_META = {
    "name": str,
    "generateName": str,
    "namespace": str,
    "uid": str,
    "resourceVersion": str,
    "labels": MapOf(str),
    "annotations": MapOf(str),
    "finalizers": ListOf(str),
    "ownerReferences": ListOf(_OWNER_REFERENCE),
}
_ENV_VAR = {
    "name": str,
    "value": str,
    "valueFrom": {
        "fieldRef": {"apiVersion": str, "fieldPath": str},
        "secretKeyRef": {"name": str, "key": str, "optional": bool},
        "configMapKeyRef": {"name": str, "key": str, "optional": bool},
        "resourceFieldRef": {"containerName": str, "resource": str},
    },
}
_CONTAINER = {
    "name": str,
    "image": str,
    "command": ListOf(str),
    "args": ListOf(str),
    "workingDir": str,
    "env": ListOf(_ENV_VAR),
    "envFrom": ListOf(
        {
            "prefix": str,
            "secretRef": {"name": str, "optional": bool},
            "configMapRef": {"name": str, "optional": bool},
        }
    ),
    "volumeMounts": ListOf({"name": str, "mountPath": str, "subPath": str, "readOnly": bool}),
    "terminationMessagePath": str,
    "terminationMessagePolicy": str,
    "imagePullPolicy": str,
    "resources": {"limits": MapOf(Quantity), "requests": MapOf(Quantity)},
}
_VOLUME = {
    "name": str,
    "emptyDir": {"medium": str, "sizeLimit": Quantity},
    "secret": {
        "secretName": str,
        "optional": bool,
        "defaultMode": int,
        "items": ListOf({"key": str, "path": str, "mode": int}),
    },
}
_POD_SPEC = {
    "containers": ListOf(_CONTAINER),
    "initContainers": ListOf(_CONTAINER),
    "restartPolicy": str,
    "terminationGracePeriodSeconds": int,
    "activeDeadlineSeconds": int,
    "nodeName": str,
    "serviceAccountName": str,
    "schedulerName": str,
    "volumes": ListOf(_VOLUME),
    "nodeSelector": MapOf(str),
}
_POD_STATUS = {
    "phase": str,
    "reason": str,
    "message": str,
    "podIP": str,
    "hostIP": str,
    "conditions": ListOf(_CONDITION),
    "containerStatuses": ListOf(_CONTAINER_STATUS),
    "initContainerStatuses": ListOf(_CONTAINER_STATUS),
}
_JOB_SPEC = {
    "parallelism": int,
    "completions": int,
    "backoffLimit": int,
    "activeDeadlineSeconds": int,
    "ttlSecondsAfterFinished": int,
    "suspend": bool,
    "manualSelector": bool,
    "selector": {
        "matchLabels": MapOf(str),
        "matchExpressions": ListOf({"key": str, "operator": str, "values": ListOf(str)}),
    },
    "template": {"metadata": _OBJECT_META, "spec": _POD_SPEC},
    "podFailurePolicy": {
        "rules": ListOf(
            {
                "action": str,
                "onExitCodes": {"containerName": str, "operator": str, "values": ListOf(int)},
                "onPodConditions": ListOf({"type": str, "status": str}),
            }
        )
    },
}
_JOB_STATUS = {
    "active": int,
    "succeeded": int,
    "failed": int,
    "startTime": str,
    "completionTime": str,
    "conditions": ListOf(_CONDITION),
}
SCHEMAS: dict[str, Schema] = {
    "Job": {"metadata": _OBJECT_META, "spec": _JOB_SPEC, "status": _JOB_STATUS},
    "Pod": {"metadata": _OBJECT_META, "spec": _POD_SPEC, "status": _POD_STATUS},
    "Secret": {
        "metadata": _OBJECT_META,
        "data": MapOf(str),
        "stringData": MapOf(str),
        "type": str,
        "immutable": bool,
    },
}
BINDING: Schema = {"metadata": _OBJECT_META, "target": {"apiVersion": str, "kind": str, "name": str}}
DELETE_OPTIONS: Schema = {
    "propagationPolicy": str,
    "gracePeriodSeconds": int,
    "orphanDependents": bool,
    "preconditions": {"uid": str, "resourceVersion": str},
    "dryRun": ListOf(str),
}
_GO_TYPES = {str: "string", int: "int64", bool: "bool"}


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return f"number {value}"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def check(value: Any, schema: Schema, path: str) -> str | None:
    """None when `value` fits; otherwise Go's decode error for the first misfit, naming its field path."""
    if value is None:
        return None
    if schema is Quantity:
        ok = isinstance(value, str | int | float) and not isinstance(value, bool)
        expected = "resource.Quantity"
    elif isinstance(schema, dict):
        if not isinstance(value, dict):
            return f"json: cannot unmarshal {_json_type(value)} into Go struct field {path} of type struct"
        for key, sub in schema.items():
            if key in value and (error := check(value[key], sub, f"{path}.{key}")):
                return error
        return None
    elif isinstance(schema, ListOf):
        if not isinstance(value, list):
            return f"json: cannot unmarshal {_json_type(value)} into Go struct field {path} of type []"
        return next((e for i, v in enumerate(value) if (e := check(v, schema.item, f"{path}[{i}]"))), None)
    elif isinstance(schema, MapOf):
        if not isinstance(value, dict):
            return f"json: cannot unmarshal {_json_type(value)} into Go struct field {path} of type map"
        return next((e for k, v in value.items() if (e := check(v, schema.value, f"{path}[{k}]"))), None)
    elif schema is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        expected = "int64"
    else:
        ok = isinstance(value, schema) if isinstance(schema, type) else False
        expected = _GO_TYPES.get(schema, "value") if isinstance(schema, type) else "value"
    if ok:
        return None
    return f"json: cannot unmarshal {_json_type(value)} into Go struct field {path} of type {expected}"
