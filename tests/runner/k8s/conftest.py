"""The fake cluster (real `kubernetes` client, containers as local subprocesses) and a gateway whose runner runs
rollouts as Jobs on it: the SQLite store, capture, the mock vLLM upstream; agents reach the gateway over loopback.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from agl_fake_k8s import FakeK8s, FakeK8sConfig, Timings, running_fake_k8s
from agl_fake_k8s.config import DEFAULT_NAMESPACES
from agl_lite.client import AglLiteClient
from agl_lite.core.server import Gateway
from agl_lite.runner.k8s import K8sBackend
from agl_lite.service import running_gateway
from agl_lite.store.records import RolloutConfig
from agl_lite.store.rules import RolloutSpec
from agl_lite.testing import MockVLLM, running_mock
from agl_lite.testing.gateway import write_config
from tests.conftest import ADMIN_KEY, gateway_url
from tests.runner.agents import RunnerHarness

NAMESPACE = "agents"
CAPTURE_CHAIN = ("store", "auth", "store_api", "route", "capture", "sink")


def write_kubeconfig(path: Path, cluster: FakeK8s) -> Path:
    """A kubeconfig for the fake, so the backend loads its client configuration the way it does in production."""
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": cluster.url}}],
                "users": [{"name": "tester", "user": {"token": cluster.token}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "tester"}}],
                "current-context": "fake",
            }
        )
    )
    return path


@pytest.fixture
async def cluster() -> AsyncIterator[FakeK8s]:
    # a 30 s grace period is 0.3 s, a 1 s activeDeadlineSeconds 10 ms: deadlines are tested without waiting
    config = FakeK8sConfig(timings=Timings(time_scale=0.01), namespaces=DEFAULT_NAMESPACES | {NAMESPACE})
    async with running_fake_k8s(config) as k8s:
        yield k8s


@pytest.fixture
async def mock_url() -> AsyncIterator[str]:
    async with running_mock(MockVLLM(("smollm2",), seed=7)) as url:
        yield url


@dataclass
class Setup(RunnerHarness):
    gateway: Gateway
    client: AglLiteClient
    cluster: FakeK8s
    dir: Path

    wait_s = 30.0

    def jobs(self) -> list[dict[str, Any]]:
        return self.cluster.objects("jobs", NAMESPACE)

    @property
    def backend(self) -> K8sBackend:
        (runner,) = [a.addon for a in self.gateway.addons.addons if a.name == "runner"]
        backend = runner.runner.backend
        assert isinstance(backend, K8sBackend)
        return backend

    def pods(self, rollout_id: str | None = None) -> list[dict[str, Any]]:
        pods = self.cluster.objects("pods", NAMESPACE)
        if rollout_id is None:
            return pods
        return [p for p in pods if p["metadata"]["annotations"].get("agl-lite/rollout-id") == rollout_id]


class PodSpy:
    """Every pod that ever existed in the namespace (uid -> rollout id), seen after each write to the fake; pods
    are deleted with their Job once the outcome is recorded, so a test that wants their UIDs records them."""

    def __init__(self, cluster: FakeK8s) -> None:
        self.cluster = cluster
        self.uids: dict[str, str] = {}
        self._task: asyncio.Task[bool] | None = None
        self._done = False

    def _look(self) -> bool:
        for pod in self.cluster.objects("pods", NAMESPACE):
            meta = pod["metadata"]
            self.uids[meta["uid"]] = meta["annotations"].get("agl-lite/rollout-id", "")
        return self._done

    async def __aenter__(self) -> PodSpy:
        self._task = asyncio.ensure_future(self.cluster.wait_for(self._look, timeout=3600))
        return self

    async def __aexit__(self, *exc: object) -> None:
        # ended by its own predicate, not by a cancel (which a wait_for racing an event can swallow on 3.11)
        assert self._task is not None
        self._done = True
        self.cluster.changes.notify()
        await asyncio.wait_for(self._task, 10)

    def of(self, rollout_id: str) -> set[str]:
        return {uid for uid, rid in self.uids.items() if rid == rollout_id}


def k8s_spec(
    command: Sequence[str], task: Any = None, *, k8s: Mapping[str, Any] | None = None, **config: Any
) -> RolloutSpec:
    """A rollout whose Job runs `command` (per-rollout override of the Job template)."""
    runner: dict[str, Any] = {"k8s": {"command": list(command), **(k8s or {})}}
    return RolloutSpec(
        task if task is not None else {"question": "2+3?"}, config=RolloutConfig(runner=runner, **config)
    )


@pytest.fixture
def start(cluster: FakeK8s, mock_url: str, tmp_path: Path) -> Any:
    """`async with start(runner={...}, k8s={...}) as setup:` a gateway (SQLite store in `directory`, default
    tmp_path/gw) with the runner on the fake cluster; the same directory again is a restart on the same store."""
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", cluster)

    @asynccontextmanager
    async def started(
        runner: Mapping[str, Any] | None = None,
        k8s: Mapping[str, Any] | None = None,
        directory: str = "gw",
        *,
        with_runner: bool = True,
        store_url: str = "",
    ) -> AsyncIterator[Setup]:
        k8s_options = {
            "kubeconfig": str(kubeconfig),
            "namespace": NAMESPACE,
            "settle_s": 5.0,
            "job": {"image": "agent:0.1.0", "command": ["/bin/sh", "-c", "exit 0"]},
            **(k8s or {}),
        }
        runner_options = {"backend": "k8s", "concurrency": 1000, **(runner or {}), "k8s": k8s_options}
        if store_url:  # a runner-only controller (the in-cluster deployment) reaching the store over HTTP
            chain: tuple[str, ...] = ("runner",)
            addons: dict[str, Any] = {"runner": {**runner_options, "store_url": store_url}}
        else:
            chain = (*CAPTURE_CHAIN, "runner") if with_runner else CAPTURE_CHAIN
            addons = {"store": {"backend": "sqlite", "path": "agl.db"}}
            if with_runner:
                addons["runner"] = runner_options
        config = write_config(tmp_path / directory, {"smollm2": [mock_url]}, chain=chain, addons=addons)
        async with running_gateway(config) as gw:
            async with AglLiteClient(store_url or gateway_url(gw), ADMIN_KEY) as client:
                yield Setup(gw, client, cluster, tmp_path)

    return started
