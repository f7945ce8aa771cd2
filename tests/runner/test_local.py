"""The local backend with real processes: the env an agent gets, exits, timeouts and cancels that reach the whole
process group, the output tail, and the grading step."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agl_lite.errors import ConfigError
from agl_lite.runner.env import ContractEnv
from agl_lite.runner.local import REDACTED, LocalBackend
from agl_lite.runner.plan import resolve
from agl_lite.runner.seams import Launch, Outcome, RunnerSettings
from agl_lite.store.records import Attempt, AttemptStatus, Rollout, RolloutConfig, RolloutStatus
from tests.conftest import ADMIN_KEY
from tests.runner.probe import Probe, exited, marked_pids, running_probe

SH = "/bin/sh"


def settings(tmp_path: Path, **kw: Any) -> RunnerSettings:
    base = RunnerSettings(
        runner_id="r1",
        public_url="http://127.0.0.1:9",
        pass_env=("PATH",),
        grace_s=0.3,
        workdir=tmp_path,
        writable=(tmp_path,),
    )
    return replace(base, **kw)


def launch_of(s: RunnerSettings, rid: str = "ro-1", **config: Any) -> Launch:
    rollout = Rollout(rid, {"q": 1}, status=RolloutStatus.RUNNING, config=RolloutConfig(**config))
    contract = ContractEnv(s.public_url, ADMIN_KEY)
    return Launch(
        rollout,
        resolve(s, rollout),
        Attempt("at-1", rid, 1),
        contract.agent(rollout, "at-1"),
        contract.grader(rollout, "at-1"),
    )


def sh(script: str) -> list[str]:
    return [SH, "-c", script]


def env_dump(outcome: Outcome) -> dict[str, str]:
    """The JSON line an agent printed with its whole env."""
    line = next(ln for ln in (outcome.message or "").splitlines() if ln.startswith("{"))
    return dict(json.loads(line))


PRINT_ENV = [sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))"]


@pytest.fixture
async def probe() -> AsyncIterator[Probe]:
    async with running_probe() as p:
        yield p


async def test_an_agent_gets_the_contract_env_the_passed_basics_and_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUNNER_SECRET", "not for agents")
    s = settings(tmp_path, env={"EXTRA": "1"}, pass_env=("PATH", "AGL_KEY", "RUNNER_SECRET_MISSING"))
    launch = launch_of(s, runner={"command": PRINT_ENV, "env": {"MINE": "2"}})
    outcome = await LocalBackend(s, {}).launch(launch)
    assert outcome.status is AttemptStatus.SUCCEEDED
    assert outcome.exit_code == 0
    env = env_dump(outcome)
    env.pop("LC_CTYPE", None)  # Python's own locale coercion may add it
    # HOME and TMPDIR: the sandbox's own writable directories
    assert set(env) == set(launch.env) | {"PATH", "EXTRA", "MINE", "HOME", "TMPDIR"}
    assert env["PATH"] == os.environ["PATH"]
    assert env["AGL_ATTEMPT_ID"] == "at-1"
    assert env["AGL_TASK_INPUT"] == '{"q":1}'
    assert "AGL_KEY" not in env
    assert "RUNNER_SECRET" not in env
    assert "AGL_GRADER_KEY" not in env
    assert "AGL_RESULT_DIR" not in env


async def test_the_keys_in_the_output_tail_are_redacted(tmp_path: Path) -> None:
    s = settings(tmp_path)
    launch = launch_of(s, runner={"command": PRINT_ENV})
    outcome = await LocalBackend(s, {}).launch(launch)
    assert env_dump(outcome)["OPENAI_API_KEY"] == REDACTED
    assert launch.env["OPENAI_API_KEY"] not in (outcome.message or "")


async def test_the_output_tail_keeps_the_last_bytes(tmp_path: Path) -> None:
    s = settings(tmp_path, output_tail_bytes=100)
    script = "i=0; while [ $i -lt 200 ]; do echo line-$i; i=$((i+1)); done; echo done >&2; exit 3"
    outcome = await LocalBackend(s, {}).launch(launch_of(s, runner={"command": sh(script)}))
    assert (outcome.status, outcome.exit_code, outcome.retryable) == (AttemptStatus.FAILED, 3, True)
    head, _, tail = (outcome.message or "").partition("\n")
    assert head == "agent exited with code 3"
    assert tail.startswith("--- agent output, last 100 of 1695 bytes ---\n")
    assert tail.endswith("line-199\ndone\n")
    assert "line-180" not in tail


async def test_a_command_string_runs_without_a_shell_and_in_the_workdir(tmp_path: Path) -> None:
    s = settings(tmp_path)
    outcome = await LocalBackend(s, {}).launch(launch_of(s, runner={"command": "pwd"}))
    assert outcome.status is AttemptStatus.SUCCEEDED
    assert (outcome.message or "").splitlines()[-1] == str(tmp_path)


async def test_a_command_that_cannot_start_fails_without_retry(tmp_path: Path) -> None:
    s = settings(tmp_path)
    outcome = await LocalBackend(s, {}).launch(launch_of(s, runner={"command": [str(tmp_path / "nope")]}))
    assert (outcome.status, outcome.retryable) == (AttemptStatus.FAILED, False)
    assert "cannot start" in (outcome.message or "")


@pytest.mark.parametrize(
    ("code", "retryable"), [(errno.EBADF, True), (errno.EMFILE, True), (errno.ENOENT, False)]
)
async def test_a_start_the_machine_failed_is_retried_one_the_program_failed_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, retryable: bool
) -> None:
    """Seen once in ~3,000 forked agents: a start that failed with EBADF failed its rollout for good."""
    s = settings(tmp_path)
    backend = LocalBackend(s, {})

    async def failing_start(*_: object) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(backend, "_start", failing_start)
    outcome = await backend.launch(launch_of(s, runner={"command": "pwd"}))
    assert (outcome.status, outcome.retryable) == (AttemptStatus.FAILED, retryable)
    assert os.strerror(code) in (outcome.message or "")


async def test_no_command_at_all_fails_without_retry(tmp_path: Path) -> None:
    s = settings(tmp_path)
    outcome = await LocalBackend(s, {}).launch(launch_of(s))
    assert (outcome.status, outcome.retryable) == (AttemptStatus.FAILED, False)
    assert "no agent command" in (outcome.message or "")


def test_the_local_backend_takes_no_options(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no options"):
        LocalBackend(settings(tmp_path), {"image": "x"})


def hanging(probe: Probe, *, ignore_term: bool = False, detached: bool = False) -> list[str]:
    """An agent that starts a child (in a session of its own when `detached`), reports to the probe and waits
    forever. Its processes are found from outside by the marker in their command lines (`marked_pids`): inside
    the sandbox the pids it could report are its namespace's, not ours."""
    trap = "trap '' TERM; " if ignore_term else ""
    child = f"setsid sleep {probe.marker} &" if detached else f"sleep {probe.marker} &"
    return sh(f'{trap}{child} curl -sf "{probe.url}/started/$AGL_ROLLOUT_ID" >/dev/null; wait')


