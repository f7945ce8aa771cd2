"""Lists from the storage: consistent continuations, Exact resourceVersions, and their errors."""

from __future__ import annotations

import pytest

from agl_fake_k8s.lists import list_objects, parse_resource_version
from agl_fake_k8s.resources import SECRETS
from agl_fake_k8s.selectors import LabelSelector
from agl_fake_k8s.status import ApiError
from agl_fake_k8s.storage import Storage


def storage_with(*names: str) -> Storage:
    storage = Storage(history_limit=100)
    for name in names:
        storage.create(SECRETS, {"metadata": {"name": name, "namespace": "ns", "labels": {"n": name}}})
    return storage


def test_a_continuation_sees_the_snapshot_of_its_first_page() -> None:
    storage = storage_with("a", "b", "c")
    first = list_objects(storage, SECRETS, "ns", limit=1)
    storage.create(SECRETS, {"metadata": {"name": "aa", "namespace": "ns"}})  # after the snapshot: not listed
    rest = list_objects(storage, SECRETS, "ns", continue_token=first.continue_token)
    assert [o["metadata"]["name"] for o in first.items + rest.items] == ["a", "b", "c"]
    assert (first.remaining, rest.continue_token) == (2, None)


def test_selectors_apply_to_lists() -> None:
    listed = list_objects(storage_with("a", "b"), SECRETS, None, label_selector=LabelSelector("n=b"))
    assert [o["metadata"]["name"] for o in listed.items] == ["b"]


@pytest.mark.parametrize(
    ("kwargs", "status"),
    [
        ({"continue_token": "not-a-token"}, 400),
        ({"resource_version": "99", "resource_version_match": "Exact"}, 410),
    ],
)
def test_bad_or_unreachable_list_positions_are_refused(kwargs: dict[str, str], status: int) -> None:
    with pytest.raises(ApiError) as raised:
        list_objects(storage_with("a"), SECRETS, "ns", **kwargs)  # type: ignore[arg-type]
    assert raised.value.status == status


def test_resource_versions_are_decimal_numbers() -> None:
    assert parse_resource_version("42") == 42
    with pytest.raises(ApiError, match="invalid syntax"):
        parse_resource_version("abc")
