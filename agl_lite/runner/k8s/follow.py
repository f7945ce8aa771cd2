"""Following one rollout's Job, level-triggered: each `step` compares the cache with what was recorded and
catches up — a new pod is upserted as an attempt (its UID is the attempt id), an ended pod's outcome is recorded —
and gives the verdict once the Job has one and its pods are accounted for. It never creates or deletes anything
in the cluster; the backend does, and decides what a vanished Job means.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

import structlog

from agl_lite.errors import Conflict, NotFound
from agl_lite.runner.k8s.cache import Cache
from agl_lite.runner.k8s.views import PodView
from agl_lite.runner.seams import Launch, Outcome, RunnerStore
from agl_lite.store.records import AttemptStatus

__all__ = ["VANISHED", "Follow", "refused"]

log = structlog.get_logger("agl_lite.runner.k8s")


class _Vanished(Enum):
    VANISHED = "vanished"


VANISHED = _Vanished.VANISHED
"""What `step` returns when the Job it follows is gone (or replaced) without a verdict."""


def refused(message: str) -> Outcome:
    """A verdict no retry can change (a bad config, a refused Job)."""
    return Outcome(AttemptStatus.FAILED, message=message, retryable=False)


@dataclass(slots=True, eq=False)
class Follow:
    """One rollout whose Job this controller follows (one launch)."""

    launch: Launch
    name: str
    """The Job's name."""
    store: RunnerStore
    cache: Cache
    settle_s: float
    clock: Callable[[], float]
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when something about the rollout changed (an informer event, a cancel, a reconcile)."""
    job_uid: str | None = None
    """The Job instance followed; pods of an earlier instance (a vanished Job) are not its attempts."""
    cancelled: bool = False
    settle_deadline: float | None = None
    """Set once the Job has a verdict while some pod has not reported its end yet."""
    seen: set[str] = field(default_factory=set)
    """Pod UIDs seen; an attempt each."""
    recorded: set[str] = field(default_factory=set)
    """Pod UIDs upserted as attempts (or refused by the store: nothing more to do for them)."""
    closed: dict[str, PodView | None] = field(default_factory=dict)
    """Pod UIDs whose attempt outcome is recorded (with the pod as last seen)."""
    last_failure: str | None = None

    @property
    def rollout_id(self) -> str:
        return self.launch.rollout.id

    def restart(self) -> None:
        """A new Job instance (a relaunch): its pods are new attempts."""
        self.seen.clear()
        self.recorded.clear()
        self.closed.clear()
        self.job_uid = None

    def _belongs(self, pod: PodView) -> bool:
        return pod.job_name == self.name and (self.job_uid is None or pod.owner_uid in (None, self.job_uid))

    async def step(self) -> Outcome | _Vanished | None:
        """Catch up with the cache once: the verdict, VANISHED, or None (nothing decided yet)."""
        job = self.cache.job(self.name)
        pods = sorted(
            (p for p in self.cache.pods_of(self.rollout_id) if self._belongs(p)),
            key=lambda p: (p.created, p.name),
        )
        killed: list[PodView] = []  # failed while being deleted: why depends on who deleted it
        for pod in pods:
            self.seen.add(pod.uid)
            if pod.uid not in self.recorded:
                ended = await self._upsert(pod)
                if ended is not None:
                    return ended
            if pod.outcome is None or pod.uid in self.closed:
                continue
            if pod.deleting and pod.outcome.status is AttemptStatus.FAILED:
                killed.append(pod)
                continue
            await self.close(pod.uid, pod, pod.outcome.status, pod.outcome.exit_code, pod.outcome.message)
        present = {p.uid for p in pods}
        gone = [uid for uid in self.seen if uid not in present and uid not in self.closed]
        gone += [p.uid for p in killed]
        if job is None or job.uid != self.job_uid:
            return VANISHED
        if not job.finished:
            if gone and any(p.outcome is None and not p.deleting for p in pods):
                for uid in gone:  # the Job has moved on to a new pod: the old one was deleted, not failed
                    await self.close(uid, None, AttemptStatus.LOST, None, "pod deleted")
            return None
        unsettled = [p for p in pods if p.outcome is None]
        if unsettled:  # the verdict can overtake the pods' last status (two watches): give them a moment
            if self.settle_deadline is None:
                self.settle_deadline = self.clock() + self.settle_s
            if self.clock() < self.settle_deadline:
                return None
        # what the Job's end stopped: its deadline (timeout), or anything else (lost)
        timed_out = job.reason == "DeadlineExceeded"
        final = AttemptStatus.TIMEOUT if timed_out else AttemptStatus.LOST
        for uid in gone + [p.uid for p in unsettled]:
            # (a 1.20 server's Complete condition has no reason: say what ended it, never "None")
            why = job.reason or ("it completed" if job.succeeded else "it failed")
            await self.close(uid, None, final, None, f"pod stopped as its Job ended ({why})")
        if job.succeeded:
            return Outcome(AttemptStatus.SUCCEEDED, 0, job.outcome_message)
        detail = f"; last attempt: {self.last_failure}" if self.last_failure else ""
        status = AttemptStatus.TIMEOUT if timed_out else AttemptStatus.FAILED
        return Outcome(status, None, job.outcome_message + detail, retryable=False)

    async def _upsert(self, pod: PodView) -> Outcome | None:
        """Record the pod as an attempt; CANCELLED when the rollout has ended meanwhile."""
        try:
            attempt = await self.store.start_attempt(self.rollout_id, pod.uid)
        except Conflict as exc:
            rollout = await self.store.get_rollout(self.rollout_id)
            if rollout.status.terminal:
                return Outcome(AttemptStatus.CANCELLED, message=f"the rollout is {rollout.status.value}")
            # the store caps attempts at max_attempts, evicted pods included: the Job's verdict still decides
            log.warning(
                "pod not recorded as an attempt", rollout_id=self.rollout_id, pod=pod.name, error=str(exc)
            )
            self.closed[pod.uid] = pod
        else:
            if attempt.status is not AttemptStatus.RUNNING:
                self.closed[pod.uid] = pod
        self.recorded.add(pod.uid)
        return None

    async def close(
        self, uid: str, pod: PodView | None, status: AttemptStatus, exit_code: int | None, message: str | None
    ) -> None:
        """Record how the attempt `uid` ended (a no-op for one the store never had or already ended)."""
        if uid not in self.recorded:
            self.closed[uid] = pod
            return
        with contextlib.suppress(Conflict, NotFound):  # ended already (a cancel got there first)
            await self.store.update_attempt(
                self.rollout_id, uid, status, exit_code=exit_code, message=message
            )
        self.closed[uid] = pod
        if status is not AttemptStatus.SUCCEEDED:
            self.last_failure = status.value + (f": {message}" if message else "")
        log.info(
            "attempt ended",
            rollout_id=self.rollout_id,
            attempt_id=uid,
            status=status.value,
            exit_code=exit_code,
        )

    async def close_all(self, status: AttemptStatus, message: str) -> None:
        for uid in list(self.seen):
            if uid not in self.closed:
                await self.close(uid, None, status, None, message)

    @property
    def a_pod_succeeded(self) -> bool:
        return any(
            p is not None and p.outcome is not None and p.outcome.status is AttemptStatus.SUCCEEDED
            for p in self.closed.values()
        )
