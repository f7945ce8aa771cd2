"""The Store: one async interface over every backend, with the rules written once (DESIGN.md §4).

Each operation is a function of a `Repo` (row-level reads and writes) that validates everything before it writes,
so a rejected request changes nothing. A backend only says how such a function runs: the memory backend runs it
inline, SQLite in its writer thread inside a transaction. The store keeps data and enforces transitions; it does
not schedule.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, Protocol, TypeVar

import orjson
import structlog

from agl_lite.core.routes import ID_PATTERN
from agl_lite.core.services import ServiceKey
from agl_lite.errors import BadRequest, Conflict, Forbidden, NotFound, PayloadTooLarge, QuotaExceeded
from agl_lite.store.records import (
    ATTEMPT_NEXT,
    LABEL_KEY,
    RESPONSE_ID_PREFIX,
    ROLLOUT_NEXT,
    Attempt,
    AttemptStatus,
    Event,
    LLMCall,
    ModelRecord,
    Resource,
    Rollout,
    RolloutConfig,
    RolloutStatus,
    label_problem,
)

__all__ = ["STORE", "EventSpec", "Repo", "RolloutFilter", "RolloutSpec", "Serial", "Store", "within_bytes"]

T = TypeVar("T")
R = TypeVar("R")

REWARD_KIND = "reward"
log = structlog.get_logger("agl_lite.store")

LLM_CALL_KIND = "llm_call"


@dataclass(slots=True)
class RolloutSpec:
    """A rollout to enqueue; `id` makes the create idempotent (the same id again returns the existing rollout)."""

    input: Any
    mode: str = "train"
    config: RolloutConfig = field(default_factory=RolloutConfig)
    metadata: dict[str, Any] = field(default_factory=dict)
    group_id: str | None = None
    resources_version: int | None = None
    id: str | None = None


@dataclass(slots=True)
class EventSpec:
    kind: str
    data: Any = None
    attempt_id: str | None = None


@dataclass(slots=True, frozen=True)
class Serial(Generic[R]):
    """An operation that gateways sharing one store must run one at a time, under the lock `key`: those that read a
    counter of all rollouts and write the next value (enqueue positions, the completion cursor) or take the head
    of the queue (claims). A backend with one writer runs every operation one at a time already and calls it as
    it is; one shared by several processes (PostgreSQL) takes the lock before the transaction begins, so that
    replicas queue for it rather than conflict and run again."""

    fn: Callable[[Repo], R]
    key: str = "rollouts"

    def __call__(self, repo: Repo) -> R:
        return self.fn(repo)


@dataclass(slots=True, frozen=True)
class RolloutFilter:
    status: RolloutStatus | None = None
    mode: str | None = None
    group_id: str | None = None
    after: int = 0
    """Keyset pagination: only rollouts enqueued after this `enqueue_seq`."""
    limit: int = 100
    reward_min: float | None = None
    """Only rollouts with a reward, at least this one (`reward_max`: at most that one)."""
    reward_max: float | None = None
    model_version: str | None = None
    """Only rollouts with at least one captured call that this model version served."""
    created_after: float | None = None
    """Only rollouts enqueued at or after this time (epoch seconds; `created_before`: strictly before that one)."""
    created_before: float | None = None


class Repo(Protocol):
    """Row-level access inside one transaction; implemented by each backend. Returned records are copies."""

    def get_rollout(self, rollout_id: str) -> Rollout | None: ...
    def rollout_state(self, rollout_id: str) -> RolloutStatus | None: ...
    def put_rollout(self, rollout: Rollout, *, new: bool) -> None: ...
    def list_rollouts(self, flt: RolloutFilter) -> list[Rollout]: ...
    def queued(self, limit: int) -> list[Rollout]: ...
    def running(self) -> list[Rollout]: ...
    def last_enqueue_seq(self) -> int: ...
    def last_created_at(self) -> float: ...
    def last_completion_seq(self) -> int: ...
    def completed_after(self, after: int, limit: int) -> list[Rollout]: ...
    def get_attempt(self, rollout_id: str, attempt_id: str) -> Attempt | None: ...
    def attempts(self, rollout_id: str) -> list[Attempt]: ...
    def put_attempt(self, attempt: Attempt, *, new: bool) -> None: ...
    def last_event_seq(self, rollout_id: str) -> int: ...
    def add_event(self, event: Event) -> int: ...
    def events(
        self, rollout_id: str, kind: str | None, after_seq: int, limit: int, max_bytes: int | None = None
    ) -> list[Event]: ...
    def add_call(self, call: LLMCall, event: Event | None = None) -> int:
        """Store a call and (attributed, not late) its `llm_call` event: a backend may keep both in one row, and
        `events` then reads that event in its place in the rollout's sequence."""
        ...

    def rollout_tokens(self, rollout_id: str) -> int: ...
    def rollout_bytes(self, rollout_id: str) -> int: ...
    def response_call(self, response_id: str) -> LLMCall | None:
        """The call whose id is `response_id` (which starts with `RESPONSE_ID_PREFIX`)."""
        ...

    def delete_response(self, call_id: str, at: float) -> bool: ...
    def response_deleted(self, call_id: str) -> bool: ...
    def calls(
        self,
        rollout_id: str | None,
        attempt_id: str | None,
        after_order_key: int,
        limit: int,
        max_bytes: int | None = None,
        label: tuple[str, str] | None = None,
    ) -> list[LLMCall]: ...
    def last_resource_version(self, name: str) -> int: ...
    def put_resource(self, resource: Resource) -> None: ...
    def get_resource(self, name: str, version: int | None) -> Resource | None: ...
    def latest_resources(self) -> list[Resource]: ...
    def resource_versions(self, name: str, after: int, limit: int) -> list[Resource]: ...
    def put_model(self, model: ModelRecord) -> None: ...
    def delete_model(self, name: str) -> ModelRecord | None: ...
    def models(self) -> list[ModelRecord]: ...


