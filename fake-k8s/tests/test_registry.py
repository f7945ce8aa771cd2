"""The API server's write rules, called directly: defaults, generated names, status vs spec, deletion."""

from __future__ import annotations

import pytest

from agl_fake_k8s.manifests import container, job_manifest, pod_manifest
from agl_fake_k8s.registry import DeleteOptions, Registry
from agl_fake_k8s.resources import JOBS, PODS
from agl_fake_k8s.status import ApiError
from agl_fake_k8s.storage import Storage


@pytest.fixture
def registry() -> Registry:
    return Registry(Storage(history_limit=100))


def running_pod(registry: Registry, name: str = "p") -> dict[str, object]:
    registry.create(PODS, "ns", pod_manifest(name, [container(["true"])]), manager="test")
    registry.bind("ns", name, {"target": {"kind": "Node", "name": "n"}}, manager="test")
    return registry.get(PODS, "ns", name)


def test_a_generated_name_gets_five_random_characters(registry: Registry) -> None:
    manifest = pod_manifest("", [container(["true"])])
    manifest["metadata"] = {"generateName": "agl-run-"}
    created = registry.create(PODS, "ns", manifest, manager="test")
    name = created["metadata"]["name"]
    assert name.startswith("agl-run-")
    assert len(name) == len("agl-run-") + 5
    assert set(name[-5:]) <= set("bcdfghjklmnpqrstvwxz2456789")


def test_a_new_pod_gets_defaults_admission_fields_and_a_pending_status(registry: Registry) -> None:
    created = registry.create(
        PODS, "ns", pod_manifest("p", [container(["true"], image="busybox")]), manager="t"
    )
    spec = created["spec"]
    assert spec["containers"][0]["imagePullPolicy"] == "Always"  # an untagged image means latest
    assert (spec["priority"], spec["enableServiceLinks"], len(spec["tolerations"])) == (0, True, 2)
    assert created["status"] == {"phase": "Pending", "qosClass": "BestEffort"}


def test_updates_of_the_object_keep_its_status_and_status_updates_keep_its_spec(registry: Registry) -> None:
    created = registry.create(JOBS, "ns", job_manifest("j", [container(["true"])]), manager="t")
    changed = {**created, "spec": {**created["spec"], "parallelism": 2}, "status": {"active": 5}}
    updated = registry.update(JOBS, "ns", "j", changed, manager="t")
    assert (updated["spec"]["parallelism"], updated["status"]) == (2, {})
    changed = {**updated, "spec": {**updated["spec"], "parallelism": 3}, "status": {"active": 1}}
    updated = registry.update(JOBS, "ns", "j", changed, manager="t", subresource="status")
    assert (updated["spec"]["parallelism"], updated["status"]) == (2, {"active": 1})


def test_a_job_template_is_immutable(registry: Registry) -> None:
    created = registry.create(JOBS, "ns", job_manifest("j", [container(["true"])]), manager="t")
    template = created["spec"]["template"]
    changed = {
        **created,
        "spec": {
            **created["spec"],
            "template": {**template, "spec": {**template["spec"], "restartPolicy": "OnFailure"}},
        },
    }
    with pytest.raises(ApiError) as raised:
        registry.update(JOBS, "ns", "j", changed, manager="t")
    assert raised.value.status == 422
    assert raised.value.message.startswith('Job.batch "j" is invalid: spec.template: Invalid value: ')
    assert raised.value.message.endswith("field is immutable")


def test_a_scheduled_pod_is_deleted_gracefully_and_an_unscheduled_one_at_once(registry: Registry) -> None:
    running_pod(registry, "scheduled")
    registry.create(PODS, "ns", pod_manifest("pending", [container(["true"])]), manager="t")
    obj, gone = registry.delete(PODS, "ns", "scheduled", DeleteOptions(), manager="t")
    assert (gone, obj["metadata"]["deletionGracePeriodSeconds"]) == (False, 30)
    _, gone = registry.delete(PODS, "ns", "pending", DeleteOptions(), manager="t")
    assert gone
    assert registry.storage.get(PODS, "ns", "pending") is None
    _, gone = registry.delete(PODS, "ns", "scheduled", DeleteOptions(grace_period_s=0), manager="t")
    assert gone


def test_finalizers_hold_a_deletion_until_the_last_one_is_removed(registry: Registry) -> None:
    manifest = job_manifest("j", [container(["true"])])
    manifest["metadata"]["finalizers"] = ["example.com/hold"]
    registry.create(JOBS, "ns", manifest, manager="t")
    held, gone = registry.delete(JOBS, "ns", "j", DeleteOptions(propagation_policy="Background"), manager="t")
    assert not gone
    assert held["metadata"]["deletionTimestamp"]

    def release(job: dict[str, object]) -> None:
        job["metadata"].pop("finalizers")  # type: ignore[attr-defined]

    registry.mutate(JOBS, "ns", "j", release, manager="t")
    assert registry.storage.get(JOBS, "ns", "j") is None


def test_binding_a_bound_pod_is_a_conflict(registry: Registry) -> None:
    running_pod(registry)
    with pytest.raises(ApiError) as raised:
        registry.bind("ns", "p", {"target": {"kind": "Node", "name": "other"}}, manager="t")
    assert (
        raised.value.message
        == 'Operation cannot be fulfilled on pods/binding "p": pod p is already assigned to node "n"'
    )


def test_namespaces_can_be_restricted() -> None:
    registry = Registry(Storage(history_limit=10), namespaces=frozenset({"agl"}))
    with pytest.raises(ApiError) as raised:
        registry.create(PODS, "other", pod_manifest("p", [container(["true"])]), manager="t")
    assert (raised.value.status, raised.value.message) == (404, 'namespaces "other" not found')
