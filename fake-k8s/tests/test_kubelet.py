"""The node: the scheduler binds pods to it within its capacity; the kubelet runs only the pods bound to it."""

from __future__ import annotations

from typing import Any

import pytest

from agl_fake_k8s import FakeK8s, FakeK8sConfig, Timings, running_fake_k8s
from agl_fake_k8s.manifests import container, pod_manifest


def pod(k8s: FakeK8s, name: str) -> dict[str, Any]:
    return k8s.get("pods", "default", name) or {"spec": {}, "status": {}}


async def test_pods_beyond_max_pods_wait_unscheduled_until_capacity_frees() -> None:
    async with running_fake_k8s(FakeK8sConfig(timings=Timings(time_scale=0.02), max_pods=1)) as k8s:
        k8s.create("pods", "default", pod_manifest("first", [container(["sleep", "30"])]))
        await k8s.wait_for(lambda: pod(k8s, "first")["status"]["phase"] == "Running")
        k8s.create("pods", "default", pod_manifest("second", [container(["true"])]))
        with pytest.raises(TimeoutError):  # proving it is not scheduled yet
            await k8s.wait_for(lambda: pod(k8s, "second")["spec"].get("nodeName"), timeout=0.2)
        k8s.delete("pods", "default", "first")
        await k8s.wait_for(lambda: pod(k8s, "second")["status"]["phase"] == "Succeeded")


async def test_a_pod_bound_to_another_node_is_not_run(k8s: FakeK8s) -> None:
    k8s.create("pods", "default", pod_manifest("elsewhere", [container(["true"])], nodeName="other-node"))
    with pytest.raises(TimeoutError):  # proving the kubelet leaves it alone
        await k8s.wait_for(lambda: pod(k8s, "elsewhere")["status"].get("startTime"), timeout=0.2)
    assert k8s.container_pid("default", "elsewhere", "main") is None
