"""Lists as the API server serves them: selectors, `limit`/`continue` over a consistent snapshot, and
`resourceVersionMatch=Exact`, both rebuilt from the storage's history (410 Expired once it no longer reaches).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

import orjson

from agl_fake_k8s.meta import JsonObj
from agl_fake_k8s.resources import Resource
from agl_fake_k8s.selectors import FieldSelector, LabelSelector
from agl_fake_k8s.status import bad_request, expired
from agl_fake_k8s.storage import Storage

__all__ = ["ListResult", "list_objects", "parse_resource_version"]

_CONTINUE_EXPIRED = (
    "The provided continue parameter is too old to display a consistent list result. You can start a new list "
    "without the continue parameter, or use the continue token in this response to retrieve the remainder of the "
    "results. Continuing with the provided token results in an inconsistent list - objects that were created, "
    "modified, or deleted between the time the first chunk was returned and now may show up in the list."
)


@dataclass(frozen=True, slots=True)
class ListResult:
    items: list[JsonObj]
    resource_version: int
    continue_token: str | None = None
    remaining: int | None = None


def _encode_continue(rv: int, namespace: str, name: str) -> str:
    token = {"v": "meta.k8s.io/v1", "rv": rv, "start": f"{namespace}/{name}\x00"}
    return base64.urlsafe_b64encode(orjson.dumps(token)).decode().rstrip("=")


def _decode_continue(token: str) -> tuple[int, tuple[str, str]]:
    try:
        data = orjson.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        rv, start = int(data["rv"]), str(data["start"]).rstrip("\x00")
        namespace, _, name = start.partition("/")
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise bad_request("continue key is not valid: incorrect encoded start resourceVersion") from None
    return rv, (namespace, name)


def _key(obj: JsonObj) -> tuple[str, str]:
    return str(obj["metadata"].get("namespace", "")), str(obj["metadata"]["name"])


def list_objects(
    storage: Storage,
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
    start: tuple[str, str] | None = None
    snapshot: list[JsonObj] | None
    if continue_token:
        rv, start = _decode_continue(continue_token)
        snapshot = storage.state_at(resource, rv)
        if snapshot is None:
            raise expired(_CONTINUE_EXPIRED)
    elif resource_version_match == "Exact" and resource_version:
        rv = parse_resource_version(resource_version)
        snapshot = storage.state_at(resource, rv) if rv <= storage.rv else None
        if snapshot is None:
            raise expired("The resourceVersion for the provided list is too old.")
    else:  # "not older than": the newest state, like the watch cache serves it
        rv, snapshot = storage.rv, storage.items(resource)
    items = [
        obj
        for obj in snapshot
        if (namespace is None or obj["metadata"].get("namespace") == namespace)
        and (start is None or _key(obj) > start)
        and (label_selector is None or label_selector.matches(obj["metadata"].get("labels")))
        and (field_selector is None or field_selector.matches(obj))
    ]
    if limit and len(items) > limit:
        page = items[:limit]
        token = _encode_continue(rv, *_key(page[-1]))
        return ListResult(page, rv, token, len(items) - limit)
    return ListResult(items, rv)


def parse_resource_version(value: str) -> int:
    """A resourceVersion query value as a number; 400 when it is not one."""
    try:
        rv = int(value)
    except ValueError:
        detail = f'strconv.ParseUint: parsing "{value}": invalid syntax'
        raise bad_request(f'resourceVersion: Invalid value: "{value}": {detail}') from None
    if rv < 0:
        raise bad_request(f'resourceVersion: Invalid value: "{value}": must be a non-negative integer')
    return rv
