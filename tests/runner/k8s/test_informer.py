"""List-then-watch against the fake API server: changes reach the cache and name their rollout; a clean end of
the watch resumes from its resourceVersion, a 410 or a cut stream relists, and so does a due resync (on an
injected clock)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.aio.client import ApiClient

from agl_fake_k8s import FakeK8s
from agl_lite.runner.k8s.cache import Cache
from agl_lite.runner.k8s.informer import Informer
from agl_lite.runner.k8s.kube import KubeApi, load_configuration
from agl_lite.runner.k8s.ratelimit import TokenBucket
from tests.runner.k8s.conftest import NAMESPACE, write_kubeconfig

SELECTOR = "app.kubernetes.io/managed-by=agl-lite"


def job(name: str, rollout_id: str) -> dict[str, Any]:
    labels = {"app.kubernetes.io/managed-by": "agl-lite"}
    container = {"name": "agent", "image": "a:1", "command": ["/bin/sh", "-c", "exit 0"]}
    return {
        "metadata": {"name": name, "labels": labels, "annotations": {"agl-lite/rollout-id": rollout_id}},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [container]}}},
    }


class Running:
    def __init__(self, informer: Informer, touched: list[str], clock: list[float]) -> None:
        self.informer = informer
        self.touched = touched
        self.clock = clock


@pytest.fixture
async def running(cluster: FakeK8s, tmp_path: Path) -> AsyncIterator[Running]:
    config = await load_configuration(str(write_kubeconfig(tmp_path / "kubeconfig", cluster)))
    api = KubeApi(ApiClient(config), NAMESPACE, TokenBucket(1000, 1000))
    touched: list[str] = []
    clock = [0.0]
    informer = Informer(
        api,
        "jobs",
        SELECTOR,
        Cache(),
        touched.extend,
        watch_timeout_s=60,
        resync_s=100.0,
        clock=lambda: clock[0],
    )
    await informer.list()
    task = asyncio.ensure_future(informer.run())
    try:
        await cluster.wait_for(lambda: cluster.open_watches >= 1 or None)
        yield Running(informer, touched, clock)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await api.close()


async def test_a_created_job_reaches_the_cache_and_names_its_rollout(
    running: Running, cluster: FakeK8s
) -> None:
    cluster.create("jobs", NAMESPACE, job("agl-ro-1", "ro-1"))
    await cluster.wait_for(lambda: "agl-ro-1" in running.informer.cache.jobs or None)
    assert "ro-1" in running.touched
    assert running.informer.lists == 1


async def test_a_clean_end_of_the_watch_resumes_without_a_list(running: Running, cluster: FakeK8s) -> None:
    opened = cluster.watches_opened
    assert cluster.drop_watches() == 1
    await cluster.wait_for(lambda: cluster.watches_opened > opened or None)
    cluster.create("jobs", NAMESPACE, job("agl-ro-2", "ro-2"))
    await cluster.wait_for(lambda: "agl-ro-2" in running.informer.cache.jobs or None)
    assert running.informer.lists == 1


async def test_an_expired_version_relists_and_misses_nothing(running: Running, cluster: FakeK8s) -> None:
    cluster.expire_next_watches(1)
    cluster.drop_watches(abrupt=True)
    cluster.create("jobs", NAMESPACE, job("agl-ro-3", "ro-3"))  # made while no watch is open
    await cluster.wait_for(lambda: "agl-ro-3" in running.informer.cache.jobs or None)
    assert running.informer.lists >= 2


async def test_a_due_resync_relists(running: Running, cluster: FakeK8s) -> None:
    running.clock[0] = 1000.0  # past resync_s
    cluster.drop_watches()  # the watch would have ended at its timeoutSeconds
    await cluster.wait_for(lambda: running.informer.lists >= 2 or None)
    assert running.informer.expired == 0