ISOLATIONS = pytest.mark.parametrize("isolation", ["namespaces", "none"])


@ISOLATIONS
async def test_a_timeout_stops_the_whole_process_group(tmp_path: Path, probe: Probe, isolation: str) -> None:
    s = settings(tmp_path, isolation=isolation)
    launch = launch_of(s, timeout_s=3.0, runner={"command": hanging(probe)})
    run = asyncio.ensure_future(LocalBackend(s, {}).launch(launch))
    await probe.wait_started("ro-1")
    pids = marked_pids(probe.marker)
    assert len(pids) >= 2  # the shell and the sleep it started
    outcome = await run
    assert outcome.status is AttemptStatus.TIMEOUT
    assert outcome.exit_code == 128 + 15
    assert (outcome.message or "").startswith(
        "agent timed out after 3 s and was stopped (was killed by SIGTERM"
    )
    for pid in pids:
        await exited(pid)


@ISOLATIONS
async def test_a_process_that_ignores_sigterm_is_killed_after_the_grace_period(
    tmp_path: Path, probe: Probe, isolation: str
) -> None:
    s = settings(tmp_path, grace_s=0.2, isolation=isolation)
    launch = launch_of(s, timeout_s=3.0, runner={"command": hanging(probe, ignore_term=True)})
    run = asyncio.ensure_future(LocalBackend(s, {}).launch(launch))
    await probe.wait_started("ro-1")
    pids = marked_pids(probe.marker)
    outcome = await run
    assert (outcome.status, outcome.exit_code) == (AttemptStatus.TIMEOUT, 128 + 9)
    assert "SIGKILL" in (outcome.message or "")
    for pid in pids:
        await exited(pid)


