"""Following one rollout on plain API JSON (no cluster): pods become attempts in creation order, outcomes are
recorded once, a pod killed by its Job's deadline is a timeout, a verdict waits `settle_s` for late pods (on an
injected clock), a vanished Job is reported, not decided."""

from __future__ import annotations

from typing import Any

import pytest

from agl_lite.runner.k8s.cache import Cache
from agl_lite.runner.k8s.follow import VANISHED, Follow
from agl_lite.runner.plan import resolve
from agl_lite.runner.seams import Launch, RunnerSettings
from agl_lite.store.memory import MemoryStore
from agl_lite.store.records import AttemptStatus, RolloutConfig
from agl_lite.store.rules import RolloutSpec

JOB = "agl-ro-1"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def job(*conditions: dict[str, Any], uid: str = "job-1") -> dict[str, Any]:
    meta = {"name": JOB, "uid": uid, "annotations": {"agl-lite/rollout-id": "ro-1"}}
    return {"metadata": meta, "spec": {"podFailurePolicy": {}}, "status": {"conditions": list(conditions)}}


def pod(
    uid: str, phase: str, *, created: str, code: int | None = None, deleting: bool = False
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": f"{JOB}-{uid}",
        "uid": uid,
        "creationTimestamp": created,
        "annotations": {"agl-lite/rollout-id": "ro-1"},
        "ownerReferences": [{"kind": "Job", "name": JOB, "uid": "job-1"}],
    }
    if deleting:
        meta["deletionTimestamp"] = created
    status: dict[str, Any] = {"phase": phase}
    if code is not None:
        status["containerStatuses"] = [{"name": "agent", "state": {"terminated": {"exitCode": code}}}]
    return {"metadata": meta, "status": status}


COMPLETE = {"type": "Complete", "status": "True"}
DEADLINE = {"type": "Failed", "status": "True", "reason": "DeadlineExceeded", "message": "too long"}


@pytest.fixture
async def setup() -> tuple[Follow, MemoryStore, Cache, Clock]:
    store = MemoryStore()
    await store.enqueue([RolloutSpec({"q": 1}, config=RolloutConfig(max_attempts=3), id="ro-1")])
    (rollout,) = await store.claim("k8s", 1)
    launch = Launch(rollout, resolve(RunnerSettings("k8s", "http://gw"), rollout), None, {}, {})
    cache, clock = Cache(), Clock()
    follow = Follow(launch, JOB, store, cache, settle_s=5.0, clock=clock, job_uid="job-1")
    cache.put_job(job())
    return follow, store, cache, clock


async def test_pods_become_attempts_in_the_order_they_were_made(setup: Any) -> None:
    follow, store, cache, _ = setup
    cache.put_pod(pod("b", "Running", created="2026-01-01T00:00:02Z"))
    cache.put_pod(pod("a", "Failed", created="2026-01-01T00:00:01Z", code=1))
    assert await follow.step() is None
    first, second = await store.attempts("ro-1")
    assert [(first.id, first.seq, first.status), (second.id, second.seq, second.status)] == [
        ("a", 1, AttemptStatus.FAILED),
        ("b", 2, AttemptStatus.RUNNING),
    ]
    assert first.exit_code == 1


async def test_an_outcome_is_recorded_once(setup: Any) -> None:
    follow, store, cache, _ = setup
    cache.put_pod(pod("a", "Failed", created="2026-01-01T00:00:01Z", code=2))
    await follow.step()
    assert await follow.step() is None  # a second look changes nothing and raises no conflict
    (attempt,) = await store.attempts("ro-1")
    assert (attempt.status, attempt.exit_code) == (AttemptStatus.FAILED, 2)


async def test_the_verdict_of_a_complete_job(setup: Any) -> None:
    follow, store, cache, _ = setup
    cache.put_pod(pod("a", "Succeeded", created="2026-01-01T00:00:01Z", code=0))
    cache.put_job(job(COMPLETE))
    outcome = await follow.step()
    assert outcome is not VANISHED
    assert outcome is not None
    assert outcome.status is AttemptStatus.SUCCEEDED
    (attempt,) = await store.attempts("ro-1")
    assert attempt.status is AttemptStatus.SUCCEEDED


