"""The node: a scheduler that binds pods to it and a kubelet that runs their containers as local subprocesses.

The kubelet reacts to pod events: it starts a `PodWorker` for each pod bound to its node, asks it to terminate
when the pod gets a deletionTimestamp (then confirms the deletion), and kills it outright when the pod object
is gone. Pod workers write the pod status (phases, conditions, container statuses) through the registry.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable
from pathlib import Path

from agl_fake_k8s.config import FakeK8sConfig
from agl_fake_k8s.containers import ContainerProcess
from agl_fake_k8s.controller import Controller
from agl_fake_k8s.meta import JsonObj
from agl_fake_k8s.pod_worker import PodWorker
from agl_fake_k8s.registry import DeleteOptions, Registry
from agl_fake_k8s.resources import PODS, SECRETS
from agl_fake_k8s.status import ApiError
from agl_fake_k8s.storage import Event
from agl_fake_k8s.tasks import TaskSet

__all__ = ["Kubelet", "Scheduler"]

Key = tuple[str, str]
_TERMINAL = ("Succeeded", "Failed")


def _phase(pod: JsonObj) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


class Scheduler(Controller[Key]):
    """Binds every unscheduled pod (schedulerName default-scheduler) to the node, up to `max_pods` running."""

    name = "scheduler"

    def __init__(self, registry: Registry, *, node: str, max_pods: int | None) -> None:
        super().__init__(registry.storage)
        self.registry = registry
        self.node = node
        self.max_pods = max_pods

    def _unscheduled(self) -> list[Key]:
        return [
            (p["metadata"]["namespace"], p["metadata"]["name"])
            for p in self.storage.items(PODS)
            if not (p.get("spec") or {}).get("nodeName")
        ]

    def initial_keys(self) -> list[Key]:
        return self._unscheduled()

    def keys_for(self, event: Event) -> list[Key]:
        if event.resource is not PODS:
            return []
        keys = [(event.namespace, event.name)]
        freed = event.type == "DELETED" or (
            _phase(event.obj) in _TERMINAL and _phase(event.old or {}) not in _TERMINAL
        )
        if self.max_pods is not None and freed:
            keys += self._unscheduled()
        return keys

    def reconcile(self, key: Key) -> None:
        pod = self.storage.get(PODS, *key)
        if pod is None or pod["metadata"].get("deletionTimestamp"):
            return
        spec = pod.get("spec") or {}
        if spec.get("nodeName") or spec.get("schedulerName", "default-scheduler") != "default-scheduler":
            return
        if self.max_pods is not None:
            running = sum(
                1
                for p in self.storage.items(PODS)
                if (p.get("spec") or {}).get("nodeName") == self.node and _phase(p) not in _TERMINAL
            )
            if running >= self.max_pods:
                return
        binding = {"target": {"apiVersion": "v1", "kind": "Node", "name": self.node}}
        self.registry.bind(key[0], key[1], binding, manager="kube-scheduler")


class Kubelet(Controller[Key]):
    """Runs the pods bound to `config.node_name`; also the fake's pods/log source."""

    name = "kubelet"

    def __init__(
        self,
        registry: Registry,
        config: FakeK8sConfig,
        *,
        root: Path,
        tasks: TaskSet,
        on_output: Callable[[], None] = lambda: None,
    ) -> None:
        super().__init__(registry.storage)
        self.on_output = on_output
        """Called whenever a container writes output (the fake pulses its change signal, so tests can wait on logs)."""
        self.registry = registry
        self.config = config
        self.root = root
        self.tasks = tasks
        self._workers: dict[Key, PodWorker] = {}
        self._next_ip = 0

    def allocate_ip(self) -> str:
        self._next_ip += 1
        return f"10.244.{self._next_ip // 250}.{self._next_ip % 250 + 2}"

    def initial_keys(self) -> list[Key]:
        return [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in self.storage.items(PODS)]

    def keys_for(self, event: Event) -> list[Key]:
        if event.resource is SECRETS:
            for key, worker in self._workers.items():
                if key[0] == event.namespace:
                    worker.config_changed()
            return []
        if event.resource is not PODS:
            return []
        nodes = {(o.get("spec") or {}).get("nodeName") for o in (event.obj, event.old) if o}
        return [(event.namespace, event.name)] if self.config.node_name in nodes else []

    def reconcile(self, key: Key) -> None:
        pod = self.storage.get(PODS, *key)
        worker = self._workers.get(key)
        if worker is not None and (pod is None or pod["metadata"]["uid"] != worker.uid):
            worker.force_stop()  # the pod object is gone (force-deleted, or replaced by a namesake)
            del self._workers[key]
            self.tasks.spawn(self._cleanup(worker), name=f"fake-k8s-cleanup-{key[1]}")
            worker = None
        if pod is None or (pod.get("spec") or {}).get("nodeName") != self.config.node_name:
            return
        metadata = pod["metadata"]
        if metadata.get("deletionTimestamp"):
            if worker is not None and not worker.finished:
                grace = metadata.get("deletionGracePeriodSeconds") or 0
                worker.terminate(grace * self.config.timings.time_scale)
            else:
                self.confirm_deletion(key[0], key[1], metadata["uid"])
            return
        if worker is None and _phase(pod) not in _TERMINAL:
            worker = PodWorker(self, pod)
            self._workers[key] = worker
            self.tasks.spawn(worker.run(), name=f"fake-k8s-pod-{key[1]}")

    def confirm_deletion(self, namespace: str, name: str, uid: str) -> None:
        """The kubelet's last word on a terminated pod: delete it with grace 0 (finalizers may still hold it)."""
        try:
            options = DeleteOptions(grace_period_s=0, precondition_uid=uid)
            self.registry.delete(PODS, namespace, name, options, manager="kubelet")
        except ApiError as error:
            if error.status not in (404, 409):
                raise

    async def _cleanup(self, worker: PodWorker) -> None:
        await worker.stopped.wait()
        await asyncio.to_thread(shutil.rmtree, worker.dir, True)

    def evict(self, namespace: str, name: str, message: str) -> bool:
        worker = self._workers.get((namespace, name))
        if worker is None or worker.finished:
            return False
        worker.evict(message)
        return True

    def worker(self, namespace: str, name: str) -> PodWorker | None:
        return self._workers.get((namespace, name))

    # the API server's pods/log source

    def log_file(self, namespace: str, pod: str, container: str) -> Path | None:
        worker = self._workers.get((namespace, pod))
        path = worker.log_path(container) if worker else None
        return path if path is not None and path.exists() else None

    async def wait_output(self, namespace: str, pod: str, container: str) -> bool:
        worker = self._workers.get((namespace, pod))
        process: ContainerProcess | None = worker.processes.get(container) if worker else None
        if process is None or process.exited:
            return False
        await process.output.wait()
        process.output.clear()
        return True

    async def kill_all(self) -> None:
        """SIGKILL every container and wait until the processes are gone (reaped)."""
        for worker in self._workers.values():
            worker.force_stop()
        processes = [p for w in self._workers.values() for p in w.processes.values()]
        await asyncio.gather(*(p.reaped() for p in processes))