async def test_a_detached_daemon_ends_with_its_attempt_in_the_sandbox(tmp_path: Path, probe: Probe) -> None:
    """`setsid` takes a process out of the group the runner signals, not out of the attempt's PID namespace."""
    s = settings(tmp_path)
    probe.hold = True  # the agent waits in its report until released: its daemon is running then
    agent = sh(
        f'setsid sleep {probe.marker} & curl -sf "{probe.url}/started/$AGL_ROLLOUT_ID" >/dev/null; exit 0'
    )
    run = asyncio.ensure_future(LocalBackend(s, {}).launch(launch_of(s, runner={"command": agent})))
    await probe.wait_started("ro-1")
    pids = marked_pids(probe.marker)
    assert len(pids) >= 2  # the agent's shell and the daemon
    probe.release()
    assert (await run).status is AttemptStatus.SUCCEEDED
    for pid in pids:
        await exited(pid)


async def test_without_the_sandbox_a_detached_daemon_outlives_its_attempt(
    tmp_path: Path, probe: Probe
) -> None:
    """What the sandbox is for: the same agent with `isolation = "none"` leaves its daemon behind."""
    s = settings(tmp_path, isolation="none")
    probe.hold = True
    agent = sh(
        f"setsid sleep {probe.marker} >/dev/null 2>&1 & "  # not holding the output pipe the runner reads
        f'curl -sf "{probe.url}/started/$AGL_ROLLOUT_ID" >/dev/null; exit 0'
    )
    run = asyncio.ensure_future(LocalBackend(s, {}).launch(launch_of(s, runner={"command": agent})))
    await probe.wait_started("ro-1")
    probe.release()
    assert (await run).status is AttemptStatus.SUCCEEDED
    survivors = marked_pids(probe.marker)
    try:
        assert len(survivors) == 1
    finally:
        for pid in survivors:
            os.kill(pid, 9)


@ISOLATIONS
async def test_cancel_stops_a_running_attempt(tmp_path: Path, probe: Probe, isolation: str) -> None:
    s = settings(tmp_path, isolation=isolation)
    backend = LocalBackend(s, {})
    run = asyncio.ensure_future(backend.launch(launch_of(s, runner={"command": hanging(probe)})))
    await probe.wait_started("ro-1")
    pids = marked_pids(probe.marker)
    await backend.cancel("ro-1")
    outcome = await asyncio.wait_for(run, 30)
    assert outcome.status is AttemptStatus.CANCELLED
    assert (outcome.message or "").startswith("agent stopped: the rollout was cancelled")
    for pid in pids:
        await exited(pid)
    await backend.cancel("ro-1")  # nothing runs any more: a no-op