async def test_a_pod_killed_by_the_jobs_deadline_is_a_timeout_not_a_failure(setup: Any) -> None:
    follow, store, cache, _ = setup
    cache.put_pod(pod("a", "Running", created="2026-01-01T00:00:01Z"))
    await follow.step()
    cache.put_pod(pod("a", "Failed", created="2026-01-01T00:00:01Z", code=143, deleting=True))
    assert await follow.step() is None  # killed while deleted: why is not known yet
    (attempt,) = await store.attempts("ro-1")
    assert attempt.status is AttemptStatus.RUNNING
    cache.put_job(job(DEADLINE))
    outcome = await follow.step()
    assert outcome is not None
    assert outcome is not VANISHED
    assert outcome.status is AttemptStatus.TIMEOUT
    (attempt,) = await store.attempts("ro-1")
    assert attempt.status is AttemptStatus.TIMEOUT


async def test_a_verdict_waits_settle_s_for_a_pods_last_status(setup: Any) -> None:
    follow, store, cache, clock = setup
    cache.put_pod(pod("a", "Running", created="2026-01-01T00:00:01Z"))
    cache.put_job(job(COMPLETE))
    assert await follow.step() is None
    assert follow.settle_deadline == 105.0
    clock.now = 104.9
    assert await follow.step() is None
    clock.now = 105.0
    outcome = await follow.step()
    assert outcome is not None
    assert outcome is not VANISHED
    assert outcome.status is AttemptStatus.SUCCEEDED
    (attempt,) = await store.attempts("ro-1")
    assert attempt.status is AttemptStatus.LOST  # it never said how it ended
    # a 1.20 server's Complete condition has no reason (issue #15: the message read "...: None")
    assert attempt.message == "pod stopped as its Job ended (it completed)"


async def test_a_late_pod_status_inside_the_settle_period_is_kept(setup: Any) -> None:
    follow, store, cache, _ = setup
    cache.put_pod(pod("a", "Running", created="2026-01-01T00:00:01Z"))
    cache.put_job(job(COMPLETE))
    assert await follow.step() is None
    cache.put_pod(pod("a", "Succeeded", created="2026-01-01T00:00:01Z", code=0))
    outcome = await follow.step()
    assert outcome is not None
    (attempt,) = await store.attempts("ro-1")
    assert attempt.status is AttemptStatus.SUCCEEDED


async def test_a_pod_deleted_while_the_job_moves_on_is_lost(setup: Any) -> None:
    follow, store, cache, _ = setup
    first = pod("a", "Running", created="2026-01-01T00:00:01Z")
    cache.put_pod(first)
    await follow.step()
    cache.drop_pod(first)
    cache.put_pod(pod("b", "Running", created="2026-01-01T00:00:02Z"))
    assert await follow.step() is None
    lost, running = await store.attempts("ro-1")
    assert (lost.status, lost.message, running.status) == (
        AttemptStatus.LOST,
        "pod deleted",
        AttemptStatus.RUNNING,
    )


async def test_a_vanished_or_replaced_job_is_reported(setup: Any) -> None:
    follow, _, cache, _ = setup
    cache.replace_jobs([job(uid="job-2")])
    assert await follow.step() is VANISHED
    cache.replace_jobs([])
    assert await follow.step() is VANISHED


async def test_pods_of_an_earlier_job_of_the_same_name_are_not_attempts(setup: Any) -> None:
    follow, store, cache, _ = setup
    old = pod("x", "Failed", created="2026-01-01T00:00:00Z", code=1)
    old["metadata"]["ownerReferences"][0]["uid"] = "job-0"
    cache.put_pod(old)
    await follow.step()
    assert await store.attempts("ro-1") == []


async def test_a_cancelled_rollout_ends_the_follow(setup: Any) -> None:
    follow, store, cache, _ = setup
    await store.cancel("ro-1")
    cache.put_pod(pod("a", "Running", created="2026-01-01T00:00:01Z"))
    outcome = await follow.step()
    assert outcome is not None
    assert outcome is not VANISHED
    assert outcome.status is AttemptStatus.CANCELLED
