"""Object plumbing shared by the fake's parts: JSON copies and encoding, uids, names, timestamps, metadata order.

Stored objects are plain JSON dicts that are never mutated once stored: every writer works on a copy.
"""

from __future__ import annotations

import random
import time
import uuid
from typing import Any

import orjson

from agl_fake_k8s.resources import Resource

__all__ = [
    "JsonObj",
    "copy_json",
    "encode",
    "generated_name",
    "meta",
    "new_uid",
    "now",
    "order_metadata",
    "typed",
]

JsonObj = dict[str, Any]

_SUFFIX_ALPHABET = (
    "bcdfghjklmnpqrstvwxz2456789"  # apimachinery's rand.String alphabet: no vowels, no look-alikes
)
_MAX_GENERATED_BASE = 58  # 63 - 5: a generated name's base is cut so the name stays a valid label value
_METADATA_ORDER = (
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
)


def copy_json(obj: Any) -> Any:
    return orjson.loads(orjson.dumps(obj))


def encode(obj: Any) -> bytes:
    """One compact JSON line ending in a newline, as Go's json.Encoder writes it."""
    return orjson.dumps(obj) + b"\n"


def new_uid() -> str:
    return str(uuid.uuid4())


def now() -> str:
    """RFC 3339 UTC with whole seconds, as metav1.Time marshals."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def generated_name(base: str) -> str:
    return base[:_MAX_GENERATED_BASE] + "".join(random.choices(_SUFFIX_ALPHABET, k=5))


def meta(obj: JsonObj) -> JsonObj:
    """The object's metadata dict (created when absent, so writers can fill it)."""
    value = obj.get("metadata")
    if not isinstance(value, dict):
        value = {}
        obj["metadata"] = value
    return value


def order_metadata(obj: JsonObj) -> None:
    """Put metadata keys in ObjectMeta's field order, as the real server serialises them."""
    metadata = meta(obj)
    ordered = {k: metadata[k] for k in _METADATA_ORDER if k in metadata}
    ordered.update((k, v) for k, v in metadata.items() if k not in ordered)
    obj["metadata"] = ordered


def typed(resource: Resource, obj: JsonObj) -> JsonObj:
    """The object with kind and apiVersion first, as single-object responses and watch events carry it."""
    return {"kind": resource.kind, "apiVersion": resource.api_version, **obj}
