"""The fake's etcd: one resourceVersion for everything, a bounded history, snapshots at an old revision."""

from __future__ import annotations

from agl_fake_k8s.resources import JOBS, SECRETS
from agl_fake_k8s.storage import Event, Storage


def obj(name: str, **extra: object) -> dict[str, object]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"}, **extra}


def test_every_write_of_any_resource_bumps_the_one_resource_version() -> None:
    storage = Storage(history_limit=10)
    seen: list[Event] = []
    storage.subscribe(seen.append)
    first = storage.create(JOBS, obj("a"))
    second = storage.create(SECRETS, obj("b"))
    assert (first["metadata"]["resourceVersion"], second["metadata"]["resourceVersion"]) == ("2", "3")
    assert [(e.type, e.rv) for e in seen] == [("ADDED", 2), ("ADDED", 3)]


def test_history_replays_after_a_resource_version_until_it_is_compacted() -> None:
    storage = Storage(history_limit=2)
    for name in "abc":
        storage.create(SECRETS, obj(name))
    assert [e.name for e in storage.events_after(3) or []] == ["c"]
    assert storage.events_after(1) is None  # event 2 fell out of the bounded history
    storage.compact()
    assert storage.events_after(3) is None
    assert storage.events_after(storage.rv) == []


def test_state_at_an_old_revision_undoes_later_writes() -> None:
    storage = Storage(history_limit=10)
    storage.create(SECRETS, obj("a", data={"k": "1"}))
    rv = storage.rv
    old = storage.get(SECRETS, "ns", "a")
    assert old is not None
    storage.update(SECRETS, {**old, "data": {"k": "2"}, "metadata": dict(old["metadata"])}, old)
    storage.create(SECRETS, obj("b"))
    current = storage.get(SECRETS, "ns", "a")
    assert current is not None
    storage.delete(SECRETS, {**current, "metadata": dict(current["metadata"])})
    snapshot = storage.state_at(SECRETS, rv)
    assert snapshot is not None
    assert [(o["metadata"]["name"], o["data"]) for o in snapshot] == [("a", {"k": "1"})]
    assert storage.items(SECRETS) == [storage.get(SECRETS, "ns", "b")]


def test_dependents_are_found_by_owner_uid() -> None:
    storage = Storage(history_limit=10)
    child = obj("child")
    child["metadata"]["ownerReferences"] = [{"uid": "uid-parent", "kind": "Job", "name": "parent"}]  # type: ignore[index]
    storage.create(SECRETS, child)
    assert [o["metadata"]["name"] for _, o in storage.dependents("uid-parent")] == ["child"]
    stored = storage.get(SECRETS, "ns", "child")
    assert stored is not None
    storage.delete(SECRETS, dict(stored, metadata=dict(stored["metadata"])))
    assert storage.dependents("uid-parent") == []
