"""The adapter over `kubernetes.aio`, against the fake API server: typed errors, 429s retried after their
Retry-After (on an injected clock: 0 s of real waiting), every request through the token bucket."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.aio.client import ApiClient

from agl_fake_k8s import FakeK8s
from agl_lite.errors import ConfigError
from agl_lite.runner.k8s.kube import AlreadyExists, Gone, KubeApi, KubeError, load_configuration
from agl_lite.runner.k8s.ratelimit import TokenBucket
from tests.runner.k8s.conftest import NAMESPACE, write_kubeconfig

SELECTOR = "app.kubernetes.io/managed-by=agl-lite"


class Sleeps:
    def __init__(self) -> None:
        self.seconds: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.seconds.append(seconds)


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
async def api(cluster: FakeK8s, tmp_path: Path, sleeps: Sleeps) -> AsyncIterator[KubeApi]:
    config = await load_configuration(str(write_kubeconfig(tmp_path / "kubeconfig", cluster)))
    kube = KubeApi(ApiClient(config), NAMESPACE, TokenBucket(1000, 1000), retries=3, sleep=sleeps)
    try:
        yield kube
    finally:
        await kube.close()


def job(name: str = "agl-ro-1") -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "agl-lite"}},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {"app.kubernetes.io/managed-by": "agl-lite"}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "agent", "image": "a:1", "command": ["/bin/sh", "-c", "exit 0"]}],
                },
            },
        },
    }


async def test_a_second_create_is_already_exists_and_the_job_is_there_once(
    api: KubeApi, cluster: FakeK8s
) -> None:
    created = await api.create_job(job())
    with pytest.raises(AlreadyExists) as info:
        await api.create_job(job())
    assert (info.value.status, info.value.reason) == (409, "AlreadyExists")
    assert created["metadata"]["uid"]
    assert len(cluster.objects("jobs", NAMESPACE)) == 1


async def test_a_missing_job_reads_as_none_and_deletes_as_false(api: KubeApi) -> None:
    assert await api.get_job("agl-none") is None
    assert await api.delete_job("agl-none") is False


async def test_delete_is_background_so_the_pods_go_with_the_job(api: KubeApi, cluster: FakeK8s) -> None:
    await api.create_job(job())
    await cluster.wait_for_job(NAMESPACE, "agl-ro-1", "Complete")
    assert await api.delete_job("agl-ro-1") is True
    delete = next(r for r in cluster.request_log if r.verb == "delete")
    assert (delete.resource, delete.status) == ("jobs", 200)
    await cluster.wait_for(lambda: not cluster.objects("pods", NAMESPACE) or None)


async def test_a_429_is_retried_after_its_retry_after(api: KubeApi, cluster: FakeK8s, sleeps: Sleeps) -> None:
    cluster.throttle_next_requests(2, retry_after_s=7)
    items, rv = await api.list_jobs(SELECTOR)
    assert (items, sleeps.seconds, api.throttled) == ([], [7.0, 7.0], 2)
    assert rv
    assert cluster.responses_by_status[429] == 2


async def test_retry_after_is_capped(api: KubeApi, cluster: FakeK8s, sleeps: Sleeps) -> None:
    api.max_retry_after_s = 2.0
    cluster.throttle_next_requests(1, retry_after_s=600)
    await api.list_pods(SELECTOR)
    assert sleeps.seconds == [2.0]


async def test_throttling_past_the_retries_is_an_error(api: KubeApi, cluster: FakeK8s) -> None:
    cluster.throttle_next_requests(10)
    with pytest.raises(KubeError) as info:
        await api.list_jobs(SELECTOR)
    assert info.value.status == 429
    assert api.throttled == 4  # the first try and 3 retries


async def test_a_refused_object_is_an_error_with_the_servers_message(api: KubeApi) -> None:
    bad = job("Bad_Name")
    with pytest.raises(KubeError) as info:
        await api.create_job(bad)
    assert info.value.status == 422
    assert "Bad_Name" in info.value.message


async def test_a_watch_from_an_expired_version_raises_gone(api: KubeApi, cluster: FakeK8s) -> None:
    await api.create_job(job())
    cluster.compact_history()
    with pytest.raises(Gone):
        async for _ in api.watch("jobs", SELECTOR, "1", 5):
            pass


async def test_a_watch_resumes_from_a_list(api: KubeApi, cluster: FakeK8s) -> None:
    _, rv = await api.list_jobs(SELECTOR)
    await api.create_job(job())
    events = []
    async for event in api.watch("jobs", SELECTOR, rv, 5):
        events.append((event.type, event.object["metadata"]["name"]))
        if event.type == "ADDED":
            cluster.drop_watches()
    assert events[0] == ("ADDED", "agl-ro-1")


async def test_every_request_takes_a_token(cluster: FakeK8s, tmp_path: Path) -> None:
    config = await load_configuration(str(write_kubeconfig(tmp_path / "kc", cluster)))
    now = [0.0]
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        now[0] += seconds

    kube = KubeApi(ApiClient(config), NAMESPACE, TokenBucket(10, 2, clock=lambda: now[0], sleep=sleep))
    try:
        for _ in range(4):
            await kube.list_jobs(SELECTOR)
    finally:
        await kube.close()
    assert waits == pytest.approx([0.1, 0.1])
    assert kube.requests == 4


async def test_a_bad_kubeconfig_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "kc").write_text("not: [a kubeconfig")
    with pytest.raises(ConfigError, match="Kubernetes client configuration"):
        await load_configuration(str(tmp_path / "kc"))
