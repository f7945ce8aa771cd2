"""The public entry point: `running_fake_k8s`, client configurations, waits, counters and clean-up."""

from __future__ import annotations

import asyncio
from pathlib import Path

import kubernetes.client
import pytest

from agl_fake_k8s import FakeK8s, FakeK8sConfig, running_fake_k8s
from agl_fake_k8s.containers import alive
from agl_fake_k8s.manifests import container, job_manifest


async def test_the_sync_client_configuration_reaches_the_server_with_its_token(k8s: FakeK8s) -> None:
    api = kubernetes.client.ApiClient(k8s.api_client_config())
    jobs = await asyncio.to_thread(kubernetes.client.BatchV1Api(api).list_namespaced_job, "default")
    assert jobs.items == []
    assert k8s.requests[("list", "jobs")] == 1
    (record,) = k8s.request_log
    assert (record.verb, record.resource, record.namespace, record.status) == ("list", "jobs", "default", 200)


async def test_a_given_token_is_the_one_checked(tmp_path: Path) -> None:
    async with running_fake_k8s(FakeK8sConfig(token="t0ken", work_root=tmp_path / "pods")) as k8s:
        assert k8s.token == "t0ken"
        assert k8s.api_client_config().api_key == {"authorization": "t0ken"}
        assert k8s.url.startswith("http://127.0.0.1:")


async def test_wait_for_gives_up_with_timeout_error(k8s: FakeK8s) -> None:
    with pytest.raises(TimeoutError):
        await k8s.wait_for(lambda: k8s.get("jobs", "default", "never"), timeout=0.05)


async def test_leaving_the_block_kills_running_containers(tmp_path: Path) -> None:
    async with running_fake_k8s(FakeK8sConfig(work_root=tmp_path / "pods")) as k8s:
        k8s.create("jobs", "default", job_manifest("sleepy", [container(["sleep", "30"])]))
        (pod,) = await k8s.wait_for_pods(
            "default", "job-name=sleepy", lambda p: p and p[0]["status"]["phase"] == "Running"
        )
        pid = k8s.container_pid("default", pod["metadata"]["name"], "main")
        assert pid is not None
    assert not alive(pid)


def test_unknown_resource_names_are_refused_clearly() -> None:
    fake = FakeK8s(FakeK8sConfig(), Path("/nonexistent"))
    with pytest.raises(ValueError, match="unknown resource 'deployments': one of jobs, pods, secrets"):
        fake.get("deployments", "default", "x")