STORE: ServiceKey[Store] = ServiceKey("store")
"""The service under which the `store` addon provides the store to the other addons."""


RESERVED_IDS = {"rollout": frozenset({"completed"}), "resource": frozenset({"latest"})}
"""Names the API's own routes take (`/api/rollouts/completed`, `/api/resources/latest`): a rollout or resource so
named could never be read back."""


def within_bytes(rows: Iterable[R], max_bytes: int | None, size: Callable[[R], int]) -> list[R]:
    """The rows, in order, while their sizes add up to at most `max_bytes` (the first one always, so that a page
    moves on); every row when `max_bytes` is None. What bounds a page of events or calls, in every backend."""
    if max_bytes is None:
        return list(rows)
    out: list[R] = []
    used = 0
    for row in rows:
        used += size(row)
        if out and used > max_bytes:
            break
        out.append(row)
    return out


def _check_id(kind: str, value: str) -> str:
    if not ID_PATTERN.fullmatch(value):
        raise BadRequest(f"invalid {kind} id {value!r}: use 1-128 of A-Z a-z 0-9 _ -")
    if value in RESERVED_IDS.get(kind, ()):
        raise BadRequest(f"{kind} id {value!r} is reserved: the API's own route takes that name")
    return value


_KEPT = 100_000
"""Rollout states, attempts seen and attempt ends the agent gate's caches hold before they are dropped whole."""


