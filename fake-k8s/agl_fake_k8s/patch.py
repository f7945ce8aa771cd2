"""The three PATCH flavours the `kubernetes` client sends: JSON merge patch, strategic merge patch, JSON patch.

Strategic merge is approximated by the merge keys of the fields the fake serves (containers and env by name,
conditions by type, ownerReferences by uid, finalizers as a set); everything else merges as RFC 7386. Server-side
apply is not supported (415).
"""

from __future__ import annotations

import copy
from typing import Any

from agl_fake_k8s.status import ApiError, bad_request, unsupported_media_type

__all__ = ["MERGE_KEYS", "PATCH_TYPES", "apply_patch"]

MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "conditions": "type",
    "ownerReferences": "uid",
    "imagePullSecrets": "name",
    "podIPs": "ip",
    "hostIPs": "ip",
}
_SET_LISTS = {"finalizers"}
PATCH_TYPES = (
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _strategic(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return patch
    if patch.get("$patch") == "replace":
        return {k: v for k, v in patch.items() if k != "$patch"}
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            if isinstance(result.get(name), list) and isinstance(value, list):
                result[name] = [v for v in result[name] if v not in value]
        elif key.startswith("$"):
            continue
        elif value is None:
            result.pop(key, None)
        elif key in _SET_LISTS and isinstance(value, list) and isinstance(result.get(key), list):
            result[key] = result[key] + [v for v in value if v not in result[key]]
        elif key in MERGE_KEYS and isinstance(value, list) and isinstance(result.get(key), list):
            result[key] = _merge_list(result[key], value, MERGE_KEYS[key])
        else:
            result[key] = _strategic(result.get(key), value)
    return result


def _merge_list(current: list[Any], patch: list[Any], merge_key: str) -> list[Any]:
    if not all(isinstance(x, dict) and merge_key in x for x in current + patch):
        return patch
    merged = list(current)
    for item in patch:
        index = next((i for i, x in enumerate(merged) if x[merge_key] == item[merge_key]), None)
        if item.get("$patch") == "delete":
            if index is not None:
                del merged[index]
        elif index is None:
            merged.append({k: v for k, v in item.items() if k != "$patch"})
        else:
            merged[index] = _strategic(merged[index], item)
    return merged


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise bad_request(f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str], op: str) -> tuple[Any, str]:
    return _get(doc, parts, op, depth=len(parts) - 1), parts[-1]


def _patch_error(message: str) -> ApiError:
    return ApiError(422, "Invalid", message)


def _json_patch(doc: Any, ops: Any) -> Any:
    """RFC 6902 add/remove/replace/move/copy/test on a copy of `doc`."""
    if not isinstance(ops, list):
        raise bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    for op in ops:
        if (
            not isinstance(op, dict)
            or not isinstance(op.get("op"), str)
            or not isinstance(op.get("path"), str)
        ):
            raise bad_request("a JSON patch operation needs an 'op' and a 'path'")
        kind, parts = op["op"], _pointer(op["path"])
        if kind in ("move", "copy"):
            if not isinstance(op.get("from"), str):
                raise bad_request(f"a JSON patch {kind} needs 'from'")
            value = _get(doc, _pointer(op["from"]), kind)
            if kind == "move":
                doc = _remove(doc, _pointer(op["from"]))
            doc = _add(doc, parts, value)
        elif kind == "test":
            if _get(doc, parts, kind) != op.get("value"):
                raise _patch_error(f"testing value /{'/'.join(parts)} failed: test failed")
        elif kind == "remove":
            doc = _remove(doc, parts)
        elif kind in ("add", "replace"):
            if "value" not in op:
                raise bad_request(f"a JSON patch {kind} needs 'value'")
            if kind == "replace":
                _get(doc, parts, kind)
                doc = _remove(doc, parts)
            doc = _add(doc, parts, op["value"])
        else:
            raise bad_request(f"Unexpected kind: {kind}")
    return doc


def _get(doc: Any, parts: list[str], op: str, depth: int | None = None) -> Any:
    """The node at `parts` (or at its first `depth` parts); a missing one is the error that names all of `parts`."""
    node = doc
    for part in parts[:depth]:
        try:
            node = node[int(part)] if isinstance(node, list) else node[part]
        except (KeyError, IndexError, ValueError, TypeError):
            raise _patch_error(
                f"{op} operation does not apply: doc is missing path: /{'/'.join(parts)}"
            ) from None
    return node


def _add(doc: Any, parts: list[str], value: Any) -> Any:
    if not parts:
        return value
    parent, last = _parent(doc, parts, "add")
    if isinstance(parent, list):
        index = len(parent) if last == "-" else int(last) if last.isdigit() else -1
        if not 0 <= index <= len(parent):
            raise _patch_error(f"add operation does not apply: index out of range: /{'/'.join(parts)}")
        parent.insert(index, value)
    elif isinstance(parent, dict):
        parent[last] = value
    else:
        raise _patch_error(f"add operation does not apply: doc is missing path: /{'/'.join(parts)}")
    return doc


def _remove(doc: Any, parts: list[str]) -> Any:
    parent, last = _parent(doc, parts, "remove")
    try:
        if isinstance(parent, list):
            del parent[int(last)]
        else:
            del parent[last]
    except (KeyError, IndexError, ValueError, TypeError):
        raise _patch_error(
            f"remove operation does not apply: doc is missing path: /{'/'.join(parts)}"
        ) from None
    return doc


def apply_patch(current: dict[str, Any], patch: Any, content_type: str) -> Any:
    """The patched copy of `current` (itself never changed); raises ApiError 415/400/422 as the server would."""
    media = content_type.split(";", 1)[0].strip().lower()
    if media == "application/merge-patch+json":
        return merge_patch(current, patch)
    if media == "application/strategic-merge-patch+json":
        return _strategic(current, patch)
    if media == "application/json-patch+json":
        return _json_patch(copy.deepcopy(current), patch)
    raise unsupported_media_type(list(PATCH_TYPES))
