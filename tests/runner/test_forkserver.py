"""The local backend's fork server (`preload`): a Python agent started as a fork behaves as one started fresh (its
env, exit, output, signals, timeout, the sandbox), no step's secrets reach the server or a later step, and
commands that are not `PYTHON SCRIPT.py` start fresh as before. (`tests/reliability/test_hostile_agent.py` runs
its attack through the fork server too.)"""

from __future__ import annotations

import json
import os
import secrets
import signal
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from agl_lite.runner.forkserver import fork_eligible
from agl_lite.runner.local import LocalBackend
from agl_lite.store.records import AttemptStatus
from tests.runner.test_local import env_dump, launch_of, settings

PY = sys.executable

ENV_AND_PIDS = """
import json, os, sys
print(json.dumps(dict(os.environ)))
print("argv", json.dumps(sys.argv))
print("pid", os.getpid(), "procs", len([p for p in os.listdir("/proc") if p.isdigit()]))
print("imported", "json" in sys.modules, "email.message" in sys.modules)
sys.exit(int(os.environ.get("CODE", "0")))
"""


def _script(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.fixture
async def backend(tmp_path: Path) -> LocalBackend:
    b = LocalBackend(settings(tmp_path, preload=("email.message",)), {})
    yield b
    await b.close()


async def test_a_forked_agent_gets_the_same_env_argv_and_exit_code_as_a_fresh_one(
    tmp_path: Path, backend: LocalBackend
) -> None:
    script = _script(tmp_path, "agent.py", ENV_AND_PIDS)
    fresh = LocalBackend(settings(tmp_path), {})
    outcomes = []
    for b in (backend, fresh):
        launch = launch_of(b.settings, runner={"command": [PY, script, "an arg"], "env": {"CODE": "3"}})
        outcomes.append(await b.launch(launch))
    forked, started = outcomes
    assert forked.status is started.status is AttemptStatus.FAILED
    assert forked.exit_code == started.exit_code == 3
    own_dirs = {"HOME", "TMPDIR"}  # each attempt's own
    assert {k: v for k, v in env_dump(forked).items() if k not in own_dirs} == {
        k: v for k, v in env_dump(started).items() if k not in own_dirs
    }
    lines = {ln.split(" ", 1)[0]: ln for ln in (forked.message or "").splitlines() if " " in ln}
    assert json.loads(lines["argv"].split(" ", 1)[1]) == [script, "an arg"]
    # The preloaded module came with the fork (a fresh interpreter would not have it); the sandbox is the same:
    # PID 1 is the sandbox's init, and only the attempt's own processes are visible.
    assert lines["imported"] == "imported True True"
    pid, procs = lines["pid"].split()[1], lines["pid"].split()[3]
    assert pid == "2"
    assert int(procs) <= 3
    assert backend._forks[PY].alive  # it was the fork server, not a fallback


async def test_signals_timeouts_and_leftover_processes_end_as_for_a_fresh_agent(
    tmp_path: Path, backend: LocalBackend
) -> None:
    killed = _script(tmp_path, "killed.py", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    outcome = await backend.launch(launch_of(backend.settings, runner={"command": [PY, killed]}))
    assert outcome.status is AttemptStatus.FAILED
    assert outcome.exit_code == 128 + signal.SIGKILL
    assert "SIGKILL" in (outcome.message or "")

    marker = secrets.token_hex(4)
    slow = _script(
        tmp_path,
        "slow.py",
        f"import subprocess, time\nsubprocess.Popen(['setsid', 'sleep', '{900 + int(marker, 16) % 97}'])\n"
        "time.sleep(60)\n",
    )
    launch = launch_of(backend.settings, runner={"command": [PY, slow]}, timeout_s=0.5)
    outcome = await backend.launch(launch)
    assert outcome.status is AttemptStatus.TIMEOUT
    leftover = [
        p
        for p in os.listdir("/proc")
        if p.isdigit() and _cmdline(p).endswith(f"{900 + int(marker, 16) % 97}")
    ]
    assert leftover == []  # the setsid daemon died with the attempt's PID namespace


async def test_no_step_sees_an_earlier_steps_secret_in_what_it_inherits(
    tmp_path: Path, backend: LocalBackend
) -> None:
    """The fork server never reads a step's request (the child does, after the fork): a later step, forked from
    the same server, dumps its whole writable memory, which holds its own secret but not the earlier step's."""
    first_secret, own_secret = secrets.token_hex(16), secrets.token_hex(16)
    quiet = _script(tmp_path, "quiet.py", "pass\n")
    await backend.launch(
        launch_of(backend.settings, runner={"command": [PY, quiet], "env": {"S": first_secret}})
    )
    dump = tmp_path / "memory.bin"
    scan = _script(
        tmp_path,
        "scan.py",
        f"""
with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb") as mem, open({str(dump)!r}, "wb") as out:
    for line in maps:
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        if "rw" in line.split()[1]:
            try:
                mem.seek(lo)
                out.write(mem.read(hi - lo))
            except (OSError, ValueError, OverflowError):
                pass
""",
    )
    outcome = await backend.launch(
        launch_of(backend.settings, runner={"command": [PY, scan], "env": {"S": own_secret}})
    )
    assert outcome.status is AttemptStatus.SUCCEEDED, outcome.message
    assert backend._forks[PY].alive  # both steps were forks of the one server
    memory = dump.read_bytes()
    holds_own, holds_first = own_secret.encode() in memory, first_secret.encode() in memory
    assert holds_own  # the dump holds what is there
    assert not holds_first


async def test_commands_that_are_not_a_python_script_start_fresh(
    tmp_path: Path, backend: LocalBackend
) -> None:
    outcome = await backend.launch(
        launch_of(backend.settings, runner={"command": ["/bin/sh", "-c", "echo $$"]})
    )
    assert outcome.status is AttemptStatus.SUCCEEDED
    assert backend._forks == {}
    assert fork_eligible([PY, "agent.py", "-x"])
    assert fork_eligible(["/usr/bin/python3.11", "a.py"])
    assert not fork_eligible([PY, "-m", "agent"])
    assert not fork_eligible([PY, "-u", "agent.py"])
    assert not fork_eligible(["node", "agent.py"])
    assert not fork_eligible([PY])


async def test_a_preload_that_fails_is_reported_and_the_agent_still_runs(tmp_path: Path) -> None:
    script = _script(tmp_path, "agent.py", "print('ran')\n")
    b = LocalBackend(settings(tmp_path, preload=("no_such_module_anywhere",)), {})
    try:
        outcome = await b.launch(launch_of(b.settings, runner={"command": [PY, script]}))
        assert outcome.status is AttemptStatus.SUCCEEDED, outcome.message
        assert "ran" in (outcome.message or "")
        assert b._forks[PY].preload_failed.keys() == {"no_such_module_anywhere"}
    finally:
        await b.close()


async def test_a_fork_server_that_cannot_start_leaves_the_agent_to_a_fresh_process(tmp_path: Path) -> None:
    python = tmp_path / "python-no-fork"  # an interpreter that refuses to be a fork server (`-P` first)
    python.write_text(f'#!/bin/sh\n[ "$1" = -P ] && exit 1\nexec {PY} "$@"\n')
    python.chmod(0o755)
    script = _script(tmp_path, "agent.py", "print('ran')\n")
    b = LocalBackend(settings(tmp_path, preload=("json",)), {})
    try:
        outcome = await b.launch(launch_of(b.settings, runner={"command": [str(python), script]}))
        assert outcome.status is AttemptStatus.SUCCEEDED, outcome.message
        assert "ran" in (outcome.message or "")
        assert not b._forks[str(python)].alive
    finally:
        await b.close()


async def test_closing_the_backend_ends_the_fork_server(tmp_path: Path) -> None:
    b = LocalBackend(replace(settings(tmp_path), preload=("json",)), {})
    script = _script(tmp_path, "agent.py", "pass\n")
    await b.launch(launch_of(b.settings, runner={"command": [PY, script]}))
    server = b._forks[PY]
    proc = server._proc
    assert proc is not None
    await b.close()
    assert proc.returncode is not None


def _cmdline(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


async def test_many_quick_steps_all_end_even_when_the_status_comes_with_the_pid(
    tmp_path: Path, backend: LocalBackend
) -> None:
    """A step that ends at once has its pid and its status in one read of the control socket, before `spawn` has
    registered it: its status must not be lost (it was: such a step waited forever; 400 steps hit it)."""
    import asyncio

    script = _script(tmp_path, "quick.py", "pass\n")
    gate = asyncio.Semaphore(16)

    async def one(i: int) -> AttemptStatus:
        async with gate:
            launch = launch_of(backend.settings, rid=f"ro-{i}", runner={"command": [PY, script]})
            return (await backend.launch(launch)).status

    async with asyncio.timeout(120):
        statuses = await asyncio.gather(*(one(i) for i in range(400)))
    assert set(statuses) == {AttemptStatus.SUCCEEDED}


def _open_fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


def test_a_steps_output_is_closed_once_by_its_transport_under_uvloop(tmp_path: Path) -> None:
    """Under uvloop (the gateway's loop) a read-pipe transport closes its fd itself, and the pipe's file object
    closed it again when collected, by then maybe another file's number: a later step failed to start with EBADF
    (1 in 3,072 rollouts of the learning test). The output now comes over a socket whose transport closes it as
    the output ends: nothing is left for the collector to close."""
    import asyncio
    import gc

    import uvloop

    async def main() -> None:
        b = LocalBackend(replace(settings(tmp_path), preload=("json",)), {})
        script = _script(tmp_path, "agent.py", "print('hello')\n")
        try:
            await b.launch(launch_of(b.settings, rid="ro-0", runner={"command": [PY, script]}))
            before = _open_fds()
            gc.disable()  # what closes the output must be its owner, now, not the collector later
            try:
                for i in range(1, 6):
                    result = await b.launch(
                        launch_of(b.settings, rid=f"ro-{i}", runner={"command": [PY, script]})
                    )
                    assert result.status is AttemptStatus.SUCCEEDED
                for _ in range(3):
                    await asyncio.sleep(0)  # (the transports' close callbacks: no wait on time)
                assert _open_fds() - before == set()
            finally:
                gc.enable()
        finally:
            await b.close()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())
