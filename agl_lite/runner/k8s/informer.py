"""List-then-watch of one kind (Jobs or Pods) into the cache: a list gives the state and a resourceVersion, the
watch resumes from it; a 410 (or any broken stream) never loses a change, because the informer relists and the
cache is replaced whole. Every `resync_s` it relists anyway (the watch ends at the next resync via its
`timeoutSeconds`, so a list and a watch never race). It reports touched rollouts; it decides nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal

import structlog

from agl_lite.runner.k8s.cache import Cache
from agl_lite.runner.k8s.kube import Gone, KubeApi

__all__ = ["Informer", "Kind"]

log = structlog.get_logger("agl_lite.runner.k8s")

Kind = Literal["jobs", "pods"]


class Informer:
    def __init__(
        self,
        api: KubeApi,
        kind: Kind,
        selector: str,
        cache: Cache,
        on_change: Callable[[set[str]], None],
        *,
        watch_timeout_s: int,
        resync_s: float,
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.api = api
        self.kind = kind
        self.selector = selector
        self.cache = cache
        self.on_change = on_change
        self.watch_timeout_s = watch_timeout_s
        self.resync_s = resync_s
        self._clock = clock
        self._sleep = sleep
        self.resource_version = ""
        self._next_resync = 0.0
        self.lists = 0
        """Lists done (the first, every resync, every 410)."""
        self.expired = 0
        """Watches refused or ended with 410 Expired."""

    async def list(self) -> None:
        """Replace the cache's objects of this kind with a fresh list; remember where its watch starts."""
        if self.kind == "jobs":
            items, rv = await self.api.list_jobs(self.selector)
            touched = self.cache.replace_jobs(items)
        else:
            items, rv = await self.api.list_pods(self.selector)
            touched = self.cache.replace_pods(items)
        self.resource_version = rv
        self.lists += 1
        self._next_resync = self._clock() + self.resync_s
        self.on_change(touched)

    def _apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        if self.kind == "jobs":
            touched = self.cache.drop_job(obj) if kind == "DELETED" else self.cache.put_job(obj)
        else:
            touched = self.cache.drop_pod(obj) if kind == "DELETED" else self.cache.put_pod(obj)
        if touched:
            self.on_change(touched)

    async def run(self) -> None:
        """Forever: watch from the last resourceVersion; relist on 410, on a resync, or after an error."""
        failures = 0
        while True:
            try:
                if not self.resource_version or self._clock() >= self._next_resync:
                    await self.list()
                timeout = max(1, min(self.watch_timeout_s, round(self._next_resync - self._clock()) or 1))
                async for event in self.api.watch(self.kind, self.selector, self.resource_version, timeout):
                    rv = (event.object.get("metadata") or {}).get("resourceVersion")
                    if event.type in ("ADDED", "MODIFIED", "DELETED"):
                        self._apply(event.type, event.object)
                    if rv:
                        self.resource_version = str(rv)
                failures = 0
            except Gone:
                self.expired += 1
                self.resource_version = ""  # too old: the next round lists
                log.info("watch expired, relisting", kind=self.kind)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                self.resource_version = ""  # the stream broke somewhere: a list is the only safe restart
                log.warning("watch failed", kind=self.kind, error=repr(exc), failures=failures)
                await self._sleep(min(0.2 * 2**failures, 10.0))