class Store:
    """The async store every addon, runner and client uses. Subclasses provide `_write`, `_read` and `close`.

    It also caches what the gateway asks on every agent call (a rollout's status, the attempts it has seen), kept
    exact by updating it from this store's own writes: one gateway process owns its store.
    """

    max_batch = 1000
    """Largest number of rollouts or events in one call."""
    max_rollout_bytes: int | None = None
    """Bytes a rollout's events and captured calls may take (`[addons.store] max_rollout_bytes`); past it agents
    can neither post events nor start LLM calls (507 `quota_exceeded`); None: no quota."""
    max_event_bytes = 4 * 1024 * 1024
    """Largest event `data`, encoded (`[addons.store] max_event_bytes`); larger is a 413."""
    shared = False
    """Whether other gateways share this store (PostgreSQL): then a pause and its drain go through it."""
    max_cached_rollouts = 100_000
    """Rollouts whose token totals are kept in memory (the oldest are read again when needed)."""

    def __init__(self) -> None:
        self._completed = asyncio.Event()  # replaced after each set: waiters hold the one they saw
        # likewise, for runners in this process (claim on enqueue, not polling)
        self._enqueued = asyncio.Event()
        self.completion_waiters = 0
        """Long-polls now waiting for a completion (metrics, and tests that must know one is waiting)."""
        # What the agent gate asks on every call, kept: rollout states (`_know`) and attempts seen running. A read or
        # a write's note that began before something made them untrustworthy must not keep what it brings:
        # `_forgot` counts the times they were dropped whole (a catch-up after lost notifications, the size bound),
        # `_attempt_ends` holds the `_era` (a count of attempt ends) at which each attempt's end was last heard.
        self._status: dict[str, RolloutStatus] = {}
        self._seen_attempts: set[tuple[str, str]] = set()
        self._forgot = 0
        self._era = 0
        self._attempt_ends: dict[tuple[str, str], int] = {}
        self._model_listeners: list[Callable[[ModelRecord], None]] = []
        self._model_removed: list[Callable[[ModelRecord], None]] = []
        self._ended_listeners: list[Callable[[str], None]] = []
        self._tokens: dict[str, int] = {}  # tokens per rollout, read once, then kept up to date by `add_call`
        self._tokens_reads: dict[str, asyncio.Future[int]] = {}  # first reads in progress, shared
        self._bytes: dict[str, int] = {}  # likewise: bytes stored per rollout
        self._bytes_reads: dict[str, asyncio.Future[int]] = {}

    def _check_limit(self, limit: int, least: int) -> None:
        if not least <= limit <= self.max_batch:
            raise BadRequest(f"limit must be between {least} and {self.max_batch}")

    def _check_batch(self, specs: Sequence[object], what: str) -> None:
        if not specs:
            raise BadRequest(f"no {what} given")
        if len(specs) > self.max_batch:
            raise BadRequest(f"at most {self.max_batch} {what} per request")

    # --- what a backend provides ---------------------------------------------------------------------------------

    async def _write(self, fn: Callable[[Repo], T]) -> T:
        """Run `fn` as one transaction; its result is returned only once it is durable."""
        raise NotImplementedError

    async def _read(self, fn: Callable[[Repo], T]) -> T:
        raise NotImplementedError

    async def close(self) -> None:
        """Flush and release the backend."""

    # --- rollouts ------------------------------------------------------------------------------------------------

    async def enqueue(self, specs: Sequence[RolloutSpec]) -> list[Rollout]:
        """Create rollouts (queuing); a spec whose id exists returns the existing rollout unchanged."""
        self._check_batch(specs, "rollouts")
        ids = [
            _check_id("rollout", s.id) if s.id is not None else f"ro-{uuid.uuid4().hex[:16]}" for s in specs
        ]
        for spec in specs:
            if spec.config.max_attempts < 1:
                raise BadRequest("config.max_attempts must be at least 1")
            if spec.config.timeout_s is not None and spec.config.timeout_s <= 0:
                raise BadRequest("config.timeout_s must be positive")

        def op(repo: Repo) -> list[Rollout]:
            # Never before the last one: a clock set back must not put creation times out of enqueue order (the
            # list's time filter relies on it).
            now = max(time.time(), repo.last_created_at())
            seq = repo.last_enqueue_seq()
            out: list[Rollout] = []
            created: dict[str, Rollout] = {}
            for rid, spec in zip(ids, specs, strict=True):
                existing = created.get(rid) or repo.get_rollout(rid)
                if existing is not None:
                    out.append(existing)
                    continue
                seq += 1
                rollout = Rollout(
                    id=rid,
                    input=spec.input,
                    mode=spec.mode,
                    config=spec.config,
                    metadata=spec.metadata,
                    group_id=spec.group_id,
                    resources_version=spec.resources_version,
                    created_at=now,
                    enqueue_seq=seq,
                )
                repo.put_rollout(rollout, new=True)
                created[rid] = rollout
                out.append(rollout)
            return out

        result: list[Rollout] = await self._write(Serial(op))
        self._notify_enqueued()
        return result

    def _notify_enqueued(self) -> None:
        self._enqueued.set()
        self._enqueued = asyncio.Event()

    def enqueued(self) -> asyncio.Event:
        """An event the next enqueue sets: a runner takes it before claiming and waits on it, missing none."""
        return self._enqueued

    async def get_rollout(self, rollout_id: str) -> Rollout:
        return await self._read(lambda repo: _rollout(repo, rollout_id))

    async def list_rollouts(self, flt: RolloutFilter = RolloutFilter()) -> list[Rollout]:
        self._check_limit(flt.limit, 1)
        bounds = (flt.reward_min, flt.reward_max, flt.created_after, flt.created_before)
        if any(b is not None and not math.isfinite(b) for b in bounds):
            raise BadRequest("reward and time bounds must be finite numbers")
        _text(mode=flt.mode, group_id=flt.group_id, model_version=flt.model_version)
        return await self._read(lambda repo: repo.list_rollouts(flt))

    async def cancel(self, rollout_id: str, message: str | None = None) -> Rollout:
        """Cancel a queuing or running rollout (its running attempts become cancelled); 409 if terminal."""
        return await self._end(rollout_id, RolloutStatus.CANCELLED, message)

    async def finish(self, rollout_id: str, status: RolloutStatus, message: str | None = None) -> Rollout:
        """The runner's verdict: a running rollout turns succeeded or failed (and joins the completion cursor)."""
        if status not in (RolloutStatus.SUCCEEDED, RolloutStatus.FAILED):
            raise BadRequest("a rollout finishes as 'succeeded' or 'failed' (use cancel to cancel)")
        return await self._end(rollout_id, status, message)

    async def _end(self, rollout_id: str, status: RolloutStatus, message: str | None) -> Rollout:
        return await self._then_note(
            Serial(lambda repo: self._transition(repo, rollout_id, status, message)),
            lambda result: self._ended(rollout_id, result.status),
        )

    async def _then_note(self, fn: Callable[[Repo], T], note: Callable[[T], object]) -> T:
        """`_write(fn)`, then `note(result)` even when the caller stopped waiting (its client left): the write
        commits anyway, and what this store keeps of it (status, totals, the rollout-ended listeners) must not
        miss it. The backend runs the note as the write settles, in commit order, before any caller resumes (no
        task or shield per write: this is every LLM call's path)."""
        fut = self._submit(fn, note)
        if fut is None:  # a backend whose write does not suspend: nothing can come between it and the note
            result = await self._write(fn)
            note(result)
            return result
        return await fut

    def _submit(self, fn: Callable[[Repo], T], note: Callable[[T], object]) -> asyncio.Future[T] | None:
        """A backend whose writes wait for a commit queues `fn`, to run `note(result)` when it commits (even when
        nobody awaits the future any more), and returns its future; None: the backend uses `_write` only."""
        return None

    # --- the gateways sharing this store -------------------------------------------------------------------------
    # One process owns a SQLite or memory store: these say so and cost nothing. A store that several gateways share
    # (PostgreSQL) carries a pause to all of them, and tells each how far the others drained.

    async def share_pause(self, pause: dict[str, Any] | None) -> dict[str, Any] | None:
        """Make `pause` (None: resumed) that of every gateway on this store (`on_pause` tells the others); the
        shared state it made, `{"version": n, "pause": pause}` (n counts the changes, in commit order), or None
        where no other gateway shares the store."""
        return None

    async def shared_pause(self) -> dict[str, Any] | None:
        """The shared pause state in force (a gateway that starts during a pause starts paused); None where no
        other gateway shares the store."""
        return None

    def on_pause(self, listener: Callable[[dict[str, Any]], None]) -> None:
        """Call `listener` with each shared pause state another gateway on this store made (they may arrive out of
        their order: the version says which is the latest)."""

    async def report_drain(self, pause_id: str, in_flight: int) -> None:
        """This gateway holds the pause `pause_id` with `in_flight` LLM calls still in flight."""

    async def others_drained(self, pause_id: str) -> bool:
        """Whether every other live gateway on this store holds the pause `pause_id` with no LLM call in flight."""
        return True

    def on_rollout_ended(self, listener: Callable[[str], None]) -> None:
        """Call `listener(rollout_id)` once a rollout turned terminal through this store (the gateway then cuts
        the calls it still has in flight)."""
        self._ended_listeners.append(listener)

    def _ended(self, rollout_id: str, status: RolloutStatus) -> None:
        self._know(rollout_id, status)
        self._notify_completion()
        for listener in self._ended_listeners:
            listener(rollout_id)

    @staticmethod
    def _transition(repo: Repo, rollout_id: str, status: RolloutStatus, message: str | None) -> Rollout:
        rollout = _rollout(repo, rollout_id)
        if status not in ROLLOUT_NEXT[rollout.status]:
            raise Conflict(
                f"rollout {rollout_id!r} is {rollout.status.value}; it cannot become {status.value}"
            )
        now = time.time()
        for attempt in repo.attempts(rollout_id):
            if attempt.status is AttemptStatus.RUNNING:
                final = AttemptStatus.CANCELLED if status is RolloutStatus.CANCELLED else AttemptStatus.LOST
                repo.put_attempt(replace(attempt, status=final, ended_at=now), new=False)
        rollout.status = status
        rollout.ended_at = now
        rollout.message = message
        rollout.completion_seq = repo.last_completion_seq() + 1
        repo.put_rollout(rollout, new=False)
        return rollout

    async def claim(self, runner_id: str, limit: int) -> list[Rollout]:
        """Move up to `limit` queued rollouts (oldest first) to running, owned by `runner_id`."""
        self._check_limit(limit, 1)

        def op(repo: Repo) -> list[Rollout]:
            now = time.time()
            out = []
            for rollout in repo.queued(limit):
                rollout.status = RolloutStatus.RUNNING
                rollout.started_at = now
                rollout.runner_id = runner_id
                repo.put_rollout(rollout, new=False)
                out.append(rollout)
            return out

        def keep(claimed: list[Rollout]) -> None:
            # In commit order, as the ends' notes are: an end committed after the claim (even in the same batch)
            # always has the last word, whatever was forgotten in between.
            for rollout in claimed:
                self._know(rollout.id, rollout.status)

        return await self._then_note(Serial(op), keep)

    async def running(self) -> list[tuple[Rollout, list[Attempt]]]:
        """Every running rollout with its attempts: what a runner reconciles against."""
        return await self._read(lambda repo: [(r, repo.attempts(r.id)) for r in repo.running()])

    async def completed(self, after: int, limit: int = 100, wait: float = 0.0) -> tuple[list[Rollout], int]:
        """Terminal rollouts past the cursor `after` and the next cursor; waits up to `wait` s for one to appear.
        `limit=0` returns no rollouts and the head of the cursor, where a follower of new completions starts."""
        self._check_limit(limit, 0)
        if after < 0 or wait < 0:
            raise BadRequest("after and wait must not be negative")
        if limit == 0:
            return [], await self._read(lambda repo: repo.last_completion_seq())
        deadline = asyncio.get_running_loop().time() + wait
        while True:
            changed = self._completed
            rows = await self._read(lambda repo: repo.completed_after(after, limit))
            remaining = deadline - asyncio.get_running_loop().time()
            if rows or remaining <= 0:
                cursor = rows[-1].completion_seq if rows else after
                return rows, cursor or after
            self.completion_waiters += 1
            try:
                await asyncio.wait_for(changed.wait(), remaining)
            except TimeoutError:
                pass
            finally:
                self.completion_waiters -= 1

    async def completed_until(
        self, stop: asyncio.Event, after: int, limit: int, wait: float
    ) -> tuple[list[Rollout], int]:
        """`completed`, cut short when `stop` is set: an empty page at the same cursor. A stopping gateway answers
        its HTTP long polls at once this way, so that they do not hold its shutdown for their whole wait."""
        poll = asyncio.ensure_future(self.completed(after, limit, wait))
        stopped = asyncio.ensure_future(stop.wait())
        try:
            done, _ = await asyncio.wait((poll, stopped), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            if not poll.done():  # (stopped, or this caller cancelled)
                poll.cancel()
        return poll.result() if poll in done else ([], after)

    def _notify_completion(self) -> None:
        self._completed.set()
        self._completed = asyncio.Event()

    async def rollout_status(self, rollout_id: str) -> RolloutStatus | None:
        """A rollout's status, from the cache when this store has seen it (None: no such rollout)."""
        status = self._status.get(rollout_id)
        if status is None:
            forgot = self._forgot
            rollout = await self._read(lambda repo: repo.get_rollout(rollout_id))
            if rollout is None:
                return None
            status = rollout.status
            # Kept only once it can change no more unannounced: a start through another replica (a claim) is not
            # announced, an end is (`_ended`). A queued state kept would refuse the rollout's agents here for good.
            # Nor kept when the states were dropped meanwhile: an end heard before that would be lost again.
            if status is not RolloutStatus.QUEUING and self._forgot == forgot:
                status = self._know(rollout_id, status)
        return status

    def known_status(self, rollout_id: str) -> RolloutStatus | None:
        """The rollout's state as this store knows it now, without reading (None: not known here)."""
        return self._status.get(rollout_id)

    def _know(self, rollout_id: str, status: RolloutStatus) -> RolloutStatus:
        """Keep `status` unless this store knows a later one, and return what it keeps. A read resumes after its
        snapshot was taken: the rollout may have ended meanwhile (`_ended`), and a running state read before the
        end must not take the end's place (the key would work for good)."""
        known = self._status.get(rollout_id)
        if known is None or status in ROLLOUT_NEXT[known]:
            if known is None and len(self._status) >= _KEPT:
                self._forget()  # a cache: the store stays the truth
            self._status[rollout_id] = known = status
        return known

    def _forget(self) -> None:
        """Drop every kept state; reads and notes in flight then keep nothing of what they bring."""
        self._status.clear()
        self._seen_attempts.clear()
        self._attempt_ends.clear()
        self._forgot += 1

    def _attempt_ended(self, rollout_id: str, attempt_id: str) -> None:
        """An attempt ended (here, or heard from another replica): its key goes back to asking the store, and a gate
        whose read began before does not put it back (on PostgreSQL a read-only transaction that commits after the
        end can still be ordered before it)."""
        pair = (rollout_id, attempt_id)
        self._seen_attempts.discard(pair)
        self._era += 1
        if len(self._attempt_ends) >= _KEPT:
            self._forget()
        self._attempt_ends[pair] = self._era

    async def agent_gate(self, rollout_id: str, attempt_id: str) -> None:
        """What an agent key needs on every call: its rollout is running, and its attempt exists or can be
        upserted now (first sight of a pod UID) within the rollout's attempt cap. Forbidden or Conflict otherwise.
        Once it passed, `known_status` holds the rollout's state, and its end if that was heard meanwhile.
        """
        status = await self.rollout_status(rollout_id)
        if status is None:
            raise Forbidden(f"rollout {rollout_id!r} does not exist")
        if status is not RolloutStatus.RUNNING:
            raise Forbidden(
                f"rollout {rollout_id!r} is {status.value}: its agent key works only while it runs"
            )
        if (rollout_id, attempt_id) not in self._seen_attempts:
            pair = (rollout_id, attempt_id)
            era, forgot = self._era, self._forgot

            def seen(attempt: Attempt) -> None:
                # As the write commits, in commit order: an `update_attempt` that ends this attempt and commits
                # after it takes the pair out again, whenever this caller resumes. An end heard since the gate
                # began (another replica's, whose commit this read may be ordered before) keeps it out.
                if (
                    attempt.status is AttemptStatus.RUNNING
                    and self._forgot == forgot
                    and self._attempt_ends.get(pair, 0) <= era
                ):
                    if len(self._seen_attempts) >= _KEPT:
                        self._forget()
                        return
                    self._seen_attempts.add(pair)

            attempt = await self._then_note(self._start_attempt_op(rollout_id, attempt_id), seen)
            if attempt.status is not AttemptStatus.RUNNING:
                raise Forbidden(f"attempt {attempt_id!r} is {attempt.status.value}")
            if self._forgot != forgot:
                # The states were dropped while the write waited: an end whose note ran meanwhile went with them,
                # and the caller (auth's `_admit`) trusts what this store knows once the gate passed. Asked again.
                await self.agent_gate(rollout_id, attempt_id)

    # --- attempts ------------------------------------------------------------------------------------------------

    async def start_attempt(self, rollout_id: str, attempt_id: str | None = None) -> Attempt:
        """A new attempt of a running rollout, within its cap; an id seen before returns that attempt."""
        return await self._write(self._start_attempt_op(rollout_id, attempt_id))

    def _start_attempt_op(self, rollout_id: str, attempt_id: str | None) -> Callable[[Repo], Attempt]:
        aid = _check_id("attempt", attempt_id) if attempt_id is not None else uuid.uuid4().hex

        def op(repo: Repo) -> Attempt:
            rollout = _rollout(repo, rollout_id)
            existing = repo.get_attempt(rollout_id, aid)
            if existing is not None:
                return existing
            if rollout.status is not RolloutStatus.RUNNING:
                raise Conflict(
                    f"rollout {rollout_id!r} is {rollout.status.value}; attempts start only while running"
                )
            if rollout.attempt_count >= rollout.config.max_attempts:
                # `lost` attempts (an evicted pod, a runner restart) are the infrastructure's failures, not the
                # agent's: they do not use up the rollout's attempts (Kubernetes ignores disruptions alike).
                lost = sum(1 for a in repo.attempts(rollout_id) if a.status is AttemptStatus.LOST)
                if rollout.attempt_count - lost >= rollout.config.max_attempts:
                    raise Conflict(
                        f"rollout {rollout_id!r} has used all {rollout.config.max_attempts} attempts"
                    )
            now = time.time()
            rollout.attempt_count += 1
            timeout = rollout.config.timeout_s
            attempt = Attempt(
                id=aid,
                rollout_id=rollout_id,
                seq=rollout.attempt_count,
                started_at=now,
                deadline=now + timeout if timeout else None,
            )
            repo.put_attempt(attempt, new=True)
            repo.put_rollout(rollout, new=False)
            return attempt

        return op

    async def update_attempt(
        self,
        rollout_id: str,
        attempt_id: str,
        status: AttemptStatus,
        *,
        exit_code: int | None = None,
        message: str | None = None,
    ) -> Attempt:
        def op(repo: Repo) -> Attempt:
            attempt = repo.get_attempt(rollout_id, attempt_id)
            if attempt is None:
                raise NotFound(f"attempt {attempt_id!r} of rollout {rollout_id!r} not found")
            if status not in ATTEMPT_NEXT[attempt.status]:
                raise Conflict(
                    f"attempt {attempt_id!r} is {attempt.status.value}; it cannot become {status.value}"
                )
            attempt.status = status
            attempt.exit_code = exit_code
            attempt.message = message
            attempt.ended_at = time.time()
            repo.put_attempt(attempt, new=False)
            return attempt

        # Out of the cache at once (a call from now on asks the store) and again as the write commits: a gate that
        # saw the attempt running in a write committed before this one must not put it back afterwards.
        self._attempt_ended(rollout_id, attempt_id)
        return await self._then_note(op, lambda _: self._attempt_ended(rollout_id, attempt_id))

    async def attempts(self, rollout_id: str) -> list[Attempt]:
        await self.get_rollout(rollout_id)
        return await self._read(lambda repo: repo.attempts(rollout_id))

    # --- events --------------------------------------------------------------------------------------------------

    async def add_events(
        self, rollout_id: str, specs: Sequence[EventSpec], *, source: str = "admin"
    ) -> list[Event]:
        """Append events. A `reward` event (numeric `data` or `{"value": n}`) that names no step sets the rollout's
        reward when its source counts for it (`rollout_reward`); one naming a step (`response_id`) rewards that
        step only. An agent's or grader's events are taken only while the rollout runs: their keys are checked
        when a request's headers arrive, and its body can come long after."""
        self._check_batch(specs, "events")
        rewards = [(_reward_value(s), _names_step(s)) for s in specs if s.kind == REWARD_KIND]
        for spec in specs:
            size = len(orjson.dumps(spec.data))
            if size > self.max_event_bytes:
                raise PayloadTooLarge(
                    f"an event's data is {size} bytes encoded; at most {self.max_event_bytes}"
                )
        if source == "agent":
            await self.check_quota(rollout_id)

        def op(repo: Repo) -> tuple[list[Event], int]:
            rollout = _rollout(repo, rollout_id)
            if source in ("agent", "grader") and rollout.status.terminal:
                raise Forbidden(
                    f"rollout {rollout_id!r} is {rollout.status.value}: its {source} key works only while it runs"
                )
            now = time.time()
            seq = repo.last_event_seq(rollout_id)
            out = []
            written = 0
            for spec in specs:
                seq += 1
                event = Event(rollout_id, seq, spec.kind, spec.data, spec.attempt_id, source, now)
                written += repo.add_event(event)
                out.append(event)
            outcome = [value for value, step in rewards if not step]
            if outcome and rollout_reward(source, rollout):
                rollout.reward = outcome[-1]
                repo.put_rollout(rollout, new=False)
            return out, written

        # One rollout's events at a time across gateways: each reads the last number and writes the next.
        serial = Serial(op, f"rollout/{rollout_id}")
        events, _ = await self._then_note(serial, lambda result: self._stored(rollout_id, result[1]))
        return events

    async def check_quota(self, rollout_id: str) -> None:
        """QuotaExceeded (507) when the rollout's stored bytes reached `max_rollout_bytes`."""
        quota = self.max_rollout_bytes
        if quota is not None and await self.rollout_bytes(rollout_id) >= quota:
            raise QuotaExceeded(f"rollout {rollout_id!r} has used its storage quota of {quota} bytes")

    async def rollout_bytes(self, rollout_id: str) -> int:
        """Bytes the rollout's events and calls take in the store (read once, then kept by this store's writes)."""
        return await self._counted(self._bytes, self._bytes_reads, rollout_id, "rollout_bytes")

    def _stored(self, rollout_id: str | None, written: int) -> None:
        if rollout_id is not None and rollout_id in self._bytes:
            self._bytes[rollout_id] += written

    async def events(
        self,
        rollout_id: str,
        kind: str | None = None,
        after_seq: int = 0,
        limit: int = 1000,
        *,
        max_bytes: int | None = None,
    ) -> list[Event]:
        """Events after `after_seq`: at most `limit`, and (`max_bytes`) no more than that many stored bytes but at
        least one, so that a page of large events never has to be held whole."""
        _text(kind=kind)
        await self.get_rollout(rollout_id)
        return await self._read(lambda repo: repo.events(rollout_id, kind, after_seq, limit, max_bytes))

    # --- captured calls ------------------------------------------------------------------------------------------

    async def add_call(self, call: LLMCall) -> None:
        """Commit a captured LLM call; an attributed one also gets an `llm_call` event in its rollout's sequence."""
        if call.labels and (problem := label_problem(call.labels)) is not None:
            # Labels come from addons: a bug in one must not cost the call its record. Stored without, and said.
            log.error(
                "labels of a captured call dropped", call=call.id, rollout=call.rollout_id, problem=problem
            )
            call.labels = {}

        def op(repo: Repo) -> int:
            rid = call.rollout_id
            # (no decode of the rollout: per call)
            status = repo.rollout_state(rid) if rid is not None else None
            # A call still in flight when its rollout ended: its record is kept, out of the finished trajectory.
            call.late = status is not None and status.terminal
            event = None
            if rid is not None and status is not None and not call.late:
                summary = {
                    "call_id": call.id,
                    "outcome": call.outcome.value,
                    "response_id": call.response_id,
                    "model": call.model,
                    "order_key": call.order_key,
                }
                event = Event(
                    rid,
                    repo.last_event_seq(rid) + 1,
                    LLM_CALL_KIND,
                    summary,
                    call.attempt_id,
                    "gateway",
                    call.t_end or time.time(),
                )
            return repo.add_call(call, event)

        def note(written: int) -> None:
            self._stored(call.rollout_id, written)
            if call.rollout_id is not None and call.rollout_id in self._tokens:
                self._tokens[call.rollout_id] += sum(call.tokens())

        await self._then_note(op, note)

    async def tokens_used(self, rollout_id: str) -> int:
        """Tokens the rollout's calls used so far: one indexed read the first time (shared by concurrent callers),
        then kept up to date by this store's own writes, so that no call pays for a rollout's history."""
        return await self._counted(self._tokens, self._tokens_reads, rollout_id, "rollout_tokens")

    async def _counted(
        self, known: dict[str, int], reads: dict[str, asyncio.Future[int]], rollout_id: str, what: str
    ) -> int:
        """A per-rollout total kept in `known`: read once (shared by concurrent callers), then kept by the writes."""
        value = known.get(rollout_id)
        if value is not None:
            return value
        pending = reads.get(rollout_id)
        if pending is None:
            pending = reads[rollout_id] = asyncio.ensure_future(
                self._read_total(known, reads, rollout_id, what)
            )
        return await asyncio.shield(pending)

    async def _read_total(
        self, known: dict[str, int], reads: dict[str, asyncio.Future[int]], rollout_id: str, what: str
    ) -> int:
        def keep(total: int) -> None:
            if len(known) >= self.max_cached_rollouts:
                known.pop(next(iter(known)))
            known[rollout_id] = total

        try:
            # On the writer, and kept as it settles, in commit order: a write committed before is in `total`, one
            # committed after finds the total known when its own note runs and adds itself, so none is counted
            # twice or missed.
            total: int = await self._then_note(lambda repo: getattr(repo, what)(rollout_id), keep)
            return total
        finally:
            reads.pop(rollout_id, None)

    async def calls(
        self,
        rollout_id: str | None,
        attempt_id: str | None = None,
        after_order_key: int = -1,
        limit: int = 1000,
        *,
        max_bytes: int | None = None,
        label: tuple[str, str] | None = None,
    ) -> list[LLMCall]:
        """Captured calls in request order (`rollout_id=None`: the unattributed admin calls); `max_bytes` bounds a
        page as for `events`; `label=(key, value)` keeps the calls whose label `key` is `value`."""
        if label is not None and not LABEL_KEY.fullmatch(label[0]):
            raise BadRequest(f"invalid label key {label[0]!r}: use 1-64 of A-Z a-z 0-9 _ . -")
        _text(attempt_id=attempt_id, label=label[1] if label is not None else None)
        return await self._read(
            lambda repo: repo.calls(rollout_id, attempt_id, after_order_key, limit, max_bytes, label)
        )

    async def response_call(self, response_id: str) -> LLMCall:
        """A Responses API call by its response id (`resp_…`, the id it is stored under); NotFound when none."""
        found = None
        if response_id.startswith(RESPONSE_ID_PREFIX) and "\x00" not in response_id:  # (no text holds NUL)
            found = await self._read(lambda repo: repo.response_call(response_id))
        if found is None:
            raise NotFound(f"no captured call {response_id!r}")
        return found

    async def delete_response(self, call_id: str) -> bool:
        """Take a Responses API call's response back from its client (`DELETE /v1/responses/{id}`): it is no longer
        served back; the call stays, its rollout's training data. False when it was deleted already."""
        _text(response_id=call_id)
        return await self._write(lambda repo: repo.delete_response(call_id, time.time()))

    async def response_deleted(self, call_id: str) -> bool:
        _text(response_id=call_id)
        return await self._read(lambda repo: repo.response_deleted(call_id))

    # --- resources and models ------------------------------------------------------------------------------------

    async def put_resource(self, name: str, value: Any) -> Resource:
        _check_id("resource", name)

        def op(repo: Repo) -> Resource:
            resource = Resource(name, repo.last_resource_version(name) + 1, value, time.time())
            repo.put_resource(resource)
            return resource

        return await self._write(op)

    async def get_resource(self, name: str, version: int | None = None) -> Resource:
        resource = await self._read(lambda repo: repo.get_resource(name, version))
        if resource is None:
            raise NotFound(f"resource {name!r}" + (f" version {version}" if version else "") + " not found")
        return resource

    async def latest_resources(self) -> list[Resource]:
        return await self._read(lambda repo: repo.latest_resources())

    async def resource_versions(self, name: str, after: int = 0, limit: int = 1000) -> list[Resource]:
        """A resource's versions after `after`, oldest first, at most `limit` (a trainer's metrics per iteration:
        the dashboard's training page)."""
        self._check_limit(limit, 1)
        return await self._read(lambda repo: repo.resource_versions(name, after, limit))

    async def put_model(
        self, name: str, endpoints: list[str], version: str, served_model: str | None = None
    ) -> ModelRecord:
        """Register (or replace) a model's endpoints and version; listeners learn of it before this returns, so
        a caller that resumes the gateway after a weight sync knows every new call goes to the new version.
        `served_model`: the name the endpoints serve it under, when it is not the route's own."""
        _text(name=name, version=version, served_model=served_model)
        model = ModelRecord(name, list(endpoints), version, time.time(), served_model)
        await self._write(lambda repo: repo.put_model(model))
        for listener in self._model_listeners:
            listener(model)
        return model

    async def remove_model(self, name: str) -> ModelRecord:
        """Take a registration back (404 when there is none): the route falls back to its routes-file entry, or
        stops existing when it had none. Listeners learn of it before this returns."""
        _text(name=name)

        def op(repo: Repo) -> ModelRecord:
            removed = repo.delete_model(name)
            if removed is None:
                raise NotFound(f"no registered model {name!r}")
            return removed

        model = await self._write(op)
        for listener in self._model_removed:
            listener(model)
        return model

    def on_model_removed(self, listener: Callable[[ModelRecord], None]) -> None:
        """Call `listener` with each registration taken back through this store object."""
        self._model_removed.append(listener)

    def on_model_change(self, listener: Callable[[ModelRecord], None]) -> None:
        """Call `listener` with each model registered through this store object (the `route` addon's hook)."""
        self._model_listeners.append(listener)

    async def models(self) -> list[ModelRecord]:
        return await self._read(lambda repo: repo.models())


def _rollout(repo: Repo, rollout_id: str) -> Rollout:
    rollout = repo.get_rollout(rollout_id)
    if rollout is None:
        raise NotFound(f"rollout {rollout_id!r} not found")
    return rollout


def _text(**values: str | None) -> None:
    """A 400 for a string holding NUL: no backend's text holds one (PostgreSQL refuses it), so every backend
    refuses it alike, whatever reaches the store (the HTTP API refuses it before)."""
    for name, value in values.items():
        if value is not None and "\x00" in value:
            raise BadRequest(f"{name} must not hold a NUL character", param=name)


def _reward_value(spec: EventSpec) -> float:
    value = spec.data.get("value") if isinstance(spec.data, dict) else spec.data
    number = math.nan
    if not isinstance(value, bool) and isinstance(value, int | float):
        with contextlib.suppress(OverflowError):  # an integer past a double's range stays NaN: refused
            number = float(value)
    if not math.isfinite(number):
        raise BadRequest(
            "a reward event needs a finite numeric value: {'kind': 'reward', 'data': {'value': 1.0}}"
        )
    return number


def _names_step(spec: EventSpec) -> bool:
    """Whether a reward event rewards one step (a call's response id) rather than the rollout."""
    return isinstance(spec.data, dict) and isinstance(spec.data.get("response_id"), str)


def rollout_reward(source: str, rollout: Rollout) -> bool:
    """Whether a reward from `source` counts for `rollout`: the admin's (the trainer's) and the grader's do, an
    agent's only where its rollout trusts it. The triplets read rewards by the same rule (`triplets`)."""
    return source in ("admin", "grader") or (source == "agent" and rollout.config.trust_agent_rewards)
