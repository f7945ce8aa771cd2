"""The runner core, the same for every backend: claim queued rollouts (woken by enqueues when the store offers a
signal, else polling), at most `concurrency` in flight; drive each one through its attempts, retrying only when the
backend does not own retries; record outcomes; finish rollouts (after grading, which is part of the backend's run).

It follows the completion cursor to learn of cancels, and every `resync_s` it reconciles against the store's
running rollouts: one of its own that nothing drives (a restart, a crash of a drive) is taken back — its running
attempts marked `lost` when the backend does not own retries — and one it drives that is no longer running is
stopped. It never schedules anything the store does not say.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import structlog

from agl_lite.core.contract import ATTEMPT_FROM_POD
from agl_lite.core.tasks import TaskSet
from agl_lite.errors import Conflict, NotFound
from agl_lite.runner.env import ContractEnv
from agl_lite.runner.plan import PlanError, resolve
from agl_lite.runner.seams import Backend, EnqueueSignal, Launch, Outcome, Plan, RunnerSettings, RunnerStore
from agl_lite.store.records import Attempt, AttemptStatus, Rollout, RolloutStatus

__all__ = ["Runner"]

log = structlog.get_logger("agl_lite.runner")

MAX_CLAIM = 1000
"""Most rollouts claimed in one call (the store's batch limit)."""
WATCH_WAIT_S = 25.0
"""Long-poll of the completion cursor (the store API allows up to 60 s)."""
ENDED_MEMORY = 10_000
"""How many rollouts this runner finished are remembered, so a resync read before they finished does not take
them back."""


@dataclass(slots=True, eq=False)
class _Drive:
    """One rollout this runner drives."""

    rollout_id: str
    epoch: int
    """Drives started after a resync read the store are not judged by that read."""
    task: asyncio.Task[None] | None = None
    finishing: bool = False
    """The runner's own verdict is being recorded: its appearance on the completion cursor is no cancel."""
    aborted: bool = False
    """Cancelled or finished elsewhere: record what ended, decide nothing more."""
    concluded: bool = False
    """The rollout is terminal in the store."""
    attempts: list[Attempt] = field(default_factory=list)


class Runner:
    """`await runner.start()` in the addon's `running`; `await runner.stop()` in its `shutdown`."""

    def __init__(
        self, store: RunnerStore, backend: Backend, settings: RunnerSettings, contract: ContractEnv
    ) -> None:
        self.store = store
        self.backend = backend
        self.settings = settings
        self.contract = contract
        self._tasks = TaskSet()
        self._loops = TaskSet()
        self._active: dict[str, _Drive] = {}
        self._ended: dict[str, None] = {}
        self._wake = asyncio.Event()
        self._stopping = False
        self._epoch = 0
        self._cursor = 0

    @property
    def runner_id(self) -> str:
        return self.settings.runner_id

    @property
    def in_flight(self) -> int:
        """Rollouts being driven now."""
        return len(self._active)

    # --- lifecycle -------------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the backend, take back this runner's running rollouts, then claim, watch and resync."""
        await self.backend.open(self.store, self.runner_id)
        # Where the cancel watch starts: every cancel from now on is seen, and the rollouts it may concern are
        # either taken back by the resync below or claimed later.
        _, self._cursor = await self.store.completed(0, 0)
        await self.resync()
        self._loops.spawn(self._claim_loop(), name="runner.claim")
        self._loops.spawn(self._watch_loop(), name="runner.watch")
        self._loops.spawn(self._resync_loop(), name="runner.resync")
        log.info("runner started", runner_id=self.runner_id, taken_back=len(self._active))

    async def stop(self) -> None:
        """Stop claiming; stop what runs (the backend decides what survives: Jobs do); wait for the drives to
        record how their attempts ended, then cancel what is left."""
        self._stopping = True
        self._wake.set()
        await self._loops.close()
        await self.backend.close()
        drives = [d.task for d in self._active.values() if d.task is not None]
        if drives:
            await asyncio.wait(drives, timeout=self.settings.grace_s + 5.0)
        await self._tasks.close()
        log.info("runner stopped", runner_id=self.runner_id)

    # --- claiming --------------------------------------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        signal = self.store if isinstance(self.store, EnqueueSignal) else None
        while not self._stopping:
            # taken before the claim, so an enqueue during the claim still wakes the wait below
            enqueued = signal.enqueued() if signal is not None else None
            self._wake.clear()
            free = self.settings.concurrency - len(self._active)
            if free > 0:
                want = min(free, MAX_CLAIM)
                try:
                    claimed = await self.store.claim(self.runner_id, want)
                except Exception as exc:
                    log.warning("claim failed", runner_id=self.runner_id, error=repr(exc))
                    claimed = []
                    enqueued = None  # retry after poll_s, not on the next enqueue only
                for rollout in claimed:
                    self._drive(rollout, [])
                if len(claimed) == want:
                    continue  # there may be more
            events = [self._wake]
            if enqueued is not None and len(self._active) < self.settings.concurrency:
                events.append(enqueued)
            timeout = self.settings.resync_s if enqueued is not None else self.settings.poll_s
            await _wait_any(events, timeout)

    # --- driving one rollout ---------------------------------------------------------------------------------------

    def _drive(self, rollout: Rollout, attempts: list[Attempt]) -> None:
        self._epoch += 1
        drive = _Drive(rollout.id, self._epoch, attempts=attempts)
        self._active[rollout.id] = drive
        drive.task = self._tasks.spawn(self._run(drive, rollout), name=f"runner.rollout:{rollout.id}")
        drive.task.add_done_callback(lambda _: self._released(drive))

    def _released(self, drive: _Drive) -> None:
        if self._active.get(drive.rollout_id) is drive:
            del self._active[drive.rollout_id]
        if drive.concluded:
            self._ended[drive.rollout_id] = None
            if len(self._ended) > ENDED_MEMORY:
                del self._ended[next(iter(self._ended))]
        self._wake.set()  # a slot is free

    async def _run(self, drive: _Drive, rollout: Rollout) -> None:
        try:
            plan = resolve(self.settings, rollout)
        except PlanError as exc:
            await self._conclude(drive, RolloutStatus.FAILED, f"invalid runner config: {exc}")
            return
        if self.backend.owns_retries:
            await self._run_once(drive, rollout, plan)
        else:
            await self._mark_lost(rollout, drive.attempts)
            await self._run_attempts(drive, rollout, plan)

    async def _run_once(self, drive: _Drive, rollout: Rollout, plan: Plan) -> None:
        """A backend that owns retries runs the whole rollout and records its attempts; the core only judges."""
        env = self.contract.agent(rollout, ATTEMPT_FROM_POD)
        grader_env = self.contract.grader(rollout, ATTEMPT_FROM_POD)
        outcome = await self._launch(Launch(rollout, plan, None, env, grader_env))
        if not (drive.aborted or self._stopping):
            await self._verdict(drive, outcome, outcome.message)

    async def _run_attempts(self, drive: _Drive, rollout: Rollout, plan: Plan) -> None:
        """One attempt after another, each with a fresh id, until one succeeds or none is left."""
        while True:
            try:
                attempt = await self.store.start_attempt(rollout.id)
            except Conflict as exc:  # its attempts are used up, or it no longer runs
                if (await self.store.get_rollout(rollout.id)).status.terminal:
                    drive.concluded = True
                else:
                    await self._conclude(drive, RolloutStatus.FAILED, str(exc))
                return
            env = self.contract.agent(rollout, attempt.id)
            grader_env = self.contract.grader(rollout, attempt.id)
            log.debug("attempt starting", rollout_id=rollout.id, attempt_id=attempt.id, seq=attempt.seq)
            outcome = await self._launch(Launch(rollout, plan, attempt, env, grader_env))
            await self._record(rollout.id, attempt.id, outcome)
            if drive.aborted or self._stopping:
                return
            last = outcome.status is AttemptStatus.SUCCEEDED or not outcome.retryable
            if last or attempt.seq >= plan.max_attempts:
                summary = (outcome.message or "").partition("\n")[0]
                message = f"attempt {attempt.seq} of {plan.max_attempts}: {outcome.status}: {summary}"
                await self._verdict(drive, outcome, message)
                return
            log.info(
                "attempt failed, retrying",
                rollout_id=rollout.id,
                attempt_id=attempt.id,
                status=outcome.status.value,
                seq=attempt.seq,
                max_attempts=plan.max_attempts,
            )

    async def _launch(self, launch: Launch) -> Outcome:
        """The backend's outcome; a failure of the backend itself (a bug, not the agent's doing) fails the attempt
        with what went wrong, instead of leaving the rollout running until the next resync."""
        try:
            return await self.backend.launch(launch)
        except Exception as exc:
            log.error(
                "the backend failed to run an attempt",
                rollout_id=launch.rollout.id,
                error=repr(exc),
                exc_info=exc,
            )
            return Outcome(
                AttemptStatus.FAILED, message=f"the runner's backend failed: {exc!r}", retryable=False
            )

    async def _mark_lost(self, rollout: Rollout, attempts: Sequence[Attempt]) -> None:
        """A rollout taken back: nothing of this runner runs its attempts any more."""
        for attempt in attempts:
            if attempt.status is AttemptStatus.RUNNING:
                message = f"lost: runner {self.runner_id!r} restarted (or its drive failed) while it ran"
                await self._record(rollout.id, attempt.id, Outcome(AttemptStatus.LOST, message=message))

    async def _record(self, rollout_id: str, attempt_id: str, outcome: Outcome) -> None:
        # Conflict/NotFound: ended already — the rollout was cancelled or finished, which ended its attempts.
        with contextlib.suppress(Conflict, NotFound):
            await self.store.update_attempt(
                rollout_id, attempt_id, outcome.status, exit_code=outcome.exit_code, message=outcome.message
            )
        log_at = log.debug if outcome.status is AttemptStatus.SUCCEEDED else log.info
        log_at(
            "attempt ended",
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            status=outcome.status.value,
            exit_code=outcome.exit_code,
        )

    async def _verdict(self, drive: _Drive, outcome: Outcome, message: str | None) -> None:
        ok = outcome.status is AttemptStatus.SUCCEEDED
        await self._conclude(drive, RolloutStatus.SUCCEEDED if ok else RolloutStatus.FAILED, message)

    async def _conclude(self, drive: _Drive, status: RolloutStatus, message: str | None) -> None:
        drive.finishing = True
        try:
            await self.store.finish(drive.rollout_id, status, message)
        except Conflict:
            pass  # terminal already: cancelled meanwhile
        except BaseException:
            drive.finishing = False
            raise
        drive.concluded = True
        log.info("rollout finished", rollout_id=drive.rollout_id, status=status.value)

    async def _abort(self, drive: _Drive, why: str) -> None:
        if drive.aborted or drive.finishing:
            return
        drive.aborted = True
        log.info("stopping a rollout that no longer runs", rollout_id=drive.rollout_id, why=why)
        await self.backend.cancel(drive.rollout_id)

    # --- cancels and reconcile -------------------------------------------------------------------------------------

    async def _watch_loop(self) -> None:
        """Follow the completion cursor: a rollout this runner drives that turns terminal elsewhere is stopped."""
        while not self._stopping:
            try:
                rows, self._cursor = await self.store.completed(self._cursor, MAX_CLAIM, WATCH_WAIT_S)
            except Exception as exc:
                log.warning("completion watch failed", error=repr(exc))
                await _wait_any([self._wake], self.settings.poll_s)
                continue
            for rollout in rows:
                drive = self._active.get(rollout.id)
                if drive is not None:
                    self._tasks.spawn(
                        self._abort(drive, rollout.status.value), name=f"runner.abort:{rollout.id}"
                    )

    async def _resync_loop(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self.settings.resync_s)  # a period, not a synchronisation
            try:
                await self.resync()
            except Exception as exc:
                log.warning("resync failed", error=repr(exc))

    async def resync(self) -> None:
        """One reconcile against the store's running rollouts (at start, then every `resync_s`)."""
        epoch = self._epoch
        running = await self.store.running()
        ours = [(r, a) for r, a in running if r.runner_id == self.runner_id]
        ids = {r.id for r, _ in ours}
        for rollout, attempts in ours:
            if rollout.id not in self._active and rollout.id not in self._ended and not self._stopping:
                log.info("taking back a running rollout", rollout_id=rollout.id, attempts=len(attempts))
                self._drive(rollout, attempts)
        for drive in list(self._active.values()):
            if drive.epoch <= epoch and drive.rollout_id not in ids and not drive.concluded:
                await self._abort(drive, "not running in the store")
        await self.backend.reconcile(ours)


async def _wait_any(events: Sequence[asyncio.Event], timeout: float) -> None:
    """Until one of `events` is set or `timeout` s passed."""
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*waiters, return_exceptions=True)
