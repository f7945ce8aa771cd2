"""The fake API server's HTTP face: real paths for Jobs, Pods (status, binding, log) and Secrets, discovery,
bearer-token auth, APF-style 429s, and Status bodies for every refusal.

It parses requests into registry calls and objects into responses; the rules of each write live in the registry
and watches in watch.py. An unexpected exception becomes a 500 Status, never a traceback on the wire.
"""

from __future__ import annotations

import hmac
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import orjson
import structlog
from aiohttp import web

from agl_fake_k8s.faults import Faults
from agl_fake_k8s.lists import parse_resource_version
from agl_fake_k8s.meta import JsonObj, encode, typed
from agl_fake_k8s.observe import RequestCounters
from agl_fake_k8s.patch import PATCH_TYPES
from agl_fake_k8s.registry import DeleteOptions, Registry
from agl_fake_k8s.resources import JOBS, PODS, SECRETS, Resource, by_path
from agl_fake_k8s.schema import DELETE_OPTIONS, check
from agl_fake_k8s.selectors import FieldSelector, LabelSelector, SelectorError
from agl_fake_k8s.status import (
    ApiError,
    bad_request,
    conflict,
    method_not_allowed,
    path_not_found,
    success,
    too_many_requests,
    unauthorized,
    unsupported_media_type,
)
from agl_fake_k8s.watch import WatchHub, WatchRequest, serve_watch

__all__ = ["ApiServer", "LogSource"]

log = structlog.get_logger("agl_fake_k8s")

_SUBRESOURCES = {"status": (JOBS, PODS), "binding": (PODS,), "log": (PODS,)}
_MODIFIED = "the object has been modified; please apply your changes to the latest version and try again"
_VERSION = {
    "major": "1",
    "minor": "31",
    "gitVersion": "v1.31.0-fake",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.22.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}


class LogSource(Protocol):
    """Where pods/log reads container output (the kubelet)."""

    def log_file(self, namespace: str, pod: str, container: str) -> Path | None:
        """The container's log file, or None when it has not started."""

    async def wait_output(self, namespace: str, pod: str, container: str) -> bool:
        """Wait for more output; False once the container has exited and nothing more will come."""


@dataclass(frozen=True, slots=True)
class _Target:
    resource: Resource
    namespace: str | None
    name: str | None
    subresource: str | None


def _parse_path(path: str) -> _Target | None:
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 2 and parts[0] == "api" and parts[1] == "v1":
        group, version, rest = "", "v1", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not 1 <= len(rest) <= 3 or (namespace is None and len(rest) > 1):
        return None
    resource = by_path(group, version, rest[0])
    if resource is None:
        return None
    subresource = rest[2] if len(rest) == 3 else None
    if subresource is not None and resource not in _SUBRESOURCES.get(subresource, ()):
        return None
    return _Target(resource, namespace, rest[1] if len(rest) >= 2 else None, subresource)


def _flag(query: Any, key: str) -> bool:
    return str(query.get(key, "")).lower() in ("true", "1")


def _int(query: Any, key: str) -> int | None:
    raw = query.get(key)
    if raw in (None, ""):
        return None
    try:
        return int(raw)
    except ValueError:
        raise bad_request(f'{key}: Invalid value: "{raw}": must be an integer') from None


