"""Garbage collection of dependents by ownerReferences: Background, Orphan (batch/v1's default), Foreground."""

from __future__ import annotations

import kubernetes.aio.client
from kubernetes.aio.client import BatchV1Api

from agl_fake_k8s import FakeK8s
from agl_fake_k8s.containers import alive
from agl_fake_k8s.manifests import container, job_manifest, pod_manifest
from agl_fake_k8s.storage import Event


async def running_job(k8s: FakeK8s, aio: kubernetes.aio.client.ApiClient, name: str) -> int:
    """Start a Job whose pod sleeps; returns the pod's process id once it runs."""
    await BatchV1Api(aio).create_namespaced_job("default", job_manifest(name, [container(["sleep", "30"])]))
    (pod,) = await k8s.wait_for_pods(
        "default", f"job-name={name}", lambda p: p and p[0]["status"]["phase"] == "Running"
    )
    pid = k8s.container_pid("default", pod["metadata"]["name"], "main")
    assert pid is not None
    return pid


async def test_background_deletion_removes_the_pods_and_kills_their_processes(
    k8s: FakeK8s, aio: kubernetes.aio.client.ApiClient
) -> None:
    pid = await running_job(k8s, aio, "bg")
    await BatchV1Api(aio).delete_namespaced_job("bg", "default", propagation_policy="Background")
    assert k8s.get("jobs", "default", "bg") is None  # the owner goes at once
    await k8s.wait_for(lambda: not k8s.objects("pods"))
    assert not alive(pid)


async def test_the_default_propagation_of_jobs_orphans_their_pods(
    k8s: FakeK8s, aio: kubernetes.aio.client.ApiClient
) -> None:
    pid = await running_job(k8s, aio, "orphaning")
    await BatchV1Api(aio).delete_namespaced_job("orphaning", "default")
    await k8s.wait_for(lambda: k8s.get("jobs", "default", "orphaning") is None)
    (pod,) = k8s.objects("pods", "default", "job-name=orphaning")
    assert "ownerReferences" not in pod["metadata"]
    assert alive(pid)  # an orphan keeps running


async def test_foreground_deletion_waits_for_the_dependents(
    k8s: FakeK8s, aio: kubernetes.aio.client.ApiClient
) -> None:
    await running_job(k8s, aio, "fg")
    order: list[str] = []

    def record(event: Event) -> None:  # sees every write, however fast the next one follows
        if event.type == "DELETED":
            order.append(f"{event.resource.kind} gone")

    k8s.storage.subscribe(record)
    await BatchV1Api(aio).delete_namespaced_job("fg", "default", propagation_policy="Foreground")
    await k8s.wait_for(lambda: k8s.get("jobs", "default", "fg") is None)
    assert order == ["Pod gone", "Job gone"]


async def test_a_dependent_of_a_missing_owner_is_collected(k8s: FakeK8s) -> None:
    manifest = pod_manifest("stray", [container(["sleep", "30"])])
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "ghost", "uid": "0000-gone", "controller": True}
    manifest["metadata"]["ownerReferences"] = [owner]
    k8s.create("pods", "default", manifest)
    await k8s.wait_for(lambda: k8s.get("pods", "default", "stray") is None)