async def test_close_stops_every_attempt_as_lost_and_refuses_new_ones(tmp_path: Path, probe: Probe) -> None:
    s = settings(tmp_path)
    backend = LocalBackend(s, {})
    runs = [
        asyncio.ensure_future(backend.launch(launch_of(s, rid, runner={"command": hanging(probe)})))
        for rid in ("ro-1", "ro-2")
    ]
    await probe.wait_started("ro-1")
    await probe.wait_started("ro-2")
    await backend.close()
    outcomes = await asyncio.wait_for(asyncio.gather(*runs), 30)
    assert [o.status for o in outcomes] == [AttemptStatus.LOST, AttemptStatus.LOST]
    late = await backend.launch(launch_of(s, "ro-3", runner={"command": ["true"]}))
    assert late.status is AttemptStatus.LOST


@ISOLATIONS
async def test_cancelling_the_launch_task_kills_the_process_group(
    tmp_path: Path, probe: Probe, isolation: str
) -> None:
    s = settings(tmp_path, isolation=isolation)
    run = asyncio.ensure_future(LocalBackend(s, {}).launch(launch_of(s, runner={"command": hanging(probe)})))
    await probe.wait_started("ro-1")
    pids = marked_pids(probe.marker)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    for pid in pids:
        await exited(pid)


# --- the grading step ----------------------------------------------------------------------------------------

AGENT = 'test -z "$AGL_GRADER_KEY" && echo 42 > "$AGL_RESULT_DIR/answer" && echo "dir $AGL_RESULT_DIR"'
GRADER = (
    'test -n "$AGL_GRADER_KEY" && test -z "$OPENAI_API_KEY" && echo "graded $(cat "$AGL_RESULT_DIR/answer")"'
    " && echo $AGL_GRADE_URL"
)


def graded(s: RunnerSettings, grader: str, agent: str = AGENT) -> Launch:
    return launch_of(s, runner={"command": sh(agent)}, grader={"command": sh(grader)})


def lines(outcome: Outcome) -> list[str]:
    return (outcome.message or "").splitlines()


async def test_the_grader_runs_after_the_agent_with_its_env_and_the_agents_result(tmp_path: Path) -> None:
    s = settings(tmp_path)
    outcome = await LocalBackend(s, {}).launch(graded(s, GRADER))
    assert outcome.status is AttemptStatus.SUCCEEDED
    assert "graded 42" in lines(outcome)
    assert "http://127.0.0.1:9/r/ro-1/a/at-1/grade" in lines(outcome)
    result_dir = next(ln for ln in lines(outcome) if ln.startswith("dir "))[4:]
    assert not await asyncio.to_thread(Path(result_dir).exists)  # removed after the attempt


async def test_the_runners_grader_command_grades_every_rollout(tmp_path: Path) -> None:
    s = settings(tmp_path, grader_command=tuple(sh(GRADER)))
    outcome = await LocalBackend(s, {}).launch(launch_of(s, runner={"command": sh(AGENT)}))
    assert outcome.status is AttemptStatus.SUCCEEDED
    assert "graded 42" in lines(outcome)


async def test_a_failing_grader_fails_the_attempt(tmp_path: Path) -> None:
    s = settings(tmp_path)
    outcome = await LocalBackend(s, {}).launch(graded(s, "echo bad; exit 2"))
    assert (outcome.status, outcome.exit_code, outcome.retryable) == (AttemptStatus.FAILED, 2, True)
    assert lines(outcome) == ["grader exited with code 2", "--- grader output, last 4 of 4 bytes ---", "bad"]


async def test_the_grader_does_not_run_when_the_agent_failed(tmp_path: Path) -> None:
    s = settings(tmp_path)
    outcome = await LocalBackend(s, {}).launch(graded(s, "echo graded", agent="exit 4"))
    assert (outcome.status, outcome.exit_code) == (AttemptStatus.FAILED, 4)
    assert "graded" not in (outcome.message or "")


async def test_a_grading_step_without_a_command_fails_without_retry(tmp_path: Path) -> None:
    s = settings(tmp_path)
    outcome = await LocalBackend(s, {}).launch(launch_of(s, runner={"command": ["true"]}, grader={}))
    assert (outcome.status, outcome.retryable) == (AttemptStatus.FAILED, False)
    assert "no grader command" in (outcome.message or "")
