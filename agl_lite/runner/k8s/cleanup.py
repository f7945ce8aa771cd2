"""Deleting Jobs, and only once their rollout's outcome is recorded: the janitor follows the store's completion
cursor (a rollout appears there only once its verdict is durable) and deletes the Jobs of each page with
`propagationPolicy=Background` — one `deletecollection` on their rollout labels — so the garbage collector takes
their pods and Secrets. A sweep at each reconcile deletes what that missed (a controller that was down, a failed
request). It decides nothing about rollouts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Mapping

import structlog

from agl_lite.errors import NotFound
from agl_lite.runner.k8s.cache import Cache
from agl_lite.runner.k8s.kube import KubeApi, KubeError
from agl_lite.runner.k8s.names import ROLLOUT_LABEL, job_name, rollout_label_value
from agl_lite.runner.seams import RunnerStore

__all__ = ["JobJanitor"]

log = structlog.get_logger("agl_lite.runner.k8s")

COMPLETED_WAIT_S = 25.0
"""Long-poll of the completion cursor."""
DELETE_BATCH = 50
"""Jobs deleted by one deletecollection request (their rollout labels make the selector: at most ~3 KB)."""
DELETED_MEMORY = 10_000
RETRY_S = 1.0


class JobJanitor:
    def __init__(
        self,
        kube: KubeApi,
        cache: Cache,
        selector: str,
        *,
        ended: Callable[[str], None],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.kube = kube
        self.cache = cache
        self.selector = selector
        self._ended = ended
        """Told of every rollout seen terminal on the cursor before its Job is deleted (a launch following it
        ends: a cancel)."""
        self._sleep = sleep
        self._deleting: set[str] = set()
        """Jobs to be deleted or being deleted now: nobody else deletes them meanwhile."""
        self._deleted: dict[str, None] = {}
        """UIDs of Jobs deleted here (bounded, oldest forgotten): the cache shows them until their DELETED event."""
        self.deleted = 0
        """Jobs deleted (a count, for tests and metrics)."""

    def _forget(self, names: Collection[str]) -> None:
        for name in names:
            cached = self.cache.job(name)
            if cached is not None:
                self._deleted[cached.uid] = None
        while len(self._deleted) > DELETED_MEMORY:
            del self._deleted[next(iter(self._deleted))]

    async def delete(self, name: str, *, claimed: bool = False) -> None:
        """Delete one Job now (Background); `claimed`: the caller put `name` in `_deleting` already."""
        if name in self._deleting and not claimed:
            return
        self._deleting.add(name)
        try:
            if await self.kube.delete_job(name):
                self.deleted += 1
            self._forget([name])
        finally:
            self._deleting.discard(name)

    async def _delete_many(self, jobs: Mapping[str, str]) -> None:
        """Delete the Jobs `jobs` (name -> rollout id) in one request, selected by their rollout labels."""
        if len(jobs) == 1:
            (name,) = jobs
            await self.delete(name, claimed=True)
            return
        values = ",".join(sorted(rollout_label_value(rid) for rid in jobs.values()))
        deleted = await self.kube.delete_jobs(f"{self.selector},{ROLLOUT_LABEL} in ({values})")
        self.deleted += len(deleted)
        self._forget(list(jobs))

    async def follow_completions(self, store: RunnerStore, cursor: int) -> None:
        """Forever: the Jobs of rollouts that turn terminal go, a page per request; a page that fails is left to
        the next sweep."""
        while True:
            try:
                rows, cursor = await store.completed(cursor, 1000, COMPLETED_WAIT_S)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("following completions failed", error=repr(exc))
                await self._sleep(RETRY_S)
                continue
            batch: dict[str, str] = {}
            for rollout in rows:
                self._ended(rollout.id)
                name = job_name(rollout.id)
                if name in self.cache.jobs and name not in self._deleting:
                    self._deleting.add(name)  # claimed now, so a sweep meanwhile leaves it alone
                    batch[name] = rollout.id
            names = list(batch)
            for start in range(0, len(names), DELETE_BATCH):
                chunk = names[start : start + DELETE_BATCH]
                try:
                    await self._delete_many({n: batch[n] for n in chunk})
                except KubeError as exc:
                    log.warning("deleting finished Jobs failed", jobs=len(chunk), error=str(exc))
                finally:
                    self._deleting.difference_update(chunk)

    async def sweep(self, store: RunnerStore, busy: Collection[str]) -> None:
        """Delete the cached Jobs whose rollout is terminal in the store, except the `busy` rollouts' (running, or
        followed) and those being deleted."""
        for job in list(self.cache.jobs.values()):
            rid = job.rollout_id
            if (
                rid is None
                or rid in busy
                or job.deleting
                or job.name in self._deleting
                or job.uid in self._deleted
            ):
                continue
            try:
                rollout = await store.get_rollout(rid)
            except NotFound:
                log.warning("a Job of a rollout the store does not know; left alone", job=job.name)
                continue
            if rollout.status.terminal:
                try:
                    await self.delete(job.name)
                except KubeError as exc:
                    log.warning("deleting a finished Job failed", job=job.name, error=str(exc))