class ApiServer:
    """Builds the aiohttp application that serves the fake cluster."""

    def __init__(
        self,
        registry: Registry,
        hub: WatchHub,
        *,
        token: str,
        counters: RequestCounters,
        faults: Faults,
        logs: LogSource | None,
        bookmark_interval_s: float,
    ) -> None:
        self.registry = registry
        self.hub = hub
        self._token = token.encode()
        self.counters = counters
        self.faults = faults
        self._logs = logs
        self._bookmark_interval_s = bookmark_interval_s
        self._apf = {
            "X-Kubernetes-Pf-Flowschema-Uid": str(uuid.uuid4()),
            "X-Kubernetes-Pf-Prioritylevel-Uid": str(uuid.uuid4()),
        }

    def app(self) -> web.Application:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    def _json(self, body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
        all_headers = {"Cache-Control": "no-cache, private", "Content-Type": "application/json", **self._apf}
        return web.Response(status=status, body=encode(body), headers={**all_headers, **(headers or {})})

    def _error(self, error: ApiError) -> web.Response:
        return self._json(error.body(), error.status, error.headers)

    def _authorized(self, request: web.Request) -> bool:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self._token)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        target = _parse_path(request.path)
        verb = self._verb(request, target)
        resource = (
            ""
            if target is None
            else target.resource.plural + (f"/{target.subresource}" if target.subresource else "")
        )
        namespace = (target.namespace if target else None) or ""
        name = (target.name if target else None) or ""
        status = 500
        arrived = self.counters.arrived(verb, resource)
        try:
            if not self._authorized(request):
                raise unauthorized()
            if (retry_after := self.faults.take_throttle()) is not None:
                raise too_many_requests(retry_after)
            response = await self._dispatch(request, target, verb)
            status = response.status
            return response
        except ApiError as error:
            status = error.status
            return self._error(error)
        except Exception as exc:  # the fake must answer, not crash: a 500 Status, as kube-apiserver does
            log.error("fake k8s API internal error", path=request.path, error=repr(exc), exc_info=exc)
            status = 500
            return self._error(ApiError(500, "InternalError", f"Internal error occurred: {exc}", {}))
        finally:
            self.counters.answered(arrived, verb, resource, namespace, name, status)

    @staticmethod
    def _verb(request: web.Request, target: _Target | None) -> str:
        method = request.method
        collection = target is None or target.name is None
        if method == "GET":
            if collection:
                return "watch" if _flag(request.query, "watch") else "list"
            return "get"
        if method == "POST":
            return "create"
        if method == "PUT":
            return "update"
        if method == "PATCH":
            return "patch"
        if method == "DELETE":
            return "deletecollection" if collection else "delete"
        return method.lower()

    async def _dispatch(self, request: web.Request, target: _Target | None, verb: str) -> web.StreamResponse:
        if target is None:
            return self._discovery(request)
        if target.namespace is None and verb not in ("list", "watch"):
            raise method_not_allowed() if request.method != "GET" else path_not_found()
        namespace = target.namespace or ""
        manager = (
            request.query.get("fieldManager") or request.headers.get("User-Agent", "unknown").split("/", 1)[0]
        )
        dry_run = request.query.get("dryRun") == "All"
        resource, name, sub = target.resource, target.name, target.subresource
        registry = self.registry
        if name is None:
            if verb in ("list", "watch"):
                return await self._list_or_watch(request, resource, target.namespace, verb == "watch")
            if verb == "create":
                if self.faults.take_create_error(resource.plural):
                    raise ApiError(
                        500, "InternalError", "Internal error occurred: etcdserver: request timed out", {}
                    )
                body = await self._body(request)
                return self._json(
                    typed(
                        resource, registry.create(resource, namespace, body, manager=manager, dry_run=dry_run)
                    ),
                    201,
                )
            if verb == "deletecollection":
                return await self._delete_collection(request, resource, namespace, manager)
            raise method_not_allowed()
        if sub == "log":
            if verb != "get":
                raise method_not_allowed()
            return await self._pod_log(request, namespace, name)
        if sub == "binding":
            if verb != "create":
                raise method_not_allowed()
            registry.bind(namespace, name, await self._body(request), manager=manager)
            return self._json(
                {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}, 201
            )
        if verb == "get":
            return self._json(typed(resource, registry.get(resource, namespace, name)))
        if verb in ("update", "patch"):
            if self.faults.take_conflict(resource.plural + (f"/{sub}" if sub else "")):
                registry.get(resource, namespace, name)  # a missing object is still a 404
                raise conflict(resource, name, _MODIFIED)
            body = await self._body(request, patch=verb == "patch")
            if verb == "update":
                obj = registry.update(
                    resource, namespace, name, body, manager=manager, subresource=sub, dry_run=dry_run
                )
            else:
                content_type = request.headers.get("Content-Type", "")
                obj = registry.patch(
                    resource,
                    namespace,
                    name,
                    body,
                    content_type,
                    manager=manager,
                    subresource=sub,
                    dry_run=dry_run,
                )
            return self._json(typed(resource, obj))
        if verb == "delete" and sub is None:
            options = await self._delete_options(request)
            obj, gone = registry.delete(resource, namespace, name, options, manager=manager)
            if gone and not resource.returns_deleted_object:
                return self._json(success(resource, name, obj["metadata"]["uid"]))
            return self._json(typed(resource, obj))
        raise method_not_allowed()

    async def _body(self, request: web.Request, *, patch: bool = False) -> Any:
        media = request.headers.get("Content-Type", "application/json").split(";", 1)[0].strip().lower()
        if not patch and media not in ("application/json", ""):
            raise unsupported_media_type(["application/json"])
        if patch and media not in PATCH_TYPES:
            raise unsupported_media_type(list(PATCH_TYPES))
        raw = await request.read()
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise bad_request(f"couldn't get version/kind; json parse error: {exc}") from None

    async def _delete_options(self, request: web.Request) -> DeleteOptions:
        query = request.query
        body: Any = {}
        if request.can_read_body:
            raw = await request.read()
            if raw.strip():
                try:
                    body = orjson.loads(raw)
                except orjson.JSONDecodeError as exc:
                    raise bad_request(f"couldn't get version/kind; json parse error: {exc}") from None
        if not isinstance(body, dict) or (error := check(body, DELETE_OPTIONS, "DeleteOptions")):
            raise bad_request(f'DeleteOptions in version "v1" cannot be handled: {error or "not an object"}')
        preconditions = body.get("preconditions") or {}
        orphan = body.get("orphanDependents")
        if orphan is None and "orphanDependents" in query:
            orphan = _flag(query, "orphanDependents")
        grace = body.get("gracePeriodSeconds")
        return DeleteOptions(
            propagation_policy=body.get("propagationPolicy") or query.get("propagationPolicy") or None,
            grace_period_s=grace if grace is not None else _int(query, "gracePeriodSeconds"),
            orphan_dependents=orphan,
            precondition_uid=preconditions.get("uid"),
            precondition_rv=preconditions.get("resourceVersion"),
            dry_run="All" in (body.get("dryRun") or []) or query.get("dryRun") == "All",
        )

    def _selectors(self, request: web.Request, resource: Resource) -> tuple[LabelSelector, FieldSelector]:
        try:
            labels = LabelSelector(request.query.get("labelSelector", ""))
            fields = FieldSelector(resource, request.query.get("fieldSelector", ""))
        except SelectorError as exc:
            raise bad_request(str(exc)) from None
        return labels, fields

    async def _list_or_watch(
        self, request: web.Request, resource: Resource, namespace: str | None, watch: bool
    ) -> web.StreamResponse:
        query = request.query
        labels, fields = self._selectors(request, resource)
        raw_rv = query.get("resourceVersion") or ""
        if watch:
            rv = parse_resource_version(raw_rv) if raw_rv else 0
            timeout = _int(query, "timeoutSeconds")
            watch_request = WatchRequest(
                resource=resource,
                namespace=namespace,
                labels=labels,
                fields=fields,
                resource_version=rv or None,
                timeout_s=None if timeout is None else float(timeout),
                bookmarks=_flag(query, "allowWatchBookmarks"),
                send_initial_events=_flag(query, "sendInitialEvents"),
            )
            force_expiry = bool(rv) and self.faults.take_watch_expiry()
            return await serve_watch(
                request,
                self.hub,
                watch_request,
                counters=self.counters,
                force_expiry=force_expiry,
                bookmark_interval_s=self._bookmark_interval_s,
            )
        result = self.registry.list(
            resource,
            namespace,
            label_selector=labels,
            field_selector=fields,
            limit=_int(query, "limit"),
            continue_token=query.get("continue") or None,
            resource_version=raw_rv or None,
            resource_version_match=query.get("resourceVersionMatch") or None,
        )
        metadata: JsonObj = {"resourceVersion": str(result.resource_version)}
        if result.continue_token:
            metadata["continue"] = result.continue_token
            metadata["remainingItemCount"] = result.remaining
        return self._json(
            {
                "kind": resource.list_kind,
                "apiVersion": resource.api_version,
                "metadata": metadata,
                "items": result.items,
            }
        )

    async def _delete_collection(
        self, request: web.Request, resource: Resource, namespace: str, manager: str
    ) -> web.Response:
        labels, fields = self._selectors(request, resource)
        options = await self._delete_options(request)
        listed = self.registry.list(resource, namespace, label_selector=labels, field_selector=fields)
        deleted = []
        for obj in listed.items:
            try:
                gone, _ = self.registry.delete(
                    resource, namespace, obj["metadata"]["name"], options, manager=manager
                )
            except ApiError as error:
                if error.status != 404:
                    raise
                continue
            deleted.append(gone)
        metadata = {"resourceVersion": str(self.registry.storage.rv)}
        body = {
            "kind": resource.list_kind,
            "apiVersion": resource.api_version,
            "metadata": metadata,
            "items": deleted,
        }
        return self._json(body)

    async def _pod_log(self, request: web.Request, namespace: str, name: str) -> web.StreamResponse:
        pod = self.registry.get(PODS, namespace, name)
        spec = pod.get("spec") or {}
        main = [c.get("name") for c in spec.get("containers") or []]
        init = [c.get("name") for c in spec.get("initContainers") or []]
        container = request.query.get("container")
        if not container:
            if len(main) != 1:
                choices = f"choose one of: [{' '.join(main)}]"
                if init:
                    choices += f" or one of the init containers: [{' '.join(init)}]"
                raise bad_request(f"a container name must be specified for pod {name}, {choices}")
            container = main[0]
        if container not in main + init:
            raise bad_request(f"container {container} is not valid for pod {name}")
        path = self._logs.log_file(namespace, name, container) if self._logs else None
        if path is None:
            raise bad_request(
                f'container "{container}" in pod "{name}" is waiting to start: ContainerCreating'
            )
        data = path.read_bytes()
        if (tail := _int(request.query, "tailLines")) is not None:
            data = b"".join(data.splitlines(keepends=True)[-tail:]) if tail > 0 else b""
        if (limit := _int(request.query, "limitBytes")) is not None:
            data = data[:limit]
        headers = {"Cache-Control": "no-cache, private", "Content-Type": "text/plain"}
        if not _flag(request.query, "follow") or self._logs is None:
            return web.Response(body=data, headers=headers)
        response = web.StreamResponse(headers=headers)
        response.enable_chunked_encoding()
        await response.prepare(request)
        try:
            await response.write(data)
            offset = path.stat().st_size
            while await self._logs.wait_output(namespace, name, container) or path.stat().st_size > offset:
                with path.open("rb") as handle:
                    handle.seek(offset)
                    chunk = handle.read()
                offset += len(chunk)
                if chunk:
                    await response.write(chunk)
            await response.write_eof()
        except ConnectionError:  # the follower went away
            pass
        return response

    def _discovery(self, request: web.Request) -> web.Response:
        path = request.path.rstrip("/")
        if request.method != "GET":
            raise method_not_allowed()
        if path == "/version":
            return self._json(_VERSION)
        if path == "/api":
            return self._json({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []})
        if path == "/apis":
            group = {
                "name": "batch",
                "versions": [{"groupVersion": "batch/v1", "version": "v1"}],
                "preferredVersion": {"groupVersion": "batch/v1", "version": "v1"},
            }
            return self._json({"kind": "APIGroupList", "apiVersion": "v1", "groups": [group]})
        for group_version, resources in (("v1", (PODS, SECRETS)), ("batch/v1", (JOBS,))):
            prefix = "/api/v1" if group_version == "v1" else "/apis/batch/v1"
            if path == prefix:
                return self._json(_resource_list(group_version, resources))
        raise path_not_found()


_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


def _resource_list(group_version: str, resources: tuple[Resource, ...]) -> JsonObj:
    listed: list[JsonObj] = []
    for resource in resources:
        base = {
            "name": resource.plural,
            "singularName": resource.kind.lower(),
            "namespaced": True,
            "kind": resource.kind,
        }
        listed.append({**base, "verbs": _VERBS})
        if resource.has_status:
            listed.append(
                {
                    **base,
                    "name": f"{resource.plural}/status",
                    "singularName": "",
                    "verbs": ["get", "patch", "update"],
                }
            )
        if resource is PODS:
            listed.append(
                {**base, "name": "pods/binding", "singularName": "", "kind": "Binding", "verbs": ["create"]}
            )
            listed.append({**base, "name": "pods/log", "singularName": "", "verbs": ["get"]})
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": listed}
