"""The local backend (the embedded default): each attempt is one local process with exactly the agent env, then,
when the rollout has a grading step, a second process with the grader env; the runner core owns retries.

With `isolation = "namespaces"` (the default) each step runs in `sandbox.py`'s namespaces: it sees only its own
processes, cannot read the store, key or config files, writes only its own directories (its HOME and TMPDIR, and
`AGL_RESULT_DIR`, which the agent and its grader share), and everything it started ends with it. A timeout, a
cancel or the runner stopping signals the whole attempt (SIGTERM, SIGKILL after `grace_s`). The tail of the
output goes into the attempt's message, with the rollout's keys redacted.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import shutil
import signal
import stat
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from agl_lite.errors import ConfigError
from agl_lite.runner.env import process_env
from agl_lite.runner.forkserver import ForkServer, ForkServerError, fork_eligible
from agl_lite.runner.process import Exit, GroupProcess
from agl_lite.runner.programs import cannot_start
from agl_lite.runner.sandbox import CANNOT_EXEC, SETUP_FAILED
from agl_lite.runner.seams import Launch, Outcome, RunnerSettings, RunnerStore
from agl_lite.store.records import Attempt, AttemptStatus, Rollout

__all__ = ["SANDBOX", "LocalBackend", "SandboxError"]

SANDBOX = Path(__file__).with_name("sandbox.py")
SANDBOX_PREFIX = "agl-lite sandbox: "
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")

SECRET_VARS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "AGL_GRADER_KEY")
REDACTED = "[redacted]"

_PERMANENT_START_ERRORS = frozenset(
    {errno.ENOENT, errno.EACCES, errno.ENOEXEC, errno.ENOTDIR, errno.EISDIR, errno.EPERM}
)
"""Why a program cannot start whatever the attempt: the rest (EBADF, EMFILE, ENOMEM, EAGAIN...) may pass."""

log = structlog.get_logger("agl_lite.runner")


@dataclass(slots=True)
class _Run:
    """What runs for one rollout now, and why it was stopped, if it was."""

    proc: GroupProcess | None = None
    stopped: AttemptStatus | None = None


class SandboxError(ConfigError):
    """The namespaces cannot be set up on this machine."""


def runs_parent() -> Path:
    """The directory every local runner of this user keeps its attempts' directories in (`agl-runs-UID` in the
    temp directory), created private. The sandbox masks it whole: no agent reads another runner's attempts (their
    HOME, TMPDIR, results, an agent key an agent copied there), whether that runner still runs or crashed."""
    path = Path(tempfile.gettempdir()) / f"agl-runs-{os.geteuid()}"
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        # Someone else's, a link, or opened up: attempts' directories must not go where another user reaches.
        raise ConfigError(
            f"{path} is not a private directory of this user (uid {os.geteuid()}, mode 0700): the local "
            "runner keeps its attempts' directories there; remove it, or set TMPDIR elsewhere"
        )
    return path


class LocalBackend:
    owns_retries = False

    def __init__(self, settings: RunnerSettings, options: Mapping[str, Any]) -> None:
        if options:
            raise ConfigError(f"{settings.config_file}: the local backend takes no options of its own")
        self.settings = settings
        self._runs: dict[str, _Run] = {}
        self._closed = False
        self._base: Path | None = None
        self._forks: dict[str, ForkServer] = {}

    async def open(self, store: RunnerStore, runner_id: str) -> None:
        """With namespaces: check once that they can be set up here, so that no rollout fails for it."""
        if self.settings.isolation == "namespaces":
            await self.check_sandbox()

    async def check_sandbox(self) -> None:
        """SandboxError saying why, and what to do, when `sandbox.py` cannot run here."""
        base = self._base_dir()
        own = Path(tempfile.mkdtemp(dir=base))
        try:
            proc = await GroupProcess.start(
                self._sandboxed(["true"], [own], []), env={"PATH": os.defpath}, cwd=base, tail_bytes=4096
            )
            result = await proc.wait(30.0, 1.0)
        finally:
            shutil.rmtree(own, ignore_errors=True)
        if result.returncode != 0:
            why = result.output.strip().removeprefix(SANDBOX_PREFIX) or f"exit code {result.returncode}"
            raise SandboxError(
                f"{self.settings.config_file}: addons.runner: local agents cannot be isolated here ({why}). "
                "They run in new user, mount and PID namespaces, which needs unprivileged user namespaces "
                "(sysctl kernel.unprivileged_userns_clone=1; on Ubuntu also "
                "kernel.apparmor_restrict_unprivileged_userns=0) and Linux 5.12 or later. Where that cannot be "
                'had, isolation = "none" runs agents unconfined: see docs/runners.md for what they can reach then'
            )

    def _base_dir(self) -> Path:
        """The directory this runner's attempts' directories live under (in `runs_parent()`)."""
        if self._base is None:
            self._base = Path(tempfile.mkdtemp(prefix="runner-", dir=runs_parent()))
        return self._base

    def _spec(self, own: Sequence[Path], writable: Sequence[Path]) -> dict[str, Any]:
        private = []
        for path in self.settings.private_paths:
            private += [path, *(path.with_name(path.name + side) for side in SQLITE_SIDE_FILES)]
        return {
            "own": [str(p) for p in (*own, *writable)],
            # Every runner's of this user, its own included, live or left behind by a crash: only the step's own
            # directories are bound back.
            "mask_dirs": [str(self._base_dir().parent)],
            "mask_files": sorted({str(p) for p in private if p.is_file()}),
            "runner_pid": os.getpid(),
        }

    def _sandboxed(self, argv: Sequence[str], own: Sequence[Path], writable: Sequence[Path]) -> list[str]:
        spec = self._spec(own, writable)
        return [_sandbox_python(), "-I", "-S", str(SANDBOX), json.dumps(spec), *argv]

    async def _start(
        self, argv: Sequence[str], env: Mapping[str, str], own: Sequence[Path], sandboxed: bool
    ) -> GroupProcess:
        """The step's process: forked by the fork server of its interpreter when `preload` asks for one and the
        command is a Python script, else started fresh (also when the fork server cannot be had)."""
        s = self.settings
        if s.preload and fork_eligible(argv):
            server = self._forks.get(argv[0])
            if server is None:
                base_env = {k: os.environ[k] for k in s.pass_env if k in os.environ}
                server = self._forks[argv[0]] = ForkServer(argv[0], s.preload, env=base_env, cwd=s.workdir)
            try:
                spec = self._spec(own, s.writable) if sandboxed else None
                return await server.spawn(
                    argv, env=env, cwd=s.workdir, sandbox=spec, tail_bytes=s.output_tail_bytes
                )
            except ForkServerError as exc:
                log.warning("fork server unavailable; starting the step as a fresh process", error=str(exc))
        if sandboxed:
            argv = self._sandboxed(argv, own, s.writable)
        return await GroupProcess.start(argv, env=env, cwd=s.workdir, tail_bytes=s.output_tail_bytes)

    async def reconcile(self, running: Sequence[tuple[Rollout, list[Attempt]]]) -> None:
        """Nothing to do: a process this backend started ends with its launch, so the core knows all of them."""

    async def launch(self, launch: Launch) -> Outcome:
        plan, rid = launch.plan, launch.rollout.id
        if not plan.command:
            return Outcome(
                AttemptStatus.FAILED,
                message="no agent command: set [addons.runner] command or the rollout's config.runner.command",
                retryable=False,
            )
        if plan.grading and not plan.grader_command:
            return Outcome(
                AttemptStatus.FAILED,
                message="the rollout has a grading step but no grader command: set [addons.runner] "
                "grader_command or the rollout's config.grader.command",
                retryable=False,
            )
        if self._closed:
            return Outcome(AttemptStatus.LOST, message="the runner is stopping")
        run = self._runs[rid] = _Run()
        attempt_dir = Path(tempfile.mkdtemp(prefix=f"{rid}-", dir=self._base_dir()))
        result_dir = attempt_dir / "result"
        try:
            shared: dict[str, str] = {}
            if plan.grading:
                result_dir.mkdir()
                shared["AGL_RESULT_DIR"] = str(result_dir)
            secrets = [v for k, v in {**launch.env, **launch.grader_env}.items() if k in SECRET_VARS and v]
            agent = await self._step(
                run,
                _Step("agent", plan.command, attempt_dir, plan.timeout_s),
                {**launch.env, **shared},
                plan.env,
                secrets,
            )
            if agent.status is not AttemptStatus.SUCCEEDED or not plan.grading:
                return agent
            grader = await self._step(
                run,
                _Step("grader", plan.grader_command, attempt_dir, plan.grader_timeout_s),
                {**launch.grader_env, **shared},
                plan.env,
                secrets,
            )
            if grader.status is AttemptStatus.SUCCEEDED:
                return Outcome(AttemptStatus.SUCCEEDED, 0, f"{agent.message}\n{grader.message}")
            return grader
        finally:
            if self._runs.get(rid) is run:
                del self._runs[rid]
            try:
                shutil.rmtree(attempt_dir, ignore_errors=True)
            # 3.11's rmtree can raise despite ignore_errors: the attempt's outcome stands.
            except OSError as exc:
                log.error("could not remove an attempt's directory", path=str(attempt_dir), error=repr(exc))

    async def _step(
        self,
        run: _Run,
        step: _Step,
        contract: Mapping[str, str],
        extra: Mapping[str, str],
        secrets: Sequence[str],
    ) -> Outcome:
        name, argv = step.name, step.argv
        if run.stopped is not None:
            return Outcome(run.stopped, message=f"{name} not started: {_why(run.stopped)}")
        sandboxed = self.settings.isolation == "namespaces"
        own: dict[str, str] = {}
        if sandboxed:  # its own HOME and TMPDIR: nothing else is writable
            for var, sub in (("HOME", "home"), ("TMPDIR", "tmp")):
                path = step.attempt_dir / name / sub
                path.mkdir(parents=True)
                own[var] = str(path)
        env = process_env(contract, pass_env=self.settings.pass_env, extra=extra, private=own)
        program_error = cannot_start(argv[0], env.get("PATH", os.defpath), self.settings.workdir)
        if program_error is not None:
            return Outcome(
                AttemptStatus.FAILED,
                message=f"{name}: cannot start {argv[0]!r}: {program_error}",
                retryable=False,
            )
        mine = [step.attempt_dir / name]
        if "AGL_RESULT_DIR" in contract:
            mine.append(Path(contract["AGL_RESULT_DIR"]))
        try:
            proc = await self._start(argv, env, mine, sandboxed)
        except OSError as exc:
            # The program was there and runnable a moment ago (`cannot_start`): a failure now is the machine's
            # (no fds or memory left, a descriptor gone under the start), which another attempt may not meet.
            permanent = exc.errno in _PERMANENT_START_ERRORS
            log.warning(
                "a step could not start", step=name, program=argv[0], error=repr(exc), retry=not permanent
            )
            return Outcome(
                AttemptStatus.FAILED,
                message=f"{name}: cannot start {argv[0]!r}: {exc.strerror or exc}",
                retryable=not permanent,
            )
        run.proc = proc
        if run.stopped is not None:  # stopped while it was being started
            await proc.stop(self.settings.grace_s)
        try:
            result = await proc.wait(step.timeout_s, self.settings.grace_s)
        finally:
            run.proc = None
        if sandboxed and result.returncode in (SETUP_FAILED, CANNOT_EXEC) and SANDBOX_PREFIX in result.output:
            why = result.output[result.output.rindex(SANDBOX_PREFIX) + len(SANDBOX_PREFIX) :].strip()
            return Outcome(AttemptStatus.FAILED, result.returncode, f"{name}: {why}", retryable=False)
        return self._outcome(name, result, run.stopped, step.timeout_s, secrets)

    def _outcome(
        self,
        step: str,
        result: Exit,
        stopped: AttemptStatus | None,
        timeout_s: float | None,
        secrets: Sequence[str],
    ) -> Outcome:
        if result.stopped and stopped is not None:
            status, what = stopped, f"{step} stopped: {_why(stopped)}"
        elif result.timed_out:
            status = AttemptStatus.TIMEOUT
            what = f"{step} timed out after {timeout_s:g} s and was stopped ({_ended(result)})"
        elif result.returncode == 0:
            status, what = AttemptStatus.SUCCEEDED, f"{step} exited with code 0"
        else:
            status, what = AttemptStatus.FAILED, f"{step} {_ended(result)}"
        output = result.output
        for secret in secrets:
            output = output.replace(secret, REDACTED)
        if output:
            shown = min(result.output_bytes, self.settings.output_tail_bytes)
            what += f"\n--- {step} output, last {shown} of {result.output_bytes} bytes ---\n{output}"
        return Outcome(status, result.returncode, what)

    async def cancel(self, rollout_id: str) -> None:
        await self._stop(rollout_id, AttemptStatus.CANCELLED)

    async def close(self) -> None:
        self._closed = True
        await asyncio.gather(*(self._stop(rid, AttemptStatus.LOST) for rid in list(self._runs)))
        for server in self._forks.values():
            await server.close()
        self._forks.clear()
        if self._base is not None and not self._runs:
            shutil.rmtree(self._base, ignore_errors=True)

    async def _stop(self, rollout_id: str, why: AttemptStatus) -> None:
        run = self._runs.get(rollout_id)
        if run is None:
            return
        run.stopped = why
        if run.proc is not None:
            await run.proc.stop(self.settings.grace_s)


@dataclass(frozen=True, slots=True)
class _Step:
    name: str
    """`agent` or `grader`; also the name of its own directory in the attempt's."""
    argv: Sequence[str]
    attempt_dir: Path
    timeout_s: float | None


def _sandbox_python() -> str:
    """`sandbox.py` needs only the standard library: this interpreter, or where this user may not start it again
    (a venv over an interpreter in a home directory it cannot enter), any `python3` on the PATH."""
    if os.access(sys.executable, os.X_OK):
        return sys.executable
    return shutil.which("python3") or sys.executable


def _why(status: AttemptStatus) -> str:
    return "the rollout was cancelled" if status is AttemptStatus.CANCELLED else "the runner stopped"


def _ended(result: Exit) -> str:
    if result.signal is not None:
        try:
            name = signal.Signals(result.signal).name
        except ValueError:
            name = f"signal {result.signal}"
        return f"was killed by {name} (exit code {result.returncode})"
    return f"exited with code {result.returncode}"
