"""The runner core against the real in-process store and a scripted backend: claiming, concurrency, retry
ownership, verdicts, cancels, taking back after a restart. Real processes are tested in test_local.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import pytest

from agl_lite.runner.env import ContractEnv
from agl_lite.runner.runner import Runner
from agl_lite.runner.seams import Launch, Outcome, RunnerSettings, RunnerStore
from agl_lite.store.memory import MemoryStore
from agl_lite.store.records import Attempt, AttemptStatus, Rollout, RolloutConfig, RolloutStatus
from agl_lite.store.rules import RolloutSpec, Store
from tests.conftest import ADMIN_KEY

OK = Outcome(AttemptStatus.SUCCEEDED, 0, "ok")
FAIL = Outcome(AttemptStatus.FAILED, 1, "agent exited with code 1\nmore")
SETTINGS = RunnerSettings(
    runner_id="r1", public_url="http://127.0.0.1:9", command=("agent",), poll_s=3600, resync_s=3600
)


class ScriptedBackend:
    """Returns the queued outcomes in order (then success); with `hold`, each launch waits for `release` or for
    `cancel`/`close`, as a real run would."""

    def __init__(self, outcomes: Sequence[Outcome] = (), *, hold: bool = False, owns_retries: bool = False):
        self.owns_retries = owns_retries
        self.outcomes = list(outcomes)
        self.hold = hold
        self.release = asyncio.Event()
        self.launches: list[Launch] = []
        self.started: asyncio.Queue[Launch] = asyncio.Queue()
        self.ended: asyncio.Queue[Outcome] = asyncio.Queue()
        self.cancelled: list[str] = []
        self.reconciled: list[list[str]] = []
        self.running = self.peak = 0
        self.store: RunnerStore | None = None
        self._stops: dict[str, asyncio.Future[AttemptStatus]] = {}

    async def open(self, store: RunnerStore, runner_id: str) -> None:
        self.store = store

    async def launch(self, launch: Launch) -> Outcome:
        self.launches.append(launch)
        self.running += 1
        self.peak = max(self.peak, self.running)
        stop = self._stops[launch.rollout.id] = asyncio.get_running_loop().create_future()
        self.started.put_nowait(launch)
        try:
            outcome = self.outcomes.pop(0) if self.outcomes else OK
            if self.hold:
                released = asyncio.ensure_future(self.release.wait())
                await asyncio.wait([released, stop], return_when=asyncio.FIRST_COMPLETED)
                released.cancel()
                if stop.done():
                    outcome = Outcome(stop.result(), message="stopped")
            self.ended.put_nowait(outcome)
            return outcome
        finally:
            self.running -= 1
            del self._stops[launch.rollout.id]

    async def cancel(self, rollout_id: str) -> None:
        self.cancelled.append(rollout_id)
        stop = self._stops.get(rollout_id)
        if stop is not None and not stop.done():
            stop.set_result(AttemptStatus.CANCELLED)

    async def reconcile(self, running: Sequence[tuple[Rollout, list[Attempt]]]) -> None:
        self.reconciled.append([r.id for r, _ in running])

    async def close(self) -> None:
        for stop in self._stops.values():
            if not stop.done():
                stop.set_result(AttemptStatus.LOST)


@asynccontextmanager
async def running_runner(
    store: Any, backend: ScriptedBackend, settings: RunnerSettings = SETTINGS
) -> AsyncIterator[Runner]:
    runner = Runner(store, backend, settings, ContractEnv(settings.public_url, ADMIN_KEY))
    await runner.start()
    try:
        yield runner
    finally:
        await runner.stop()


async def terminal(store: Store, n: int, timeout: float = 30.0) -> dict[str, Rollout]:
    """The first `n` rollouts on the completion cursor, waited for (not polled)."""
    rows: list[Rollout] = []
    cursor = 0
    async with asyncio.timeout(timeout):
        while len(rows) < n:
            got, cursor = await store.completed(cursor, 100, wait=timeout)
            rows += got
    return {r.id: r for r in rows}


def spec(rid: str, **config: Any) -> RolloutSpec:
    return RolloutSpec({"q": rid}, config=RolloutConfig(**config), id=rid)


class NoSignal:
    """The in-process store without its enqueue signal, as a remote store looks to the runner."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        if name == "enqueued":
            raise AttributeError(name)
        return getattr(self._store, name)


