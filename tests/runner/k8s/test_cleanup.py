"""The janitor, against the fake cluster and a store in memory: Jobs go only once their rollout is terminal on
the completion cursor, a page of them per request, with Background propagation; the sweep deletes what ended
while nobody followed and leaves alone what it does not know."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.aio.client import ApiClient

from agl_fake_k8s import FakeK8s
from agl_lite.runner.k8s.cache import Cache
from agl_lite.runner.k8s.cleanup import JobJanitor
from agl_lite.runner.k8s.kube import KubeApi, load_configuration
from agl_lite.runner.k8s.manifest import INSTANCE_LABEL
from agl_lite.runner.k8s.names import MANAGED_SELECTOR, job_name
from agl_lite.runner.k8s.ratelimit import TokenBucket
from agl_lite.store.memory import MemoryStore
from agl_lite.store.records import RolloutStatus
from agl_lite.store.rules import RolloutSpec
from tests.runner.k8s.conftest import NAMESPACE, write_kubeconfig

SELECTOR = f"{MANAGED_SELECTOR},{INSTANCE_LABEL}=agl-lite"


def job(rollout_id: str) -> dict[str, Any]:
    labels = {
        "app.kubernetes.io/managed-by": "agl-lite",
        INSTANCE_LABEL: "agl-lite",
        "agl-lite/rollout": rollout_id,
    }
    container = {"name": "agent", "image": "a:1", "command": ["/bin/sh", "-c", "exit 0"]}
    return {
        "metadata": {
            "name": job_name(rollout_id),
            "labels": labels,
            "annotations": {"agl-lite/rollout-id": rollout_id},
        },
        "spec": {
            "template": {
                "metadata": {"labels": labels},
                "spec": {"restartPolicy": "Never", "containers": [container]},
            }
        },
    }


@pytest.fixture
async def kube(cluster: FakeK8s, tmp_path: Path) -> AsyncIterator[KubeApi]:
    config = await load_configuration(str(write_kubeconfig(tmp_path / "kubeconfig", cluster)))
    api = KubeApi(ApiClient(config), NAMESPACE, TokenBucket(1000, 1000))
    try:
        yield api
    finally:
        await api.close()


async def running(store: MemoryStore, *ids: str) -> None:
    await store.enqueue([RolloutSpec({"q": i}, id=i) for i in ids])
    await store.claim("k8s", len(ids))


async def janitor_for(kube: KubeApi, cluster: FakeK8s, ids: list[str]) -> tuple[JobJanitor, Cache, list[str]]:
    cache = Cache()
    for rid in ids:
        cache.put_job(cluster.create("jobs", NAMESPACE, job(rid)))
    ended: list[str] = []
    return JobJanitor(kube, cache, SELECTOR, ended=ended.append), cache, ended


async def test_jobs_go_once_their_rollouts_are_on_the_completion_cursor_a_page_per_request(
    kube: KubeApi, cluster: FakeK8s
) -> None:
    store = MemoryStore()
    ids = ["ro-a", "ro-b", "ro-c"]
    await running(store, *ids)
    janitor, _, ended = await janitor_for(kube, cluster, ids)
    follower = asyncio.ensure_future(janitor.follow_completions(store, 0))
    try:
        await store.finish("ro-a", RolloutStatus.SUCCEEDED)
        await store.cancel("ro-b")
        await cluster.wait_for(lambda: len(cluster.objects("jobs", NAMESPACE)) == 1 or None)
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
    assert [j["metadata"]["name"] for j in cluster.objects("jobs", NAMESPACE)] == [
        "agl-ro-c"
    ]  # still running
    assert sorted(ended) == ["ro-a", "ro-b"]
    deletes = [r for r in cluster.request_log if r.verb in ("delete", "deletecollection")]
    assert 1 <= len(deletes) <= 2  # a page per request: one, unless the two completions came in two pages


async def test_a_page_of_jobs_is_one_deletecollection(kube: KubeApi, cluster: FakeK8s) -> None:
    store = MemoryStore()
    ids = [f"ro-{i}" for i in range(5)]
    await running(store, *ids)
    for rid in ids:
        await store.finish(rid, RolloutStatus.FAILED)
    janitor, _, _ = await janitor_for(kube, cluster, ids)
    follower = asyncio.ensure_future(janitor.follow_completions(store, 0))
    try:
        await cluster.wait_for(lambda: not cluster.objects("jobs", NAMESPACE) or None)
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
    deletes = [(r.verb, r.status) for r in cluster.request_log if r.verb.startswith("delete")]
    assert deletes == [("deletecollection", 200)]


async def test_the_sweep_deletes_ended_rollouts_jobs_and_leaves_the_rest(
    kube: KubeApi, cluster: FakeK8s
) -> None:
    store = MemoryStore()
    await running(store, "ro-done", "ro-busy")
    await store.finish("ro-done", RolloutStatus.SUCCEEDED)
    janitor, _, _ = await janitor_for(kube, cluster, ["ro-done", "ro-busy", "ro-unknown"])
    await janitor.sweep(store, busy={"ro-busy"})
    names = sorted(j["metadata"]["name"] for j in cluster.objects("jobs", NAMESPACE))
    assert names == ["agl-ro-busy", "agl-ro-unknown"]
    delete = next(r for r in cluster.request_log if r.verb == "delete")
    assert (delete.name, delete.status) == ("agl-ro-done", 200)
    await janitor.sweep(
        store, busy={"ro-busy"}
    )  # once is enough: the cache still shows it, the janitor knows
    assert [r.verb for r in cluster.request_log].count("delete") == 1
