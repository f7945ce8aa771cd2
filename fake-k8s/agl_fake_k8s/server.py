"""`FakeK8s`: the whole fake cluster on a loopback port (API server, Job controller, GC, scheduler, kubelet),
with the hooks tests use: client configurations, counters, waits and faults.

It wires the parts together and owns their lifetimes; the behaviour lives in the parts.
"""

from __future__ import annotations

import asyncio
import secrets
import tempfile
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from aiohttp import web

from agl_fake_k8s.api import ApiServer
from agl_fake_k8s.config import FakeK8sConfig
from agl_fake_k8s.faults import Faults
from agl_fake_k8s.gc import GarbageCollector
from agl_fake_k8s.jobs import JobController
from agl_fake_k8s.kubelet import Kubelet, Scheduler
from agl_fake_k8s.meta import JsonObj, copy_json
from agl_fake_k8s.observe import Changes, RequestCounters, RequestRecord
from agl_fake_k8s.registry import DeleteOptions, Registry
from agl_fake_k8s.resources import RESOURCES, Resource
from agl_fake_k8s.selectors import LabelSelector
from agl_fake_k8s.storage import Storage
from agl_fake_k8s.tasks import TaskSet
from agl_fake_k8s.watch import WatchHub

if TYPE_CHECKING:
    import kubernetes.aio.client
    import kubernetes.client

__all__ = ["FakeK8s", "running_fake_k8s"]

T = TypeVar("T")
_BY_NAME = {r.plural: r for r in RESOURCES}
_EVICTION_MESSAGE = "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. "


def _resource(name: str) -> Resource:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown resource {name!r}: one of {', '.join(_BY_NAME)}") from None