async def test_an_enqueue_wakes_the_runner_without_polling() -> None:
    store, backend = MemoryStore(), ScriptedBackend()
    async with running_runner(store, backend):  # poll_s and resync_s are an hour
        await store.enqueue([spec("a")])
        done = await terminal(store, 1)
    assert done["a"].status is RolloutStatus.SUCCEEDED
    assert done["a"].runner_id == "r1"


async def test_a_store_without_an_enqueue_signal_is_polled() -> None:
    store, backend = MemoryStore(), ScriptedBackend()
    async with running_runner(NoSignal(store), backend, replace(SETTINGS, poll_s=0.05)):
        await store.enqueue([spec("a")])
        assert (await terminal(store, 1))["a"].status is RolloutStatus.SUCCEEDED


async def test_no_more_than_concurrency_rollouts_run_at_once() -> None:
    store, backend = MemoryStore(), ScriptedBackend(hold=True)
    async with running_runner(store, backend, replace(SETTINGS, concurrency=3)):
        await store.enqueue([spec(f"r{i}") for i in range(7)])
        for _ in range(3):
            await asyncio.wait_for(backend.started.get(), 5)
        with pytest.raises(TimeoutError):  # a fourth does not start while three run
            await asyncio.wait_for(backend.started.get(), 0.2)
        backend.release.set()
        done = await terminal(store, 7)
    assert {r.status for r in done.values()} == {RolloutStatus.SUCCEEDED}
    assert backend.peak == 3


async def test_a_failed_attempt_is_retried_with_a_fresh_attempt_id() -> None:
    store, backend = MemoryStore(), ScriptedBackend([FAIL, FAIL])
    async with running_runner(store, backend):
        await store.enqueue([spec("a", max_attempts=3)])
        done = await terminal(store, 1)
    attempts = await store.attempts("a")
    assert [a.status for a in attempts] == ["failed", "failed", "succeeded"]
    assert len({a.id for a in attempts}) == 3
    assert [launch.attempt.id for launch in backend.launches if launch.attempt] == [a.id for a in attempts]
    assert [launch.env["AGL_ATTEMPT_ID"] for launch in backend.launches] == [a.id for a in attempts]
    assert done["a"].status is RolloutStatus.SUCCEEDED
    assert attempts[0].exit_code == 1
    assert attempts[0].message == FAIL.message


async def test_the_rollout_fails_when_its_attempts_are_used_up() -> None:
    store, backend = MemoryStore(), ScriptedBackend([FAIL, FAIL, FAIL])
    async with running_runner(store, backend):
        await store.enqueue([spec("a", max_attempts=2)])
        done = await terminal(store, 1)
    assert done["a"].status is RolloutStatus.FAILED
    assert done["a"].message == "attempt 2 of 2: failed: agent exited with code 1"
    assert len(await store.attempts("a")) == 2


async def test_the_runners_max_attempts_caps_the_rollouts() -> None:
    store, backend = MemoryStore(), ScriptedBackend([FAIL, FAIL, FAIL])
    async with running_runner(store, backend, replace(SETTINGS, max_attempts=1)):
        await store.enqueue([spec("a", max_attempts=3)])
        assert (await terminal(store, 1))["a"].status is RolloutStatus.FAILED
    assert len(await store.attempts("a")) == 1


async def test_an_outcome_that_cannot_be_retried_fails_the_rollout_at_once() -> None:
    permanent = Outcome(AttemptStatus.FAILED, None, "no agent command", retryable=False)
    store, backend = MemoryStore(), ScriptedBackend([permanent])
    async with running_runner(store, backend):
        await store.enqueue([spec("a", max_attempts=3)])
        assert (await terminal(store, 1))["a"].status is RolloutStatus.FAILED
    assert len(await store.attempts("a")) == 1


