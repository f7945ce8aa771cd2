"""The cache: indexes pods by rollout and reports which rollouts each change touched."""

from __future__ import annotations

from typing import Any

from agl_lite.runner.k8s.cache import Cache


def pod(uid: str, rollout: str, phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {"name": f"p-{uid}", "uid": uid, "annotations": {"agl-lite/rollout-id": rollout}},
        "status": {"phase": phase},
    }


def job(name: str, rollout: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": f"u-{name}", "annotations": {"agl-lite/rollout-id": rollout}}}


def test_pods_are_found_by_rollout_and_changes_name_their_rollout() -> None:
    cache = Cache()
    assert cache.put_pod(pod("a", "r1")) == {"r1"}
    assert cache.put_pod(pod("b", "r1")) == {"r1"}
    assert cache.put_pod(pod("c", "r2")) == {"r2"}
    assert {p.uid for p in cache.pods_of("r1")} == {"a", "b"}
    assert cache.drop_pod(pod("a", "r1")) == {"r1"}
    assert [p.uid for p in cache.pods_of("r1")] == ["b"]


def test_a_relist_reports_rollouts_whose_objects_went_away() -> None:
    cache = Cache()
    cache.put_job(job("agl-r1", "r1"))
    cache.put_job(job("agl-r2", "r2"))
    assert cache.replace_jobs([job("agl-r2", "r2"), job("agl-r3", "r3")]) == {"r1", "r2", "r3"}
    assert set(cache.jobs) == {"agl-r2", "agl-r3"}
    cache.put_pod(pod("a", "r1"))
    assert cache.replace_pods([]) == {"r1"}
    assert cache.pods_of("r1") == []


def test_objects_of_no_rollout_touch_nothing() -> None:
    cache = Cache()
    assert cache.put_pod({"metadata": {"uid": "x"}, "status": {}}) == set()
    assert cache.put_job({"metadata": {}}) == set()
