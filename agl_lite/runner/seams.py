"""The runner's seams: what it needs from the store (`RunnerStore`), what a backend provides (`Backend`), and the
plain data passed between them. No I/O here.

The `Runner` core (`agl_lite.runner.runner`) claims queued rollouts, resolves each one's `Plan`, builds the agent
and grader env, calls the backend, records outcomes and finishes rollouts. A backend only runs things:

- `owns_retries = False` (the local backend): the core starts every attempt itself (`start_attempt`, a fresh id
  each time), calls `launch` once per attempt with that attempt and its env, records the returned `Outcome` on the
  attempt, and starts the next attempt while attempts remain. A rollout it takes back after a restart has its
  still-running attempts marked `lost` first: nothing runs them any more.
- `owns_retries = True` (the Kubernetes backend: the Job's `backoffLimit`/`podFailurePolicy` retry): the core calls
  `launch` once per rollout with `attempt=None` and an env template whose attempt id is `$(AGL_ATTEMPT_ID)`; the
  backend records each attempt it sees (`store.start_attempt(rollout_id, pod_uid)`, `store.update_attempt(...)`)
  and returns the rollout's verdict as an `Outcome` (SUCCEEDED or not). `launch` must be idempotent: after a
  restart the core launches every running rollout of its runner id again (a Job that exists is adopted).

Either way the core alone finishes the rollout (`finish`), after grading, so a rollout on the completion cursor
already has its reward; a grading step is part of the backend's run (a second local command; the main container
after the agent's init container on Kubernetes) and only ever sees `Launch.grader_env`.

A backend class is constructed as `cls(settings: RunnerSettings, options: Mapping[str, Any])`, where `options` is
its own table (`[addons.runner.k8s]` for `backend = "k8s"`, resolved lazily as `agl_lite.runner.k8s:K8sBackend`);
it raises `ConfigError` naming the key for a bad option. The core then calls `open` once, `reconcile` at start and
every `resync_s`, `launch`/`cancel` per rollout, and `close` once at shutdown.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from agl_lite.store.records import Attempt, AttemptStatus, Rollout, RolloutStatus

__all__ = [
    "Backend",
    "EnqueueSignal",
    "Launch",
    "Outcome",
    "Plan",
    "RunnerSettings",
    "RunnerStore",
]


class RunnerStore(Protocol):
    """What a runner needs from the store: methods of `agl_lite.store.rules.Store` with its signatures, so the
    in-process store and `agl_lite.client.AglLiteClient` (the same interface over HTTP) both are one.

    Errors are the store's (`agl_lite.errors.Conflict`, `NotFound`...); the client's errors subclass them.
    """

    async def claim(self, runner_id: str, limit: int) -> list[Rollout]:
        """Move up to `limit` queued rollouts (oldest first) to running, owned by `runner_id`."""
        ...

    async def running(self) -> list[tuple[Rollout, list[Attempt]]]:
        """Every running rollout with its attempts (reconcile)."""
        ...

    async def get_rollout(self, rollout_id: str) -> Rollout: ...

    async def start_attempt(self, rollout_id: str, attempt_id: str | None = None) -> Attempt:
        """A new attempt (a fresh id when None) within the rollout's cap; Conflict when it is used up or the
        rollout no longer runs. An id seen before returns that attempt (a pod UID upsert)."""
        ...

    async def update_attempt(
        self,
        rollout_id: str,
        attempt_id: str,
        status: AttemptStatus,
        *,
        exit_code: int | None = None,
        message: str | None = None,
    ) -> Attempt:
        """Record an attempt's outcome; Conflict when it is terminal already (a cancel got there first)."""
        ...

    async def finish(self, rollout_id: str, status: RolloutStatus, message: str | None = None) -> Rollout:
        """The runner's verdict: succeeded or failed."""
        ...

    async def completed(self, after: int, limit: int = 100, wait: float = 0.0) -> tuple[list[Rollout], int]:
        """Terminal rollouts past a cursor (`limit=0`: none, and the cursor is the head): how the runner learns
        of cancels without polling every rollout."""
        ...


@runtime_checkable
class EnqueueSignal(Protocol):
    """Offered by the in-process store: an event that the next enqueue sets. Take it before claiming, then wait
    on it, and no enqueue is missed; a store without it (the HTTP client) is polled every `poll_s`."""

    def enqueued(self) -> asyncio.Event: ...