class FakeK8s:
    """A running fake cluster. Get one from `running_fake_k8s()`; everything here is safe to call from tests."""

    def __init__(self, config: FakeK8sConfig, work_root: Path) -> None:
        self.config = config
        self.token = config.token or secrets.token_urlsafe(24)
        self.url = ""
        self.changes = Changes()
        self.storage = Storage(history_limit=config.history_limit)
        self.storage.subscribe(lambda _event: self.changes.notify())
        self.registry = Registry(self.storage, namespaces=config.namespaces)
        self.hub = WatchHub(self.storage)
        self.counters = RequestCounters(self.changes)
        self.faults = Faults()
        self._tasks = TaskSet()
        self._work_root = work_root
        self.kubelet = Kubelet(
            self.registry, config, root=work_root, tasks=self._tasks, on_output=self.changes.notify
        )
        self._job_controller: asyncio.Task[None] | None = None
        self.api = ApiServer(
            self.registry,
            self.hub,
            token=self.token,
            counters=self.counters,
            faults=self.faults,
            logs=self.kubelet if config.run_kubelet else None,
            bookmark_interval_s=config.timings.bookmark_interval_s,
        )

    # lifecycle (driven by running_fake_k8s)

    def _start_controllers(self) -> None:
        config = self.config
        if config.run_job_controller:
            self.start_job_controller()
        if config.run_garbage_collector:
            self._tasks.spawn(GarbageCollector(self.registry).run(), name="fake-k8s-gc")
        if config.run_scheduler:
            scheduler = Scheduler(self.registry, node=config.node_name, max_pods=config.max_pods)
            self._tasks.spawn(scheduler.run(), name="fake-k8s-scheduler")
        if config.run_kubelet:
            self._tasks.spawn(self.kubelet.run(), name="fake-k8s-kubelet")

    async def _stop(self) -> None:
        await asyncio.wait_for(self.kubelet.kill_all(), 10)
        self.hub.drop()
        await self._tasks.close()

    # clients

    def api_client_config(self) -> kubernetes.client.Configuration:
        """A configuration for the synchronous `kubernetes` client: this server's URL and bearer token."""
        from kubernetes import client

        return client.Configuration(
            host=self.url, api_key={"authorization": self.token}, api_key_prefix={"authorization": "Bearer"}
        )

    def aio_api_client_config(self) -> kubernetes.aio.client.Configuration:
        """The same for `kubernetes.aio`."""
        from kubernetes.aio import client

        return client.Configuration(
            host=self.url, api_key={"authorization": self.token}, api_key_prefix={"authorization": "Bearer"}
        )

    # state, read directly (no request is counted)

    @property
    def resource_version(self) -> int:
        return self.storage.rv

    def get(self, resource: str, namespace: str, name: str) -> JsonObj | None:
        """A copy of a stored object ("jobs", "pods", "secrets"), or None."""
        obj = self.storage.get(_resource(resource), namespace, name)
        return None if obj is None else copy_json(obj)

    def objects(self, resource: str, namespace: str | None = None, label_selector: str = "") -> list[JsonObj]:
        """Copies of the stored objects of `resource` (in `namespace`, matching `label_selector`), in key order."""
        selector = LabelSelector(label_selector)
        items = self.storage.items(_resource(resource), namespace)
        return [copy_json(o) for o in items if selector.matches(o["metadata"].get("labels"))]

    def create(self, resource: str, namespace: str, body: JsonObj) -> JsonObj:
        """Create an object as a client would, without HTTP (test setup); ApiError when the server refuses it."""
        created: JsonObj = copy_json(
            self.registry.create(_resource(resource), namespace, body, manager="fake-k8s-test")
        )
        return created

    def delete(
        self,
        resource: str,
        namespace: str,
        name: str,
        *,
        grace_period_s: int | None = None,
        propagation_policy: str | None = None,
    ) -> bool:
        """Delete an object as a client would, without HTTP; True when it is gone at once (not pending)."""
        options = DeleteOptions(grace_period_s=grace_period_s, propagation_policy=propagation_policy)
        _, gone = self.registry.delete(_resource(resource), namespace, name, options, manager="fake-k8s-test")
        return gone

    def container_pid(self, namespace: str, pod: str, container: str) -> int | None:
        """The pid (and process group) of a container's current process, if the kubelet started one."""
        worker = self.kubelet.worker(namespace, pod)
        process = worker.processes.get(container) if worker else None
        return process.pid if process else None

    def logs(self, namespace: str, pod: str, container: str) -> str:
        """What a container has written so far (stdout and stderr, across restarts); "" before it started."""
        path = self.kubelet.log_file(namespace, pod, container)
        return path.read_text(errors="replace") if path is not None else ""

    def pod_dir(self, namespace: str, pod: str) -> Path | None:
        """The host directory holding a running pod's volumes, logs and termination messages."""
        worker = self.kubelet.worker(namespace, pod)
        return worker.dir if worker else None

    # waiting without sleeping

    async def wait_for(self, predicate: Callable[[], T | None], timeout: float = 10.0) -> T:
        """The first truthy `predicate()`, re-checked after every write, request and container output;
        TimeoutError otherwise."""
        return await self.changes.wait_for(predicate, timeout)

    async def wait_for_job(
        self, namespace: str, name: str, condition: str = "finished", timeout: float = 10.0
    ) -> JsonObj:
        """The Job once it has `condition` ("Complete", "Failed", or "finished" for either) set True."""
        wanted = ("Complete", "Failed") if condition == "finished" else (condition,)

        def check() -> JsonObj | None:
            job = self.get("jobs", namespace, name)
            conditions = ((job or {}).get("status") or {}).get("conditions") or []
            done = any(c.get("type") in wanted and c.get("status") == "True" for c in conditions)
            return job if done else None

        return await self.wait_for(check, timeout)

    async def wait_for_pods(
        self,
        namespace: str,
        label_selector: str,
        predicate: Callable[[list[JsonObj]], bool],
        timeout: float = 10.0,
    ) -> list[JsonObj]:
        """The pods matching `label_selector` once `predicate(pods)` holds."""

        def check() -> list[JsonObj] | None:
            pods = self.objects("pods", namespace, label_selector)
            return pods if predicate(pods) else None

        return await self.wait_for(check, timeout)

    # counters

    @property
    def requests_by_verb(self) -> Counter[str]:
        """Client requests by verb, counted on arrival: get, list, watch, create, update, patch, delete,
        deletecollection."""
        return self.counters.by_verb

    @property
    def requests(self) -> Counter[tuple[str, str]]:
        """Client requests by (verb, resource), e.g. ("create", "jobs"), ("update", "pods/status")."""
        return self.counters.by_resource

    @property
    def responses_by_status(self) -> Counter[int]:
        return self.counters.by_status

    @property
    def request_log(self) -> list[RequestRecord]:
        """Answered requests in the order they were answered (a watch when its stream ended), with status."""
        return list(self.counters.log)

    @property
    def watches_opened(self) -> int:
        return self.counters.watches_opened

    @property
    def open_watches(self) -> int:
        return self.counters.open_watches

    # faults

    def drop_watches(self, *, resource: str | None = None, abrupt: bool = False) -> int:
        """End every open watch (of `resource`) now: cleanly, or `abrupt`ly by cutting the connection."""
        return self.hub.drop(resource=None if resource is None else _resource(resource), abrupt=abrupt)

    def expire_next_watches(self, count: int = 1) -> None:
        """The next `count` watches that give a resourceVersion get ERROR 410 Expired, as after compaction."""
        self.faults.watch_expiries_left += count

    def compact_history(self) -> None:
        """Forget the watch history (an API server restart): every older resourceVersion and continue expires."""
        self.storage.compact()

    def conflict_next_updates(self, count: int = 1, *, resource: str | None = None) -> None:
        """The next `count` updates or patches (of `resource`, e.g. "jobs" or "pods/status") get 409 Conflict."""
        self.faults.conflicts_left += count
        self.faults.conflict_resource = resource

    def fail_next_creates(self, count: int = 1, *, resource: str | None = None) -> None:
        """The next `count` creates (of `resource`, e.g. "jobs") get 500 InternalError, as an etcd timeout gives."""
        self.faults.create_errors_left = count
        self.faults.create_error_resource = resource

    def throttle_next_requests(self, count: int, *, retry_after_s: int = 1) -> None:
        """The next `count` requests get 429 TooManyRequests with Retry-After, as API Priority and Fairness sheds."""
        self.faults.throttle_left += count
        self.faults.retry_after_s = retry_after_s

    def send_bookmarks(self) -> int:
        """A BOOKMARK now on every watch that allows them; returns how many got one."""
        return self.hub.bookmark_now()

    def evict_pod(self, namespace: str, name: str, message: str = _EVICTION_MESSAGE) -> bool:
        """Evict a running pod as a kubelet under node pressure does; False when it is not running here."""
        return self.kubelet.evict(namespace, name, message)

    def start_job_controller(self) -> None:
        if self._job_controller is None or self._job_controller.done():
            controller = JobController(self.registry, self.config.timings)
            self._job_controller = self._tasks.spawn(controller.run(), name="fake-k8s-job-controller")

    async def stop_job_controller(self) -> None:
        """Stop the Job controller (its memory goes; Jobs and pods stay in storage)."""
        task, self._job_controller = self._job_controller, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def restart_job_controller(self) -> None:
        """A fresh Job controller that knows only what storage holds, as after a controller-manager restart."""
        await self.stop_job_controller()
        self.start_job_controller()


@asynccontextmanager
async def running_fake_k8s(config: FakeK8sConfig | None = None) -> AsyncIterator[FakeK8s]:
    """A fake cluster on 127.0.0.1, port 0, for the length of the block; processes and files are removed after."""
    config = config or FakeK8sConfig()
    async with AsyncExitStack() as stack:
        if config.work_root is None:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fake-k8s-")))
        else:
            root = config.work_root
            root.mkdir(parents=True, exist_ok=True)
        fake = FakeK8s(config, root)
        # Handlers are cancelled when their client leaves, as a real API server ends a watch.
        runner = web.AppRunner(fake.api.app(), handler_cancellation=True, access_log=None)
        await runner.setup()
        stack.push_async_callback(runner.cleanup)
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        fake.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        fake._start_controllers()
        stack.push_async_callback(fake._stop)
        yield fake