async def test_invalid_overrides_fail_the_rollout_with_a_message_and_no_attempt() -> None:
    store, backend = MemoryStore(), ScriptedBackend()
    async with running_runner(store, backend):
        await store.enqueue([spec("a", runner={"command": 5})])
        done = await terminal(store, 1)
    assert done["a"].status is RolloutStatus.FAILED
    assert "config.runner.command" in (done["a"].message or "")
    assert await store.attempts("a") == []
    assert backend.launches == []


async def test_the_agent_env_holds_the_contract_and_the_grader_env_the_grader_key() -> None:
    store, backend = MemoryStore(), ScriptedBackend()
    async with running_runner(store, backend):
        await store.enqueue([spec("a")])
        await terminal(store, 1)
    (launch,) = backend.launches
    assert launch.env["OPENAI_BASE_URL"] == f"http://127.0.0.1:9/r/a/a/{launch.env['AGL_ATTEMPT_ID']}/v1"
    assert launch.env["OPENAI_API_KEY"].startswith("agl-agent.a.")
    assert launch.grader_env["AGL_GRADER_KEY"].startswith("agl-grader.a.")
    assert launch.grader_env["AGL_GRADER_KEY"] not in launch.env.values()
    assert ADMIN_KEY not in launch.env.values()
    assert ADMIN_KEY not in launch.grader_env.values()


async def test_a_backend_owning_retries_is_launched_once_with_an_env_template_and_records_attempts() -> None:
    class PodBackend(ScriptedBackend):
        async def launch(self, launch: Launch) -> Outcome:
            assert self.store is not None
            for uid in ("uid-1", "uid-2"):  # the Job's pods, as the backend sees them
                await self.store.start_attempt(launch.rollout.id, uid)
                await self.store.update_attempt(launch.rollout.id, uid, AttemptStatus.FAILED, exit_code=1)
            await super().launch(launch)
            return Outcome(AttemptStatus.FAILED, message="BackoffLimitExceeded")

    store, backend = MemoryStore(), PodBackend(owns_retries=True)
    async with running_runner(store, backend):
        await store.enqueue([spec("a", max_attempts=2)])
        done = await terminal(store, 1)
    (launch,) = backend.launches
    assert launch.attempt is None
    assert launch.env["AGL_ATTEMPT_ID"] == "$(AGL_ATTEMPT_ID)"
    assert launch.env["OPENAI_BASE_URL"].endswith("/r/a/a/$(AGL_ATTEMPT_ID)/v1")
    assert [a.id for a in await store.attempts("a")] == ["uid-1", "uid-2"]  # none started by the core
    assert (done["a"].status, done["a"].message) == (RolloutStatus.FAILED, "BackoffLimitExceeded")


async def test_a_cancel_stops_the_running_attempt_and_nothing_more_happens() -> None:
    store, backend = MemoryStore(), ScriptedBackend(hold=True)
    async with running_runner(store, backend) as runner:
        await store.enqueue([spec("a", max_attempts=3)])
        await asyncio.wait_for(backend.started.get(), 5)
        await store.cancel("a")
        assert (await asyncio.wait_for(backend.ended.get(), 5)).status is AttemptStatus.CANCELLED
        with pytest.raises(TimeoutError):  # no retry follows
            await asyncio.wait_for(backend.started.get(), 0.2)
        assert runner.in_flight == 0
    assert backend.cancelled == ["a"]
    assert len(backend.launches) == 1
    assert (await store.get_rollout("a")).status is RolloutStatus.CANCELLED
    assert [a.status for a in await store.attempts("a")] == ["cancelled"]


async def test_a_restarted_runner_marks_its_running_attempts_lost_and_retries_them() -> None:
    store = MemoryStore()
    await store.enqueue([spec("mine", max_attempts=2), spec("theirs", max_attempts=2)])
    await store.claim("r1", 1)
    await store.claim("r2", 1)
    before = await store.start_attempt("mine")
    other = await store.start_attempt("theirs")
    backend = ScriptedBackend()
    async with running_runner(store, backend):
        done = await terminal(store, 1)
    assert done["mine"].status is RolloutStatus.SUCCEEDED
    first, second = await store.attempts("mine")
    assert (first.id, first.status) == (before.id, AttemptStatus.LOST)
    assert "restarted" in (first.message or "")
    assert second.status is AttemptStatus.SUCCEEDED
    assert second.id != before.id
    assert (await store.get_rollout("theirs")).status is RolloutStatus.RUNNING  # another runner's
    assert [a.status for a in await store.attempts("theirs")] == [other.status] == [AttemptStatus.RUNNING]
    assert backend.reconciled[0] == ["mine"]


