"""The Kubernetes backend: one Job per rollout; the Job retries (`owns_retries`), the controller records.

`launch` makes sure the rollout's Job exists (created with its Secret, or adopted after a restart: 409 means it is
there, never a duplicate), then follows it (`follow.Follow`: pods become attempts, the Job's condition the
verdict, which `launch` returns for the core to record). A Job that vanishes before its verdict is relaunched with
the attempts left. Deleting Jobs once their outcome is recorded is the janitor's (`cleanup`); `cancel` deletes at
once. See docs/controller.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import structlog
from kubernetes.aio.client import ApiClient

from agl_lite.client.errors import ConnectionFailed, RequestTimeout
from agl_lite.core.tasks import TaskSet
from agl_lite.errors import ConfigError, HttpError, ServiceUnavailable, TooManyRequests
from agl_lite.runner.k8s.cache import Cache
from agl_lite.runner.k8s.cleanup import JobJanitor
from agl_lite.runner.k8s.follow import VANISHED, Follow, refused
from agl_lite.runner.k8s.informer import Informer, Kind
from agl_lite.runner.k8s.kube import AlreadyExists, KubeApi, KubeError, load_configuration
from agl_lite.runner.k8s.manifest import INSTANCE_LABEL, LaunchSpec, build_job, build_secret, launch_spec
from agl_lite.runner.k8s.names import MANAGED_SELECTOR, job_name
from agl_lite.runner.k8s.options import K8sOptions, parse_k8s_options
from agl_lite.runner.k8s.ratelimit import TokenBucket
from agl_lite.runner.k8s.views import JobView
from agl_lite.runner.seams import Launch, Outcome, RunnerSettings, RunnerStore
from agl_lite.store.records import Attempt, AttemptStatus, Rollout

__all__ = ["K8sBackend"]

log = structlog.get_logger("agl_lite.runner.k8s")

RETRY_S = 1.0
"""Pause before a launch tries again after the store or the API server failed it; it doubles with each failure
in a row, up to `RETRY_MAX_S`."""
RETRY_MAX_S = 60.0

T = TypeVar("T")


class K8sBackend:
    """Built by the runner core as `K8sBackend(settings, options)` (options: the `[addons.runner.k8s]` table)."""

    owns_retries = True

    def __init__(
        self,
        settings: RunnerSettings,
        options: Mapping[str, Any],
        *,
        api: KubeApi | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.settings = settings
        self.options: K8sOptions = parse_k8s_options(
            options, file=settings.config_file, where="addons.runner.k8s"
        )
        self.api = api
        self._clock = clock
        self._sleep = sleep
        self.cache = Cache()
        self.selector = f"{MANAGED_SELECTOR},{INSTANCE_LABEL}={self.options.instance}"
        self._follows: dict[str, Follow] = {}
        self._secrets: set[str] = set()
        """Names of the rollout Secrets known to exist (listed at open, then created)."""
        self.janitor: JobJanitor | None = None
        self._tasks = TaskSet()
        self._launch_slots = asyncio.Semaphore(self.options.launch_concurrency)
        self._closing = False
        self._warned_policy = False
        self.store: RunnerStore | None = None
        self.informers: list[Informer] = []
        self.jobs_created = 0
        self.jobs_adopted = 0

    @property
    def _kube(self) -> KubeApi:
        return _opened(self.api)

    @property
    def _janitor(self) -> JobJanitor:
        return _opened(self.janitor)

    @property
    def _store(self) -> RunnerStore:
        return _opened(self.store)

    # --- lifecycle -----------------------------------------------------------------------------------------------

    async def open(self, store: RunnerStore, runner_id: str) -> None:
        """Connect, fill the cache (so a restart adopts its Jobs without a request each), start the informers and
        the follower of the completion cursor."""
        self.store = store
        if self.api is None:
            o = self.options
            cfg = await load_configuration(o.kubeconfig, o.context)
            self.api = KubeApi(
                ApiClient(cfg),
                o.namespace,
                TokenBucket(o.qps, o.burst, clock=self._clock, sleep=self._sleep),
                retries=o.retries,
                max_retry_after_s=o.max_retry_after_s,
                sleep=self._sleep,
            )
        kinds: tuple[Kind, ...] = ("jobs", "pods")
        for kind in kinds:
            informer = Informer(
                self.api,
                kind,
                self.selector,
                self.cache,
                self._touch,
                watch_timeout_s=self.options.watch_timeout_s,
                resync_s=self.options.resync_s,
                clock=self._clock,
                sleep=self._sleep,
            )
            await informer.list()
            self.informers.append(informer)
        self._secrets = set(await self._kube.list_secret_names(self.selector))
        for informer in self.informers:
            self._tasks.spawn(informer.run(), name=f"k8s.informer:{informer.kind}")
        self.janitor = JobJanitor(self.api, self.cache, self.selector, ended=self._ended, sleep=self._sleep)
        _, cursor = await store.completed(0, 0)
        self._tasks.spawn(self.janitor.follow_completions(store, cursor), name="k8s.completions")
        log.info("k8s backend open", namespace=self.options.namespace, jobs=len(self.cache.jobs))

    async def close(self) -> None:
        """Stop following; Jobs keep running (a restarted controller adopts them). Launches return LOST."""
        self._closing = True
        for follow in self._follows.values():
            follow.changed.set()
        await self._tasks.close()
        if self.api is not None:
            await self._kube.close()

    # --- the core's calls ----------------------------------------------------------------------------------------

    async def launch(self, launch: Launch) -> Outcome:
        rid = launch.rollout.id
        follow = Follow(launch, job_name(rid), self._store, self.cache, self.options.settle_s, self._clock)
        self._follows[rid] = follow
        try:
            failures = 0
            while True:
                try:
                    return await self._run(follow)
                except Exception as exc:
                    if self._closing:
                        return Outcome(
                            AttemptStatus.LOST, message="the controller stopped; the Job keeps running"
                        )
                    if not isinstance(exc, KubeError | OSError | TimeoutError) and not _transient(exc):
                        raise
                    delay = min(RETRY_MAX_S, RETRY_S * 2**failures)
                    failures += 1
                    log.warning(
                        "k8s launch step failed, retrying", rollout_id=rid, error=repr(exc), retry_in_s=delay
                    )
                    await self._back_off(follow, delay)
        finally:
            if self._follows.get(rid) is follow:
                del self._follows[rid]

    async def cancel(self, rollout_id: str) -> None:
        """Delete the rollout's Job now (its pods and Secret go with it) and end its launch as CANCELLED."""
        self._ended(rollout_id)
        try:
            await self._janitor.delete(job_name(rollout_id))
        except KubeError as exc:  # the completion follower or the next reconcile deletes it
            log.warning("deleting a cancelled rollout's Job failed", rollout_id=rollout_id, error=str(exc))

    async def reconcile(self, running: Sequence[tuple[Rollout, list[Attempt]]]) -> None:
        """Look at every followed rollout again, and delete Jobs whose rollout the store says is over."""
        for follow in self._follows.values():
            follow.changed.set()
        busy = {r.id for r, _ in running} | set(self._follows)
        await self._janitor.sweep(self._store, busy)

    def _ended(self, rollout_id: str) -> None:
        """The rollout ended elsewhere (a cancel): its launch ends too, and its Job is the janitor's now."""
        follow = self._follows.get(rollout_id)
        if follow is not None:
            follow.cancelled = True
            follow.changed.set()
        self._secrets.discard(job_name(rollout_id))

    # --- following one rollout -----------------------------------------------------------------------------------

    def _touch(self, rollout_ids: set[str]) -> None:
        for rid in rollout_ids:
            follow = self._follows.get(rid)
            if follow is not None:
                follow.changed.set()

    async def _pause(self, follow: Follow, seconds: float) -> None:
        """Until something changes for the rollout, or `seconds` passed (a retry or a settle period)."""
        # asyncio.timeout, not wait_for: on 3.11 a wait_for racing its event can swallow a cancel
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await follow.changed.wait()

    async def _back_off(self, follow: Follow, seconds: float) -> None:
        """`seconds`, whatever else changes for the rollout (an informer event, a reconcile), unless it is
        cancelled or the controller stops. (`_pause` returns at any change: as a retry's pause it let a reconcile,
        which marks every rollout changed, turn the retries into a loop at the client's full rate: 11,212 failed
        creates in 11 minutes for one rollout.)"""
        deadline = self._clock() + seconds
        while not (follow.cancelled or self._closing):
            left = deadline - self._clock()
            if left <= 0:
                return
            follow.changed.clear()
            await self._pause(follow, left)

    async def _run(self, follow: Follow) -> Outcome:
        early = await self._ensure_job(follow)
        if early is not None:
            return early
        while True:
            follow.changed.clear()
            if follow.cancelled:
                if self.cache.job(follow.name) is not None:
                    await self._janitor.delete(follow.name)  # a cancel can overtake the create it cancels
                return Outcome(AttemptStatus.CANCELLED, message="cancelled: the Job was deleted")
            if self._closing:
                return Outcome(AttemptStatus.LOST, message="the controller stopped; the Job keeps running")
            outcome = await follow.step()
            if outcome is VANISHED:
                outcome = await self._vanished(follow)
            if outcome is not None:
                return outcome
            if follow.changed.is_set():
                continue
            if follow.settle_deadline is not None:
                await self._pause(follow, max(0.0, follow.settle_deadline - self._clock()))
            else:
                await follow.changed.wait()

    async def _ensure_job(self, follow: Follow) -> Outcome | None:
        """The rollout's Job exists (adopted, or created): None; or the outcome when it cannot be (bad config)."""
        rollout = follow.launch.rollout
        job = self.cache.job(follow.name)
        if job is None:
            if rollout.attempt_count == 0:
                return await self._create(follow, backoff_limit=None)
            # taken back after a restart, with attempts used and no Job: it vanished while nobody watched
            return await self._relaunch(follow, rollout)
        if job.rollout_id != rollout.id:
            return refused(f"Job {job.name} exists and belongs to rollout {job.rollout_id!r}")
        follow.job_uid = job.uid
        self.jobs_adopted += 1
        if not job.finished and follow.name not in self._secrets:
            await self._create_secret(follow, job.uid)
        return None

    def _spec(self, follow: Follow, backoff_limit: int | None) -> LaunchSpec:
        launch = follow.launch
        return launch_spec(
            self.options,
            launch.plan,
            launch.rollout.id,
            launch.env,
            launch.grader_env,
            backoff_limit=backoff_limit,
        )

    async def _create(self, follow: Follow, *, backoff_limit: int | None) -> Outcome | None:
        try:
            spec = self._spec(follow, backoff_limit)
        except ConfigError as exc:
            return refused(f"invalid Kubernetes config: {exc}")
        async with self._launch_slots:
            try:
                created = await self._kube.create_job(build_job(spec, self.options))
                self.jobs_created += 1
            except AlreadyExists:
                existing = await self._kube.get_job(follow.name)
                if existing is None:
                    raise KubeError(409, "Conflict", f"Job {follow.name} exists and is gone again") from None
                created = existing
                self.jobs_adopted += 1
            except KubeError as exc:
                # 404 on a create: the namespace does not exist (`namespaces "X" not found`); no retry makes it.
                if exc.status in (400, 403, 404, 422):
                    return refused(f"the API server refused the Job: {exc.message or exc}")
                raise
            self._touch(self.cache.put_job(created))
            job = JobView.from_json(created)
            if job.rollout_id != follow.launch.rollout.id:
                return refused(f"Job {job.name} exists and belongs to rollout {job.rollout_id!r}")
            follow.job_uid = job.uid
            if not job.has_failure_policy and not self._warned_policy:
                self._warned_policy = True
                log.warning(
                    "the API server dropped podFailurePolicy (Kubernetes < 1.26?): evictions burn retries and "
                    "non-retryable exit codes are retried",
                    job=job.name,
                )
            if not job.finished:
                await self._create_secret(follow, job.uid, spec)
        return None

    async def _create_secret(self, follow: Follow, job_uid: str, spec: LaunchSpec | None = None) -> None:
        try:
            body = build_secret(spec or self._spec(follow, None), self.options, job_uid=job_uid)
        except ConfigError:
            return  # the Job exists already; it was built from a config that worked then
        with contextlib.suppress(AlreadyExists):
            await self._kube.create_secret(body)
        self._secrets.add(follow.name)

    async def _vanished(self, follow: Follow) -> Outcome | None:
        """The followed Job is gone (or replaced) without a verdict: confirm with a read, then relaunch it with
        the attempts left, or fail the rollout when none are."""
        if follow.cancelled:
            return Outcome(AttemptStatus.CANCELLED, message="cancelled: the Job was deleted")
        live = await self._kube.get_job(follow.name)
        if live is not None and JobView.from_json(live).uid == follow.job_uid:
            self._touch(self.cache.put_job(live))  # only the cache was behind (a relist raced our create)
            return None
        await follow.close_all(AttemptStatus.LOST, "its Job vanished")
        if follow.a_pod_succeeded:
            return Outcome(AttemptStatus.SUCCEEDED, 0, f"Job {follow.name} vanished after its pod succeeded")
        rollout = await self._store.get_rollout(follow.rollout_id)
        if rollout.status.terminal:
            return Outcome(AttemptStatus.CANCELLED, message=f"the rollout is {rollout.status.value}")
        follow.restart()
        self._secrets.discard(follow.name)
        return await self._relaunch(follow, rollout)

    async def _relaunch(self, follow: Follow, rollout: Rollout) -> Outcome | None:
        """A Job that vanished before its outcome was recorded: again, with the attempts the rollout has left."""
        left = follow.launch.plan.max_attempts - rollout.attempt_count
        if left <= 0:
            return refused(
                f"Job {follow.name} vanished before its outcome was recorded, and no attempts are left"
            )
        log.warning("Job vanished before its outcome; relaunching", rollout_id=rollout.id, attempts_left=left)
        return await self._create(follow, backoff_limit=left - 1)


def _opened(part: T | None) -> T:
    if part is None:
        raise RuntimeError("the k8s backend is not open")
    return part


def _transient(exc: Exception) -> bool:
    """A store call that may work again (the gateway restarting or busy): not a refusal of the request."""
    if isinstance(exc, ConnectionFailed | RequestTimeout | ServiceUnavailable | TooManyRequests):
        return True
    status = getattr(exc, "status_code", None)  # the client's ApiError carries the HTTP status
    if status is None and isinstance(exc, HttpError):
        status = exc.status
    return isinstance(status, int) and status >= 500
