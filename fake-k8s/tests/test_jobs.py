"""The Job controller, driven through the real `kubernetes.aio` client, with containers run as subprocesses."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import kubernetes.aio.client
import kubernetes.aio.watch
import pytest
from kubernetes.aio.client import BatchV1Api, CoreV1Api

from agl_fake_k8s import FakeK8s, FakeK8sConfig, Timings, running_fake_k8s
from agl_fake_k8s.containers import alive
from agl_fake_k8s.manifests import container, job_manifest
from agl_fake_k8s.storage import Event

IGNORE_DISRUPTIONS = {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}


def sh(script: str) -> list[str]:
    return ["sh", "-c", script]


def condition(job: dict[str, Any], kind: str) -> dict[str, Any]:
    (found,) = [c for c in job["status"]["conditions"] if c["type"] == kind]
    return found


async def test_a_job_whose_container_exits_0_completes(
    k8s: FakeK8s, aio: kubernetes.aio.client.ApiClient
) -> None:
    await BatchV1Api(aio).create_namespaced_job("default", job_manifest("ok", [container(sh("exit 0"))]))
    job = await k8s.wait_for_job("default", "ok", "Complete")
    assert job["status"]["succeeded"] == 1
    assert "completionTime" in job["status"]
    assert "active" not in job["status"]
    (pod,) = k8s.objects("pods", "default", "job-name=ok")
    assert pod["metadata"]["labels"]["controller-uid"] == job["metadata"]["uid"]
    (owner,) = pod["metadata"]["ownerReferences"]
    assert owner == {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": "ok",
        "uid": job["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


async def test_a_failing_job_retries_with_a_new_pod_then_fails_at_its_backoff_limit(
    k8s: FakeK8s, aio: kubernetes.aio.client.ApiClient
) -> None:
    await BatchV1Api(aio).create_namespaced_job(
        "default", job_manifest("bad", [container(sh("exit 3"))], backoff_limit=1)
    )
    job = await k8s.wait_for_job("default", "bad", "Failed")
    failed = condition(job, "Failed")
    assert (failed["reason"], failed["message"]) == (
        "BackoffLimitExceeded",
        "Job has reached the specified backoff limit",
    )
    assert job["status"]["failed"] == 2
    pods = (await CoreV1Api(aio).list_namespaced_pod("default", label_selector="job-name=bad")).items
    assert len({p.metadata.uid for p in pods}) == 2
    assert {p.status.container_statuses[0].state.terminated.exit_code for p in pods} == {3}


async def test_a_fail_job_exit_code_fails_the_job_at_once(
    k8s: FakeK8s, aio: kubernetes.aio.client.ApiClient
) -> None:
    policy = {
        "rules": [
            IGNORE_DISRUPTIONS,
            {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}},
        ]
    }
    manifest = job_manifest(
        "fatal", [container(sh("exit 42"), name="agent")], backoff_limit=5, podFailurePolicy=policy
    )
    await BatchV1Api(aio).create_namespaced_job("default", manifest)
    job = await k8s.wait_for_job("default", "fatal", "Failed")
    failed = condition(job, "Failed")
    (pod,) = k8s.objects("pods", "default", "job-name=fatal")
    assert failed["reason"] == "PodFailurePolicy"
    assert failed["message"] == (
        f"Container agent for pod default/{pod['metadata']['name']} failed with exit code 42 "
        "matching FailJob rule at index 1"
    )


async def test_an_evicted_pod_is_ignored_by_the_failure_policy_and_replaced(
    k8s: FakeK8s, aio: kubernetes.aio.client.ApiClient, tmp_path: Path
) -> None:
    marker = tmp_path / "second-attempt"
    script = f"if [ -e {marker} ]; then exit 0; fi; touch {marker}; echo waiting; exec sleep 30"
    manifest = job_manifest(
        "evictee", [container(sh(script))], podFailurePolicy={"rules": [IGNORE_DISRUPTIONS]}
    )
    await BatchV1Api(aio).create_namespaced_job("default", manifest)
    (first,) = await k8s.wait_for_pods("default", "job-name=evictee", lambda p: len(p) == 1)
    await k8s.wait_for(lambda: "waiting" in k8s.logs("default", first["metadata"]["name"], "main"))
    pid = k8s.container_pid("default", first["metadata"]["name"], "main")
    assert pid is not None

    assert k8s.evict_pod("default", first["metadata"]["name"])
    job = await k8s.wait_for_job("default", "evictee", "Complete")

    assert "failed" not in job["status"]  # the eviction burnt no retry (backoffLimit is 0)
    evicted = k8s.get("pods", "default", first["metadata"]["name"])
    assert evicted is not None
    assert (evicted["status"]["phase"], evicted["status"]["reason"]) == ("Failed", "Evicted")
    disruption = [c for c in evicted["status"]["conditions"] if c["type"] == "DisruptionTarget"]
    assert [(c["status"], c["reason"]) for c in disruption] == [("True", "TerminationByKubelet")]
    assert not alive(pid)


async def test_active_deadline_fails_the_job_and_kills_its_pod(
    k8s: FakeK8s, aio: kubernetes.aio.client.ApiClient
) -> None:
    manifest = job_manifest("slow", [container(["sleep", "30"])], backoff_limit=3, activeDeadlineSeconds=5)
    await BatchV1Api(aio).create_namespaced_job("default", manifest)
    (pod,) = await k8s.wait_for_pods(
        "default", "job-name=slow", lambda p: p and p[0]["status"]["phase"] == "Running"
    )
    pid = k8s.container_pid("default", pod["metadata"]["name"], "main")
    assert pid is not None
    job = await k8s.wait_for_job("default", "slow", "Failed")
    failed = condition(job, "Failed")
    assert (failed["reason"], failed["message"]) == (
        "DeadlineExceeded",
        "Job was active longer than specified deadline",
    )
    await k8s.wait_for(lambda: not alive(pid))


async def test_the_retry_backoff_is_injectable() -> None:
    timings = Timings(job_backoff_s=60.0)  # the second retry would wait a minute
    async with running_fake_k8s(FakeK8sConfig(timings=timings)) as k8s:
        async with kubernetes.aio.client.ApiClient(k8s.aio_api_client_config()) as api:
            await BatchV1Api(api).create_namespaced_job(
                "default", job_manifest("b", [container(sh("exit 1"))], backoff_limit=5)
            )
            pods = await k8s.wait_for_pods(
                "default",
                "job-name=b",
                lambda p: len(p) == 2 and all(x["status"]["phase"] == "Failed" for x in p),
            )
            assert len(pods) == 2  # the first retry is immediate, as in the 1.20 transcript
            with pytest.raises(TimeoutError):  # proving that the third pod does not come yet
                await k8s.wait_for(lambda: len(k8s.objects("pods", "default", "job-name=b")) > 2, timeout=0.5)


async def test_a_restarted_controller_continues_from_storage_without_duplicates(
    k8s: FakeK8s, aio: kubernetes.aio.client.ApiClient, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    script = f"while [ ! -e {go} ]; do sleep 0.02; done"
    await k8s.stop_job_controller()
    await BatchV1Api(aio).create_namespaced_job("default", job_manifest("steady", [container(sh(script))]))
    with pytest.raises(TimeoutError):  # no controller, no pod
        await k8s.wait_for(lambda: k8s.objects("pods", "default", "job-name=steady"), timeout=0.2)
    k8s.start_job_controller()
    await k8s.wait_for_pods(
        "default", "job-name=steady", lambda p: p and p[0]["status"]["phase"] == "Running"
    )
    await k8s.restart_job_controller()
    await k8s.restart_job_controller()
    go.touch()
    job = await k8s.wait_for_job("default", "steady", "Complete")
    assert job["status"]["succeeded"] == 1
    assert len(k8s.objects("pods", "default", "job-name=steady")) == 1


async def test_ttl_after_finished_deletes_the_job_and_its_pods(
    k8s: FakeK8s, aio: kubernetes.aio.client.ApiClient
) -> None:
    job_events: list[tuple[str, bool]] = []

    def record(event: Event) -> None:  # sees every write, however fast the next one follows
        if event.resource.kind == "Job":
            complete = any(c["type"] == "Complete" for c in event.obj.get("status", {}).get("conditions", []))
            job_events.append((event.type, complete))

    k8s.storage.subscribe(record)
    await BatchV1Api(aio).create_namespaced_job(
        "default", job_manifest("short-lived", [container(sh("exit 0"))], ttlSecondsAfterFinished=1)
    )
    await k8s.wait_for(
        lambda: (
            k8s.get("jobs", "default", "short-lived") is None
            and not k8s.objects("pods", "default", "job-name=short-lived")
        )
    )
    assert ("MODIFIED", True) in job_events  # the outcome was written before the job went
    assert job_events[-1] == ("DELETED", True)


async def test_completions_and_parallelism_run_pods_side_by_side(
    k8s: FakeK8s, aio: kubernetes.aio.client.ApiClient
) -> None:
    manifest = job_manifest("pair", [container(sh("exit 0"))], parallelism=2, completions=3)
    await BatchV1Api(aio).create_namespaced_job("default", manifest)
    job = await k8s.wait_for_job("default", "pair", "Complete")
    assert job["status"]["succeeded"] == 3
    assert len(k8s.objects("pods", "default", "job-name=pair")) == 3


async def test_a_suspended_job_starts_no_pod_until_resumed(
    k8s: FakeK8s, aio: kubernetes.aio.client.ApiClient
) -> None:
    batch = BatchV1Api(aio)
    await batch.create_namespaced_job(
        "default", job_manifest("later", [container(sh("exit 0"))], suspend=True)
    )
    with pytest.raises(TimeoutError):
        await k8s.wait_for(lambda: k8s.objects("pods", "default", "job-name=later"), timeout=0.2)
    await batch.patch_namespaced_job("later", "default", {"spec": {"suspend": False}})
    await k8s.wait_for_job("default", "later", "Complete")


async def test_init_containers_run_before_the_main_container(
    k8s: FakeK8s, aio: kubernetes.aio.client.ApiClient
) -> None:
    volume_mount = [{"name": "shared", "mountPath": "/shared"}]
    init = container(sh("echo graded > /shared/result"), name="agent", volumeMounts=volume_mount)
    main = container(
        sh("cat /shared/result > /dev/termination-log"), name="grader", volumeMounts=volume_mount
    )
    pod_spec = {"initContainers": [init], "volumes": [{"name": "shared", "emptyDir": {}}]}
    await BatchV1Api(aio).create_namespaced_job("default", job_manifest("graded", [main], pod_spec=pod_spec))
    await k8s.wait_for_job("default", "graded", "Complete")
    (pod,) = k8s.objects("pods", "default", "job-name=graded")
    (init_status,) = pod["status"]["initContainerStatuses"]
    (main_status,) = pod["status"]["containerStatuses"]
    assert init_status["state"]["terminated"]["finishedAt"] <= main_status["state"]["terminated"]["startedAt"]
    assert main_status["state"]["terminated"]["message"] == "graded\n"


async def test_jobs_created_concurrently_all_complete(
    k8s: FakeK8s, aio: kubernetes.aio.client.ApiClient
) -> None:
    batch = BatchV1Api(aio)
    names = [f"many-{i}" for i in range(10)]
    await asyncio.gather(
        *(batch.create_namespaced_job("default", job_manifest(n, [container(["true"])])) for n in names)
    )
    for name in names:
        await k8s.wait_for_job("default", name, "Complete")


async def test_a_job_watched_with_the_aio_client_reports_its_failure(
    k8s: FakeK8s, aio: kubernetes.aio.client.ApiClient
) -> None:
    batch = BatchV1Api(aio)
    listed = await batch.list_namespaced_job("default")
    await batch.create_namespaced_job(
        "default", job_manifest("watched", [container(sh("exit 3"))], backoff_limit=1)
    )
    watch = kubernetes.aio.watch.Watch()
    seen: list[tuple[str, int]] = []
    async for event in watch.stream(
        batch.list_namespaced_job,
        "default",
        resource_version=listed.metadata.resource_version,
        timeout_seconds=10,
    ):
        job = event["object"]
        seen.append((event["type"], job.status.failed or 0))
        if any(c.type == "Failed" and c.status == "True" for c in job.status.conditions or []):
            watch.stop()
            break
    assert seen[0] == ("ADDED", 0)
    assert seen[-1] == ("MODIFIED", 2)
    assert job.status.conditions[0].reason == "BackoffLimitExceeded"


async def test_a_pod_deleted_by_hand_is_replaced_at_once_while_it_terminates(
    k8s: FakeK8s, aio: kubernetes.aio.client.ApiClient, tmp_path: Path
) -> None:
    # Issue #15: a real 1.20 Job controller does not count a terminating pod as active and starts its
    # replacement at once, so the two run side by side for the grace period; the fake waited for the old to go.
    marker = tmp_path / "second"
    script = f"if [ -e {marker} ]; then exit 0; fi; touch {marker}; trap '' TERM; echo waiting; sleep 30"
    await BatchV1Api(aio).create_namespaced_job("default", job_manifest("hand", [container(sh(script))]))
    (first,) = await k8s.wait_for_pods("default", "job-name=hand", lambda p: len(p) == 1)
    name = first["metadata"]["name"]
    await k8s.wait_for(lambda: "waiting" in k8s.logs("default", name, "main"))
    await CoreV1Api(aio).delete_namespaced_pod(name, "default")
    both = await k8s.wait_for_pods(
        "default",
        "job-name=hand",
        lambda p: (
            len(p) == 2
            and any(x["metadata"]["name"] == name and x["metadata"].get("deletionTimestamp") for x in p)
        ),
    )
    assert {p["metadata"]["name"] for p in both} - {name}  # the replacement, beside the terminating pod
    job = await k8s.wait_for_job("default", "hand", "Complete")
    assert "failed" not in job["status"]  # a deleted pod is no failure
