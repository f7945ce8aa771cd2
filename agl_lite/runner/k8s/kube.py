"""The thin adapter over the official `kubernetes.aio` client: the few calls the controller makes, each behind the
token bucket, 429s retried after their `Retry-After`, and API errors mapped to the typed errors below.

    KubeError            any refusal from the API server (status, reason, message)
    ├── AlreadyExists    409 on create: the object is there (a controller restart; never a duplicate Job)
    ├── Gone             410 Expired: the resourceVersion is too old; relist
    └── (404 on delete is success; 404 on get is None)

Objects come back as the API's raw JSON (dicts): the controller reads them through `views`, never through the
client's models, so a watch event costs one JSON decode. Nothing here knows about rollouts or the store.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
import orjson
import structlog
from kubernetes.aio import client as k8s
from kubernetes.aio import config as k8s_config
from kubernetes.aio.watch import Watch

from agl_lite.errors import AglLiteError, ConfigError
from agl_lite.runner.k8s.ratelimit import TokenBucket

__all__ = ["AlreadyExists", "Gone", "KubeApi", "KubeError", "WatchEvent", "load_configuration"]

log = structlog.get_logger("agl_lite.runner.k8s")

T = TypeVar("T")


class KubeError(AglLiteError):
    """The API server refused a request; `status` is its HTTP status (0: no answer at all)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"kubernetes API {status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class AlreadyExists(KubeError):
    """409 on create."""


class Gone(KubeError):
    """410 Expired (a list or watch from a resourceVersion the server no longer has)."""


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: str
    """ADDED, MODIFIED, DELETED or BOOKMARK."""
    object: dict[str, Any]


def _map(exc: k8s.ApiException) -> KubeError:
    reason, message = str(exc.reason or ""), ""
    try:
        body = orjson.loads(exc.body or b"{}")
        if isinstance(body, dict):
            reason = str(body.get("reason") or reason)
            message = str(body.get("message") or "")
    except orjson.JSONDecodeError:
        message = str(exc.body or "")[:500]
    status = int(exc.status or 0)
    cls = AlreadyExists if status == 409 else Gone if status == 410 else KubeError
    return cls(status, reason, message)


def _retry_after(exc: k8s.ApiException, cap: float) -> float:
    raw = (exc.headers or {}).get("Retry-After") if exc.headers is not None else None
    try:
        seconds = float(raw) if raw is not None else 1.0
    except ValueError:
        seconds = 1.0
    return min(max(seconds, 0.0), cap)


async def load_configuration(kubeconfig: str = "", context: str = "") -> k8s.Configuration:
    """The client configuration: the given kubeconfig, else the in-cluster service account inside a pod, else
    the default kubeconfig (`$KUBECONFIG`, `~/.kube/config`)."""
    cfg = k8s.Configuration()
    try:
        if kubeconfig or context:
            await k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig or None, context=context or None, client_configuration=cfg
            )
        else:
            try:
                k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
            except k8s_config.ConfigException:
                await k8s_config.load_kube_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    except Exception as exc:  # a missing file, bad YAML, an unknown context: the config is the problem
        raise ConfigError(f"cannot load the Kubernetes client configuration: {exc}") from exc
    return cfg


class _RawWatch(Watch):
    """The official watch, minus decoding each event into the client's models (we read the raw JSON)."""

    def unmarshal_event(self, data: str, response_type: Any) -> Any:
        return super().unmarshal_event(data, None)


