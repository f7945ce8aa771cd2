"""`metadata.managedFields`: which manager (client User-Agent, controller) wrote which fields, as FieldsV1 sets.

An approximation of server-side apply's bookkeeping, good for shape: a manager owns the fields it set on create
and the fields it changed on update; lists with merge keys are keyed (`k:{"name":"agent"}`), others atomic.
Ownership is never taken away from another manager. Nothing in the fake reads these sets.
"""

from __future__ import annotations

import json
from typing import Any

from agl_fake_k8s.meta import JsonObj, meta
from agl_fake_k8s.patch import MERGE_KEYS

__all__ = ["record_write"]

_SERVER_OWNED_META = {
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
}
_REQUIRED_STRUCTS = {"metadata", "spec", "status", "template", "containers", "initContainers"}


def _key(name: str, item: dict[str, Any]) -> str:
    return "k:" + json.dumps({name: item[name]}, separators=(",", ":"))


def _fields(value: Any, field: str | None, *, top: bool = False) -> dict[str, Any]:
    """The FieldsV1 set of everything under `value` (`field` is its name; `top` for the object itself)."""
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {} if top or field in _REQUIRED_STRUCTS else {".": {}}
        for key, sub in sorted(value.items()):
            if (top and key in ("kind", "apiVersion")) or (field == "metadata" and key in _SERVER_OWNED_META):
                continue
            out[f"f:{key}"] = _fields(sub, key)
        return out
    merge_key = MERGE_KEYS.get(field or "")
    if (
        isinstance(value, list)
        and value
        and merge_key
        and all(isinstance(x, dict) and merge_key in x for x in value)
    ):
        out = {} if field in _REQUIRED_STRUCTS else {".": {}}
        for item in value:
            out[_key(merge_key, item)] = _fields(item, "")
        return dict(sorted(out.items()))
    return {}


def _changed(old: Any, new: Any, field: str | None) -> dict[str, Any] | None:
    """The FieldsV1 set of what differs in `new` from `old` (None: nothing changed)."""
    if old == new:
        return None
    if isinstance(old, dict) and isinstance(new, dict) and new:
        out: dict[str, Any] = {}
        for key, sub in sorted(new.items()):
            if (field is None and key in ("kind", "apiVersion")) or (
                field == "metadata" and key in _SERVER_OWNED_META
            ):
                continue
            if key not in old:
                out[f"f:{key}"] = _fields(sub, key)
            elif (changed := _changed(old[key], sub, key)) is not None:
                out[f"f:{key}"] = changed
        return out or None
    merge_key = MERGE_KEYS.get(field or "")
    if (
        isinstance(old, list)
        and isinstance(new, list)
        and merge_key
        and all(isinstance(x, dict) and merge_key in x for x in old + new)
    ):
        before = {json.dumps(x[merge_key]): x for x in old}
        out = {}
        for item in new:
            prior = before.get(json.dumps(item[merge_key]))
            if prior is None:
                out[_key(merge_key, item)] = _fields(item, "")
            elif (changed := _changed(prior, item, None)) is not None:
                out[_key(merge_key, item)] = changed
        return dict(sorted(out.items())) or None
    return _fields(new, field)


def _union(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for key, value in b.items():
        out[key] = _union(out[key], value) if key in out else value
    return dict(sorted(out.items()))


def _prune(owned: dict[str, Any], existing: dict[str, Any]) -> dict[str, Any]:
    """`owned` without the fields that no longer exist: nobody owns a field that was removed."""
    out = {}
    for key, sub in owned.items():
        if key == ".":
            out[key] = sub
        elif key in existing:
            out[key] = _prune(sub, existing[key]) if sub else {}
    return out


def record_write(
    obj: JsonObj,
    old: JsonObj | None,
    *,
    manager: str,
    api_version: str,
    time: str,
    owned: JsonObj | None = None,
) -> None:
    """Add or refresh `manager`'s managedFields entry on `obj` for a write that turned `old` into it.

    `owned` is what the manager itself sent on create (before the server filled in generated fields); by default
    the whole object, or on update what changed.
    """
    fields = (
        _fields(obj if owned is None else owned, None, top=True)
        if old is None
        else _changed(old, obj, None) or {}
    )
    entries = [
        dict(e) for e in (meta(old).get("managedFields") if old else None) or [] if isinstance(e, dict)
    ]
    if old is not None:
        existing = _fields(obj, None, top=True)
        for each in entries:
            if isinstance(each.get("fieldsV1"), dict):
                each["fieldsV1"] = _prune(each["fieldsV1"], existing)
        entries = [e for e in entries if e.get("fieldsV1") != {}]
    mine = next((e for e in entries if e.get("manager") == manager and e.get("operation") == "Update"), None)
    if not fields and mine is None:
        meta(obj)["managedFields"] = entries
        return
    previous = (mine or {}).get("fieldsV1")
    previous = previous if isinstance(previous, dict) else {}
    entry = {
        "manager": manager,
        "operation": "Update",
        "apiVersion": api_version,
        "time": time,
        "fieldsType": "FieldsV1",
        "fieldsV1": _union(previous, fields),
    }
    if mine is None:
        entries.append(entry)
    else:
        entries[entries.index(mine)] = entry
    # The field manager keeps entries sorted: Apply before Update, then by time, then by manager name.
    entries.sort(key=lambda e: (e.get("operation") != "Apply", str(e.get("time")), str(e.get("manager"))))
    meta(obj)["managedFields"] = entries
