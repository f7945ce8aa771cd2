"""One pod's life on the fake node: volumes, init containers in order, main containers together, restarts per
restartPolicy, and the status a kubelet reports at each step (Pending -> Running -> Succeeded/Failed).

It also terminates the pod when it is deleted (SIGTERM, SIGKILL after the grace period, then the final delete)
and on eviction (DisruptionTarget condition, phase Failed, reason Evicted). It must not touch other pods.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from agl_fake_k8s.config import FakeK8sConfig
from agl_fake_k8s.containers import ContainerProcess, Exit, StartError
from agl_fake_k8s.defaults import order_container_status, order_pod_status
from agl_fake_k8s.env import ConfigError
from agl_fake_k8s.launch import build_process, write_secret_volume
from agl_fake_k8s.meta import JsonObj, now
from agl_fake_k8s.registry import Registry
from agl_fake_k8s.resources import PODS, SECRETS
from agl_fake_k8s.storage import Storage
from agl_fake_k8s.tasks import TaskSet

__all__ = ["PodHost", "PodWorker"]


class PodHost(Protocol):
    """What a pod worker needs of its node (`kubelet.Kubelet` is one): declared here, so that this module does not
    import the kubelet that imports it."""

    @property
    def storage(self) -> Storage: ...
    @property
    def registry(self) -> Registry: ...
    @property
    def config(self) -> FakeK8sConfig: ...
    @property
    def root(self) -> Path: ...
    @property
    def tasks(self) -> TaskSet: ...
    @property
    def on_output(self) -> Callable[[], None]: ...
    def allocate_ip(self) -> str: ...
    def confirm_deletion(self, namespace: str, name: str, uid: str) -> None: ...


MANAGER = "kubelet"
_HOST_IP = "10.0.0.10"
_Stopped = object()


def _image_id(image: str) -> str:
    name = image.split("@", 1)[0].rsplit(":", 1)[0] if ":" in image.rsplit("/", 1)[-1] else image
    return f"docker-pullable://{name}@sha256:{hashlib.sha256(image.encode()).hexdigest()}"


class PodWorker:
    def __init__(self, kubelet: PodHost, pod: JsonObj) -> None:
        metadata = pod["metadata"]
        self.kubelet = kubelet
        self.namespace, self.name, self.uid = metadata["namespace"], metadata["name"], metadata["uid"]
        self.dir = kubelet.root / f"{self.namespace}.{self.name}.{self.uid[:8]}"
        self.processes: dict[str, ContainerProcess] = {}
        self.finished = False
        self.stopped = asyncio.Event()
        self._stop = asyncio.Event()
        self._grace_s = 0.0
        self._evicted: str | None = None
        self._config_changed = asyncio.Event()
        self._statuses: dict[str, JsonObj] = {}
        self._init_statuses: dict[str, JsonObj] = {}
        self._mounts: dict[str, Path] = {}
        self._phase = "Pending"

    # requests from the kubelet

    def terminate(self, grace_s: float) -> None:
        self._grace_s = grace_s if not self._stop.is_set() else min(self._grace_s, grace_s)
        self._stop.set()

    def evict(self, message: str) -> None:
        """Node-pressure eviction: DisruptionTarget first (so the Job controller can ignore the failure), then a
        hard kill, then phase Failed with reason Evicted; the pod object stays."""
        self._mark_disruption(message)
        self._evicted = message
        self._grace_s = 0.0
        self._stop.set()

    def force_stop(self) -> None:
        """The pod object is gone: kill everything now; no more status writes."""
        self.finished = True
        for process in self.processes.values():
            process.kill_now()
        self._stop.set()

    def config_changed(self) -> None:
        self._config_changed.set()

    def log_path(self, container: str) -> Path:
        return self.dir / "logs" / f"{container}.log"

    # status

    def _pod(self) -> JsonObj | None:
        pod = self.kubelet.storage.get(PODS, self.namespace, self.name)
        return pod if pod is not None and pod["metadata"]["uid"] == self.uid else None

    def _write(self, change: Callable[[JsonObj], None]) -> bool:
        if self.finished and self._pod() is None:
            return False

        def apply(obj: JsonObj) -> object:
            if obj["metadata"]["uid"] != self.uid:
                return False
            status = dict(obj.get("status") or {})
            change(status)
            status["initContainerStatuses"] = [
                order_container_status(s) for s in self._init_statuses.values()
            ]
            status["containerStatuses"] = [order_container_status(s) for s in self._statuses.values()]
            if not status["initContainerStatuses"]:
                del status["initContainerStatuses"]
            obj["status"] = order_pod_status(status)
            return None

        written = self.kubelet.registry.mutate(
            PODS, self.namespace, self.name, apply, manager=MANAGER, subresource="status"
        )
        return written is not None

    def _conditions(
        self, status: JsonObj, *, initialized: bool, ready: bool, reason: str | None = None
    ) -> None:
        timestamp = now()
        previous = {c.get("type"): c for c in status.get("conditions") or []}

        def condition(kind: str, value: bool, why: str | None) -> JsonObj:
            old = previous.get(kind) or {}
            state = "True" if value else "False"
            entry: JsonObj = {"type": kind, "status": state, "lastProbeTime": None}
            entry["lastTransitionTime"] = (
                old.get("lastTransitionTime") if old.get("status") == state else timestamp
            )
            if why:
                entry["reason"] = why
            return entry

        ready_reason = reason or (None if ready else "ContainersNotReady")
        init_reason = (
            reason if reason == "PodCompleted" else (None if initialized else "ContainersNotInitialized")
        )
        conditions = [
            condition("Initialized", initialized, init_reason),
            condition("Ready", ready, ready_reason),
            condition("ContainersReady", ready, ready_reason),
        ]
        conditions += [c for t, c in previous.items() if t not in ("Initialized", "Ready", "ContainersReady")]
        status["conditions"] = conditions

    def _container_status(self, container: JsonObj, state: JsonObj, **fields: Any) -> JsonObj:
        image = str(container.get("image", ""))
        entry: JsonObj = {"name": container["name"], "state": state, "lastState": {}, "ready": False}
        entry.update({"restartCount": 0, "image": image, "imageID": _image_id(image), "started": False})
        entry.update(fields)
        return entry

    # the pod's life

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            for process in self.processes.values():
                process.kill_now()
            self.finished = True
            self.stopped.set()

    async def _run(self) -> None:
        pod = self._pod()
        if pod is None:
            return
        spec = pod.get("spec") or {}
        init, main = spec.get("initContainers") or [], spec.get("containers") or []
        (self.dir / "logs").mkdir(parents=True, exist_ok=True)
        ip = self.kubelet.allocate_ip()
        waiting = "PodInitializing" if init else "ContainerCreating"
        for c in init:
            self._init_statuses[c["name"]] = self._container_status(
                c, {"waiting": {"reason": "PodInitializing"}}
            )
        for c in main:
            self._statuses[c["name"]] = self._container_status(c, {"waiting": {"reason": waiting}})

        def pending(status: JsonObj) -> None:
            status.update(phase="Pending", hostIP=_HOST_IP, podIP=ip, podIPs=[{"ip": ip}], startTime=now())
            self._conditions(status, initialized=not init, ready=False)

        if not self._write(pending):
            return
        if await self._mount_volumes(spec) is _Stopped:
            return await self._finish(spec, [])
        for container in init:
            restarts = 0
            while True:
                outcome = await self._run_init(container, restarts)
                if outcome is None:
                    return await self._finish(spec, [])
                if outcome.code == 0:
                    break
                if spec.get("restartPolicy") == "Never":
                    return await self._finish(spec, [outcome], failed=True)
                restarts += 1
                if await self._backoff(restarts) is _Stopped:
                    return await self._finish(spec, [])
        await self._run_main(spec, main)

    async def _mount_volumes(self, spec: JsonObj) -> object:
        while True:
            try:
                for volume in spec.get("volumes") or []:
                    path = self.dir / "volumes" / volume["name"]
                    path.mkdir(parents=True, exist_ok=True)
                    self._mounts[volume["name"]] = path
                    if source := volume.get("secret"):
                        write_secret_volume(
                            path, self._secret(self.namespace, source.get("secretName", "")), source
                        )
                return None
            except ConfigError as error:
                if await self._wait_config(list(self._statuses), str(error)) is _Stopped:
                    return _Stopped

    async def _wait_config(self, names: list[str], message: str) -> object:
        """Report CreateContainerConfigError and wait for a Secret change (or the pod's end) to retry."""
        self._config_changed.clear()
        for name in names:
            status = self._statuses.get(name) or self._init_statuses.get(name)
            if status is not None:
                status["state"] = {"waiting": {"reason": "CreateContainerConfigError", "message": message}}
        self._write(lambda status: None)
        waiters = {
            asyncio.ensure_future(self._config_changed.wait()),
            asyncio.ensure_future(self._stop.wait()),
        }
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
        return _Stopped if self._stop.is_set() else None

    def _prepare(self, pod: JsonObj, container: JsonObj) -> ContainerProcess:
        kubelet = self.kubelet
        return build_process(
            pod,
            container,
            config=kubelet.config,
            pod_dir=self.dir,
            mounts=self._mounts,
            secrets=self._secret,
            tasks=kubelet.tasks,
            on_output=kubelet.on_output,
        )

    def _secret(self, namespace: str, name: str) -> JsonObj | None:
        return self.kubelet.storage.get(SECRETS, namespace, name)

    async def _launch(self, container: JsonObj, statuses: dict[str, JsonObj], restarts: int) -> object:
        """Start `container`; its status turns running. Returns the process, an Exit (it failed to start),
        or _Stopped when the pod was stopped while its configuration was missing."""
        while True:
            pod = self._pod()
            if pod is None or self._stop.is_set():
                return _Stopped
            try:
                process = self._prepare(pod, container)
                break
            except ConfigError as error:
                if await self._wait_config([container["name"]], str(error)) is _Stopped:
                    return _Stopped
        status = statuses[container["name"]]
        status["restartCount"] = restarts
        started = now()
        container_id = f"containerd://{secrets.token_hex(32)}"
        try:
            await process.start()
        except StartError as error:
            state = {"exitCode": 128, "reason": "StartError", "message": str(error)}
            status["state"] = {
                "terminated": {
                    **state,
                    "startedAt": started,
                    "finishedAt": now(),
                    "containerID": container_id,
                }
            }
            status["containerID"] = container_id
            return Exit(128, "StartError", str(error))
        self.processes[container["name"]] = process
        status.update(state={"running": {"startedAt": started}}, containerID=container_id, started=True)
        return process

    def _terminated(self, statuses: dict[str, JsonObj], name: str, outcome: Exit) -> None:
        status = statuses[name]
        running = (status.get("state") or {}).get("running") or {}
        terminated: JsonObj = {"exitCode": outcome.code, "reason": outcome.reason}
        if outcome.message:
            terminated["message"] = outcome.message
        terminated.update(startedAt=running.get("startedAt", now()), finishedAt=now())
        if status.get("containerID"):
            terminated["containerID"] = status["containerID"]
        status.update(state={"terminated": terminated}, ready=False, started=False)

    async def _run_init(self, container: JsonObj, restarts: int) -> Exit | None:
        launched = await self._launch(container, self._init_statuses, restarts)
        if launched is _Stopped:
            return None
        if isinstance(launched, Exit):
            self._write(lambda status: None)
            return launched
        assert isinstance(launched, ContainerProcess)
        self._write(lambda status: None)
        outcome = await self._wait_or_stop(launched)
        if outcome is None:
            outcome = await launched.wait()
            self._terminated(self._init_statuses, container["name"], outcome)
            return None
        self._terminated(self._init_statuses, container["name"], outcome)
        if outcome.code == 0:
            self._write(lambda status: None)
        return outcome

    async def _wait_or_stop(self, process: ContainerProcess) -> Exit | None:
        """The process's exit, or None (after stopping it) when the pod is to stop first."""
        exit_task = asyncio.ensure_future(process.wait())
        stop_task = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({exit_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
            if exit_task.done():
                return exit_task.result()
            await process.stop(self._grace_s)
            return None
        finally:
            stop_task.cancel()
            if not exit_task.done():
                await exit_task

    async def _backoff(self, restarts: int) -> object:
        delay = min(self.kubelet.config.timings.container_restart_backoff_s * 2 ** (restarts - 1), 300.0)
        if delay <= 0:
            return None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), delay)
        return _Stopped if self._stop.is_set() else None

    async def _run_main(self, spec: JsonObj, main: list[JsonObj]) -> None:
        policy = spec.get("restartPolicy") or "Always"
        restarts = dict.fromkeys((c["name"] for c in main), 0)
        outcomes: dict[str, Exit] = {}
        waits: dict[asyncio.Future[Any], JsonObj] = {}
        for container in main:
            launched = await self._launch(container, self._statuses, 0)
            if launched is _Stopped:
                return await self._finish(spec, list(outcomes.values()), running=waits)
            if isinstance(launched, Exit):
                outcomes[container["name"]] = launched
            else:
                assert isinstance(launched, ContainerProcess)
                waits[asyncio.ensure_future(launched.wait())] = container
                self._statuses[container["name"]].update(ready=True)

        def running(status: JsonObj) -> None:
            status["phase"] = "Running"
            self._conditions(status, initialized=True, ready=len(waits) == len(main))

        if waits:
            self._write(running)
        stop_task: asyncio.Future[Any] = asyncio.ensure_future(self._stop.wait())
        try:
            while waits:
                done, _ = await asyncio.wait({*waits, stop_task}, return_when=asyncio.FIRST_COMPLETED)
                if stop_task in done:
                    return await self._finish(spec, list(outcomes.values()), running=waits)
                for task in done:
                    container = waits.pop(task)
                    outcome: Exit = task.result()
                    outcomes[container["name"]] = outcome
                    self._terminated(self._statuses, container["name"], outcome)
                    if policy == "Always" or (policy == "OnFailure" and outcome.code != 0):
                        restarts[container["name"]] += 1
                        relaunched = await self._restart(spec, container, restarts[container["name"]])
                        if relaunched is _Stopped:
                            return await self._finish(spec, list(outcomes.values()), running=waits)
                        if isinstance(relaunched, ContainerProcess):
                            waits[asyncio.ensure_future(relaunched.wait())] = container
                            del outcomes[container["name"]]
                if waits:
                    self._write(lambda status: self._conditions(status, initialized=True, ready=False))
        finally:
            stop_task.cancel()
        await self._finish(spec, list(outcomes.values()))

    async def _restart(self, spec: JsonObj, container: JsonObj, restarts: int) -> object:
        status = self._statuses[container["name"]]
        status["lastState"] = status["state"]
        delay = self.kubelet.config.timings.container_restart_backoff_s
        if delay > 0:
            message = f"back-off {delay:g}s restarting failed container={container['name']} pod={self.name}"
            status["state"] = {"waiting": {"reason": "CrashLoopBackOff", "message": message}}
            self._write(lambda s: self._conditions(s, initialized=True, ready=False))
            if await self._backoff(restarts) is _Stopped:
                return _Stopped
        launched = await self._launch(container, self._statuses, restarts)
        if isinstance(launched, ContainerProcess):
            status["ready"] = True
        return launched

    async def _finish(
        self,
        spec: JsonObj,
        outcomes: list[Exit],
        *,
        failed: bool = False,
        running: dict[asyncio.Future[Any], JsonObj] | None = None,
    ) -> None:
        """Stop what still runs, write the terminal status, and complete a deletion if one was asked for."""
        if running:
            grace = self._grace_s
            processes = [self.processes[c["name"]] for c in running.values()]
            await asyncio.gather(*(p.stop(grace) for p in processes))
            for task, container in running.items():
                outcome = await task
                outcomes.append(outcome)
                self._terminated(self._statuses, container["name"], outcome)
        if self.finished:  # force-stopped: the pod object is gone
            return
        failed = failed or any(o.code != 0 for o in outcomes) or not outcomes
        phase = "Failed" if failed else "Succeeded"
        evicted = self._evicted

        def terminal(status: JsonObj) -> None:
            status["phase"] = phase
            self._conditions(
                status, initialized=True, ready=False, reason="PodFailed" if failed else "PodCompleted"
            )
            if evicted is not None:
                status.update(reason="Evicted", message=evicted)

        for status in (*self._statuses.values(), *self._init_statuses.values()):
            if "waiting" in (status.get("state") or {}) and self._stop.is_set():
                status["state"] = {"terminated": {"exitCode": 137, "reason": "ContainerStatusUnknown"}}
        self._write(terminal)
        self.finished = True
        pod = self._pod()
        if pod is not None and pod["metadata"].get("deletionTimestamp") and evicted is None:
            self.kubelet.confirm_deletion(self.namespace, self.name, self.uid)

    def _mark_disruption(self, message: str) -> None:

        def add(status: JsonObj) -> None:
            conditions = [c for c in status.get("conditions") or [] if c.get("type") != "DisruptionTarget"]
            conditions.append(
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "lastProbeTime": None,
                    "lastTransitionTime": now(),
                    "reason": "TerminationByKubelet",
                    "message": message,
                }
            )
            status["conditions"] = conditions

        self._write(add)
