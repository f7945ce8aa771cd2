"""The local backend (the embedded default): each attempt is one local process with exactly the agent env, then,
when the rollout has a grading step, a second process with the grader env; the runner core owns retries.

The agent and its grader share a fresh directory, `AGL_RESULT_DIR`, removed after the attempt. A timeout, a
cancel or the runner stopping signals the whole process group (SIGTERM, SIGKILL after `grace_s`). The tail of
the output goes into the attempt's message, with the rollout's keys redacted.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agl_lite.errors import ConfigError
from agl_lite.runner.base import Launch, Outcome, RunnerSettings, RunnerStore
from agl_lite.runner.env import process_env
from agl_lite.runner.process import Exit, GroupProcess
from agl_lite.store.records import Attempt, AttemptStatus, Rollout

__all__ = ["LocalBackend"]

SECRET_VARS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "AGL_GRADER_KEY")
REDACTED = "[redacted]"


@dataclass(slots=True)
class _Run:
    """What runs for one rollout now, and why it was stopped, if it was."""

    proc: GroupProcess | None = None
    stopped: AttemptStatus | None = None


class LocalBackend:
    owns_retries = False

    def __init__(self, settings: RunnerSettings, options: Mapping[str, Any]) -> None:
        if options:
            raise ConfigError(f"{settings.config_file}: the local backend takes no options of its own")
        self.settings = settings
        self._runs: dict[str, _Run] = {}
        self._closed = False

    async def open(self, store: RunnerStore, runner_id: str) -> None:
        """Nothing to connect to."""

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
        result_dir = tempfile.mkdtemp(prefix=f"agl-{rid}-") if plan.grading else None
        try:
            shared = {"AGL_RESULT_DIR": result_dir} if result_dir else {}
            secrets = [v for k, v in {**launch.env, **launch.grader_env}.items() if k in SECRET_VARS and v]
            agent = await self._step(
                run, "agent", plan.command, {**launch.env, **shared}, plan.env, plan.timeout_s, secrets
            )
            if agent.status is not AttemptStatus.SUCCEEDED or not plan.grading:
                return agent
            grader = await self._step(
                run,
                "grader",
                plan.grader_command,
                {**launch.grader_env, **shared},
                plan.env,
                plan.grader_timeout_s,
                secrets,
            )
            if grader.status is AttemptStatus.SUCCEEDED:
                return Outcome(AttemptStatus.SUCCEEDED, 0, f"{agent.message}\n{grader.message}")
            return grader
        finally:
            if self._runs.get(rid) is run:
                del self._runs[rid]
            if result_dir is not None:
                shutil.rmtree(result_dir, ignore_errors=True)

    async def _step(
        self,
        run: _Run,
        step: str,
        argv: Sequence[str],
        contract: Mapping[str, str],
        extra: Mapping[str, str],
        timeout_s: float | None,
        secrets: Sequence[str],
    ) -> Outcome:
        if run.stopped is not None:
            return Outcome(run.stopped, message=f"{step} not started: {_why(run.stopped)}")
        env = process_env(contract, pass_env=self.settings.pass_env, extra=extra)
        try:
            proc = await GroupProcess.start(
                argv, env=env, cwd=self.settings.workdir, tail_bytes=self.settings.output_tail_bytes
            )
        except OSError as exc:
            return Outcome(
                AttemptStatus.FAILED,
                message=f"{step}: cannot start {argv[0]!r}: {exc.strerror or exc}",
                retryable=False,
            )
        run.proc = proc
        if run.stopped is not None:  # stopped while it was being started
            await proc.stop(self.settings.grace_s)
        try:
            result = await proc.wait(timeout_s, self.settings.grace_s)
        finally:
            run.proc = None
        return self._outcome(step, result, run.stopped, timeout_s, secrets)

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

    async def _stop(self, rollout_id: str, why: AttemptStatus) -> None:
        run = self._runs.get(rollout_id)
        if run is None:
            return
        run.stopped = why
        if run.proc is not None:
            await run.proc.stop(self.settings.grace_s)


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
