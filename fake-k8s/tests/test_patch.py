"""The PATCH flavours: JSON merge patch, strategic merge patch (by merge key), JSON patch."""

from __future__ import annotations

from typing import Any

import pytest

from agl_fake_k8s.patch import apply_patch
from agl_fake_k8s.status import ApiError

POD: dict[str, Any] = {
    "metadata": {"name": "p", "labels": {"a": "1", "b": "2"}, "finalizers": ["x", "y"]},
    "spec": {"containers": [{"name": "one", "image": "i:1"}, {"name": "two", "image": "i:2"}]},
}
MERGE, STRATEGIC, JSON_PATCH = (
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/json-patch+json",
)


def test_merge_patch_replaces_lists_and_deletes_with_null() -> None:
    patched = apply_patch(
        POD, {"metadata": {"labels": {"a": None, "c": "3"}}, "spec": {"containers": []}}, MERGE
    )
    assert patched["metadata"]["labels"] == {"b": "2", "c": "3"}
    assert patched["spec"]["containers"] == []
    assert POD["metadata"]["labels"] == {"a": "1", "b": "2"}  # the original is untouched


def test_strategic_merge_merges_lists_by_their_merge_key() -> None:
    patch = {
        "metadata": {"$deleteFromPrimitiveList/finalizers": ["x"]},
        "spec": {"containers": [{"name": "two", "image": "i:3"}, {"name": "one", "$patch": "delete"}]},
    }
    patched = apply_patch(POD, patch, STRATEGIC)
    assert patched["spec"]["containers"] == [{"name": "two", "image": "i:3"}]
    assert patched["metadata"]["finalizers"] == ["y"]


def test_json_patch_applies_operations_in_order_and_tests_values() -> None:
    ops = [
        {"op": "test", "path": "/metadata/labels/a", "value": "1"},
        {"op": "replace", "path": "/spec/containers/0/image", "value": "i:9"},
        {"op": "add", "path": "/metadata/labels/c~1d", "value": "4"},
        {"op": "remove", "path": "/metadata/finalizers/0"},
    ]
    patched = apply_patch(POD, ops, JSON_PATCH)
    assert patched["spec"]["containers"][0]["image"] == "i:9"
    assert patched["metadata"]["labels"]["c/d"] == "4"
    assert patched["metadata"]["finalizers"] == ["y"]


@pytest.mark.parametrize(
    ("patch", "content_type", "status"),
    [
        ([{"op": "test", "path": "/metadata/name", "value": "q"}], JSON_PATCH, 422),
        ([{"op": "remove", "path": "/nope/x"}], JSON_PATCH, 422),
        ({"op": "add"}, JSON_PATCH, 400),
        ({}, "application/apply-patch+yaml", 415),
    ],
)
def test_bad_patches_are_api_errors(patch: Any, content_type: str, status: int) -> None:
    with pytest.raises(ApiError) as raised:
        apply_patch(POD, patch, content_type)
    assert raised.value.status == status