@dataclass(frozen=True, slots=True)
class RunnerSettings:
    """The runner's resolved settings (from `[addons.runner]`), shared by the core and every backend."""

    runner_id: str
    """Marks the rollouts this runner claims; a restarted runner with the same id takes them back."""
    public_url: str
    """Base URL agents reach the gateway at (their OPENAI_BASE_URL starts with it)."""
    command: tuple[str, ...] = ()
    """The agent command (argv) unless the rollout's `config.runner.command` names one."""
    concurrency: int = 8
    """Most rollouts in flight at once."""
    timeout_s: float | None = None
    """Per-attempt wall-clock limit unless the rollout's `config.timeout_s` sets one."""
    max_attempts: int = 0
    """Cap on the rollout's own `config.max_attempts` (0: no cap)."""
    grader_command: tuple[str, ...] = ()
    """The grading step's command unless the rollout's `config.grader.command` names one; non-empty means every
    rollout is graded."""
    grader_timeout_s: float | None = 600.0
    """Wall-clock limit of one grading step."""
    grace_s: float = 5.0
    """Between SIGTERM and SIGKILL when an attempt is stopped."""
    poll_s: float = 1.0
    """Claim poll interval when the store offers no enqueue signal (a remote store)."""
    resync_s: float = 30.0
    """Interval of the level-triggered reconcile against the store's running rollouts."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra env for agents and graders (the agent contract's variables win)."""
    pass_env: tuple[str, ...] = ()
    """Names copied from the runner's own environment into every agent's (PATH, HOME, LANG...)."""
    workdir: Path = Path(".")
    """Working directory of local agent processes."""
    output_tail_bytes: int = 4096
    """How much of an attempt's last output is kept in its message."""
    isolation: Literal["namespaces", "none"] = "namespaces"
    """How local processes are confined (`agl_lite.runner.sandbox`); `none` only where that cannot run."""
    writable: tuple[Path, ...] = ()
    """Paths local agents may write besides their own directories (with `namespaces`, all else is read-only)."""
    preload: tuple[str, ...] = ()
    """Modules a fork server imports once for Python agents (`runner/forkserver.py`); empty: no fork server."""
    private_paths: Collection[Path] = ()
    """Files no local agent may read (the store, key files, the config), read at each launch: addons add to it
    while they are configured."""
    config_file: str = "<defaults>"
    """The config file, for error messages."""


@dataclass(frozen=True, slots=True)
class Plan:
    """One rollout's settings: the runner's, overridden by the rollout's config (resolved by `plan.resolve`)."""

    command: tuple[str, ...]
    timeout_s: float | None
    max_attempts: int
    """The rollout's `config.max_attempts`, capped by the runner's `max_attempts`."""
    grading: bool
    """Whether the rollout has a grading step (its `config.grader`, or the runner's `grader_command`)."""
    grader_command: tuple[str, ...]
    grader_timeout_s: float | None
    env: Mapping[str, str]
    """Extra env: the runner's `env` updated with the rollout's `config.runner.env`."""
    overrides: Mapping[str, Any]
    """The rollout's `config.runner` as given (backend-specific keys such as `k8s` live here)."""
    grader: Mapping[str, Any] | None
    """The rollout's `config.grader` as given (a container for the Kubernetes backend)."""


@dataclass(frozen=True, slots=True)
class Launch:
    """What the core hands a backend to run."""

    rollout: Rollout
    plan: Plan
    attempt: Attempt | None
    """The attempt the core started (backends that do not own retries); None for those that do."""
    env: Mapping[str, str]
    """The agent contract's env (DESIGN.md §2); its attempt id is `$(AGL_ATTEMPT_ID)` when `attempt` is None.
    Never holds the grader key."""
    grader_env: Mapping[str, str]
    """The grading step's env (grader key, AGL_GRADE_URL); only for the grading step, never for the agent."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a launch ended: an attempt's outcome, or the rollout's verdict for backends that own retries."""

    status: AttemptStatus
    """SUCCEEDED, FAILED, TIMEOUT, LOST (the runner stopped) or CANCELLED (`cancel` ended it)."""
    exit_code: int | None = None
    message: str | None = None
    """For people: what happened and the tail of the output."""
    retryable: bool = True
    """False when another attempt cannot do better (no command configured, an invalid override)."""


class Backend(Protocol):
    """Runs attempts; see the module docstring for the contract between a backend and the core."""

    owns_retries: bool
    """True when the backend itself retries (Kubernetes Jobs) and records the attempts it sees; False when the
    core starts each attempt and decides on retries (local processes)."""

    async def open(self, store: RunnerStore, runner_id: str) -> None:
        """Once, before anything else: connect, start watches. `store` is how a backend that owns retries
        records attempts."""
        ...

    async def launch(self, launch: Launch) -> Outcome:
        """Run one attempt (or, owning retries, the rollout) to its end, the grading step included. Returns when
        it ended, or soon after `cancel` (CANCELLED) or `close` (LOST). Cancelling the calling task must stop
        what it started unless the backend's runs outlive the runner (Jobs do)."""
        ...

    async def cancel(self, rollout_id: str) -> None:
        """The rollout was cancelled (or finished by someone else): stop what runs for it; a no-op if nothing
        does."""
        ...

    async def reconcile(self, running: Sequence[tuple[Rollout, list[Attempt]]]) -> None:
        """Level-triggered resync, at start and every `resync_s`: the store's running rollouts of this runner
        with their attempts. The core has already relaunched the ones it was not running."""
        ...

    async def close(self) -> None:
        """Once, at shutdown: every pending launch returns LOST soon after (the core waits `grace_s` + 5 s for
        them, then cancels them). Local processes are stopped first; Jobs keep running."""
        ...