class KubeApi:
    """Jobs, Pods and Secrets of one namespace through `api_client`, every request behind `bucket`; `close()`
    it. `sleep` is injectable so tests of Retry-After take no time."""

    def __init__(
        self,
        api_client: k8s.ApiClient,
        namespace: str,
        bucket: TokenBucket,
        *,
        retries: int = 8,
        max_retry_after_s: float = 60.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.api_client = api_client
        self.namespace = namespace
        self.bucket = bucket
        self.retries = retries
        self.max_retry_after_s = max_retry_after_s
        self._sleep = sleep
        self.batch = k8s.BatchV1Api(api_client)
        self.core = k8s.CoreV1Api(api_client)
        self.requests = 0
        """Requests sent (after the token bucket), retries included."""
        self.throttled = 0
        """429 answers received."""
        self.calls: Counter[tuple[str, str]] = Counter()
        """Requests by (RBAC verb, resource): what the Role in deploy/k8s/rbac.yaml must allow."""

    async def close(self) -> None:
        await self.api_client.close()  # type: ignore[no-untyped-call]

    async def _call(self, verb: str, resource: str, fn: Callable[[], Awaitable[T]]) -> T:
        """One request: wait for a token, send, retry a 429 after its Retry-After and a lost connection after a
        short backoff; map any other refusal to a KubeError."""
        delay = 0.2
        for attempt in range(self.retries + 1):
            await self.bucket.acquire()
            self.requests += 1
            self.calls[(verb, resource)] += 1
            try:
                return await fn()
            except k8s.ApiException as exc:
                self.throttled += exc.status == 429
                if exc.status != 429 or attempt >= self.retries:
                    raise _map(exc) from None
                await self._sleep(_retry_after(exc, self.max_retry_after_s))
            except (aiohttp.ClientConnectionError, TimeoutError) as exc:
                if attempt >= self.retries:
                    raise KubeError(0, "Unreachable", repr(exc)) from exc
                await self._sleep(delay)
                delay = min(delay * 2, 5.0)
        raise AssertionError("unreachable")  # pragma: no cover

    @staticmethod
    def _json(raw: bytes) -> dict[str, Any]:
        data = orjson.loads(raw)
        if not isinstance(data, dict):
            raise KubeError(0, "BadResponse", "the API server answered something that is not an object")
        return data

    # --- Jobs ----------------------------------------------------------------------------------------------------

    async def create_job(self, body: Mapping[str, Any]) -> dict[str, Any]:
        job = k8s.V1Job.from_dict(dict(body))
        resp = await self._call(
            "create",
            "jobs",
            lambda: self.batch.create_namespaced_job_with_http_info(self.namespace, job),  # type: ignore[arg-type]
        )
        return self._json(resp.raw_data)

    async def get_job(self, name: str) -> dict[str, Any] | None:
        try:
            resp = await self._call(
                "get", "jobs", lambda: self.batch.read_namespaced_job_with_http_info(name, self.namespace)
            )
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return self._json(resp.raw_data)

    async def delete_job(self, name: str) -> bool:
        """Delete a Job and, through the garbage collector, its pods and Secret; False when it was gone."""
        options = k8s.V1DeleteOptions(propagation_policy="Background")
        try:
            await self._call(
                "delete", "jobs", lambda: self.batch.delete_namespaced_job(name, self.namespace, body=options)
            )
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def delete_jobs(self, selector: str) -> list[str]:
        """Delete every Job matching `selector` in one request (Background); returns the names deleted."""
        options = k8s.V1DeleteOptions(propagation_policy="Background")
        resp = await self._call(
            "deletecollection",
            "jobs",
            lambda: self.batch.delete_collection_namespaced_job_with_http_info(
                self.namespace, label_selector=selector, body=options
            ),
        )
        items = self._json(resp.raw_data).get("items") or []
        return [str((j.get("metadata") or {}).get("name", "")) for j in items if isinstance(j, dict)]

    async def list_jobs(self, selector: str) -> tuple[list[dict[str, Any]], str]:
        """Every matching Job and the list's resourceVersion (where a watch starts)."""
        resp = await self._call(
            "list",
            "jobs",
            lambda: self.batch.list_namespaced_job_with_http_info(self.namespace, label_selector=selector),
        )
        data = self._json(resp.raw_data)
        return list(data.get("items") or []), str((data.get("metadata") or {}).get("resourceVersion", ""))

    # --- Pods and Secrets ----------------------------------------------------------------------------------------

    async def list_pods(self, selector: str) -> tuple[list[dict[str, Any]], str]:
        resp = await self._call(
            "list",
            "pods",
            lambda: self.core.list_namespaced_pod_with_http_info(self.namespace, label_selector=selector),
        )
        data = self._json(resp.raw_data)
        return list(data.get("items") or []), str((data.get("metadata") or {}).get("resourceVersion", ""))

    async def create_secret(self, body: Mapping[str, Any]) -> dict[str, Any]:
        secret = k8s.V1Secret.from_dict(dict(body))
        resp = await self._call(
            "create",
            "secrets",
            lambda: self.core.create_namespaced_secret_with_http_info(self.namespace, secret),  # type: ignore[arg-type]
        )
        return self._json(resp.raw_data)

    async def list_secret_names(self, selector: str) -> list[str]:
        resp = await self._call(
            "list",
            "secrets",
            lambda: self.core.list_namespaced_secret_with_http_info(self.namespace, label_selector=selector),
        )
        items = self._json(resp.raw_data).get("items") or []
        return [str((s.get("metadata") or {}).get("name", "")) for s in items if isinstance(s, dict)]

    # --- watches -------------------------------------------------------------------------------------------------

    async def watch(
        self, kind: str, selector: str, resource_version: str, timeout_s: int
    ) -> AsyncIterator[WatchEvent]:
        """Events of `kind` ("jobs" or "pods") after `resource_version`, until the server ends the watch (about
        `timeout_s`); raises Gone when that version is too old. Bookmarks are asked for and passed on."""
        func = self.batch.list_namespaced_job if kind == "jobs" else self.core.list_namespaced_pod
        await self.bucket.acquire()
        self.requests += 1
        self.calls[("watch", kind)] += 1
        watch = _RawWatch()  # type: ignore[no-untyped-call]
        stream = watch.stream(  # type: ignore[no-untyped-call]
            func,
            self.namespace,
            label_selector=selector,
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=timeout_s,
            _request_timeout=float(timeout_s) + 30.0,
        )
        try:
            async for event in stream:
                obj = event.get("raw_object")
                if isinstance(event, dict) and isinstance(obj, dict):
                    yield WatchEvent(str(event.get("type", "")), obj)
        except k8s.ApiException as exc:
            if exc.status == 429:
                self.throttled += 1
                await self._sleep(_retry_after(exc, self.max_retry_after_s))
                return
            raise _map(exc) from None
        finally:
            await watch.close()  # type: ignore[no-untyped-call]