async def test_a_rollout_taken_back_without_attempts_left_fails() -> None:
    store = MemoryStore()
    await store.enqueue([spec("a", max_attempts=1)])
    await store.claim("r1", 1)
    first = await store.start_attempt("a")
    await store.update_attempt("a", first.id, AttemptStatus.FAILED, exit_code=1)  # then the runner died
    async with running_runner(store, ScriptedBackend()):
        done = await terminal(store, 1)
    assert done["a"].status is RolloutStatus.FAILED
    assert "used all 1 attempts" in (done["a"].message or "")
    assert [a.status for a in await store.attempts("a")] == [AttemptStatus.FAILED]


async def test_a_lost_attempt_does_not_use_up_the_last_one() -> None:
    store = MemoryStore()
    await store.enqueue([spec("a", max_attempts=1)])
    await store.claim("r1", 1)
    await store.start_attempt("a")  # running when its runner died: taken back, it becomes lost
    async with running_runner(store, ScriptedBackend()):
        done = await terminal(store, 1)
    assert done["a"].status is RolloutStatus.SUCCEEDED
    assert [a.status for a in await store.attempts("a")] == [AttemptStatus.LOST, AttemptStatus.SUCCEEDED]


async def test_stopping_records_lost_and_the_next_runner_takes_the_rollout_back() -> None:
    store = MemoryStore()
    backend = ScriptedBackend(hold=True)
    async with running_runner(store, backend):
        await store.enqueue([spec("a", max_attempts=2)])
        await asyncio.wait_for(backend.started.get(), 5)
    assert (await store.get_rollout("a")).status is RolloutStatus.RUNNING
    assert [a.status for a in await store.attempts("a")] == [AttemptStatus.LOST]
    async with running_runner(store, ScriptedBackend()):
        assert (await terminal(store, 1))["a"].status is RolloutStatus.SUCCEEDED
    assert [a.status for a in await store.attempts("a")] == ["lost", "succeeded"]


async def test_a_resync_stops_a_drive_whose_rollout_no_longer_runs() -> None:
    class Blind(NoSignal):
        """Completions are never reported, so only the resync can notice."""

        async def completed(
            self, after: int, limit: int = 100, wait: float = 0.0
        ) -> tuple[list[Rollout], int]:
            await asyncio.sleep(wait if limit else 0)
            return [], after

    store, backend = MemoryStore(), ScriptedBackend(hold=True)
    async with running_runner(Blind(store), backend, replace(SETTINGS, poll_s=0.05)) as runner:
        await store.enqueue([spec("a")])
        await asyncio.wait_for(backend.started.get(), 5)
        await store.finish("a", RolloutStatus.FAILED, "given up by the trainer")
        assert backend.cancelled == []
        await runner.resync()
        assert backend.cancelled == ["a"]


async def test_a_backend_that_raises_fails_the_attempt_instead_of_leaving_the_rollout_running() -> None:
    # Issue #15: an exception out of LocalBackend.launch (not an OSError) was a "background task failed" log and
    # the rollout stayed running until the next resync.
    class Broken(ScriptedBackend):
        async def launch(self, launch: Launch) -> Outcome:
            raise RuntimeError("a bug in the backend")

    store, backend = MemoryStore(), Broken()
    async with running_runner(store, backend):
        await store.enqueue([spec("a", max_attempts=3)])
        done = (await terminal(store, 1))["a"]
    assert done.status is RolloutStatus.FAILED
    assert "a bug in the backend" in (done.message or "")
    (attempt,) = await store.attempts("a")
    assert attempt.status is AttemptStatus.FAILED
