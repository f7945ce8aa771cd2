"""The local runner end to end (issue #5, local acceptance): real agent processes — Python with the real openai SDK,
sh with curl — reach the real gateway (SQLite store, capture) in front of the mock vLLM with exactly the env the
runner gave them; retries, timeouts, cancels, a killed and restarted runner process, and a grading step.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from agl_lite.client import AglLiteClient
from agl_lite.core.contract import KeyRole, derive_key
from agl_lite.core.server import Gateway
from agl_lite.store.records import AttemptStatus, RolloutConfig, RolloutStatus
from agl_lite.store.rules import RolloutSpec
from agl_lite.testing import MockVLLM, running_mock
from tests.conftest import ADMIN_KEY, GatewayFactory, gateway_url
from tests.runner.agents import GRADED_AGENT, GRADER, SH_AGENT, RunnerHarness
from tests.runner.probe import Probe, exited, marked_pids, running_probe

CAPTURE_CHAIN = ("store", "auth", "store_api", "route", "capture", "sink")

PY_AGENT = """
import json, os, sys
from openai import OpenAI

task = json.loads(os.environ["AGL_TASK_INPUT"])
client = OpenAI(max_retries=0)  # OPENAI_BASE_URL and OPENAI_API_KEY come from the runner
reply = client.chat.completions.create(
    model="smollm2", messages=[{"role": "user", "content": task["question"]}], max_tokens=8
)
print("answer:", reply.choices[0].message.content)
marker = task.get("fail_first")
if marker and not os.path.exists(marker):
    open(marker, "w").close()
    sys.exit(1)
"""


def hanging_agent(probe: Probe) -> list[str]:
    """Starts a child, reports to the probe, then waits forever; `marked_pids(probe.marker)` finds both."""
    script = f'sleep {probe.marker} & curl -sf "{probe.url}/started/$AGL_ROLLOUT_ID" >/dev/null; wait'
    return ["/bin/sh", "-c", script]


@dataclass
class Setup(RunnerHarness):
    gateway: Gateway
    client: AglLiteClient
    mock: MockVLLM
    dir: Path

    wait_s = 120.0


@pytest.fixture
async def mock() -> AsyncIterator[tuple[MockVLLM, str]]:
    m = MockVLLM(("smollm2",), seed=7)
    async with running_mock(m) as url:
        yield m, url


@pytest.fixture
def start(gateway_factory: GatewayFactory, mock: tuple[MockVLLM, str], tmp_path: Path) -> Any:
    """`async with start(runner={...}) as setup:` a gateway with a SQLite store and, unless `runner=None`, the
    in-process runner with those options."""

    @asynccontextmanager
    async def started(runner: dict[str, Any] | None) -> AsyncIterator[Setup]:
        chain = CAPTURE_CHAIN + (("runner",) if runner is not None else ())
        addons: dict[str, Any] = {"store": {"backend": "sqlite", "path": "agl.db"}}
        if runner is not None:
            addons["runner"] = {"grace_s": 0.5, "writable": [str(tmp_path)], **runner}
        async with (
            gateway_factory({"smollm2": [mock[1]]}, chain=chain, addons=addons) as gw,
            AglLiteClient(gateway_url(gw), ADMIN_KEY) as client,
        ):
            yield Setup(gw, client, mock[0], tmp_path)

    return started


def spec(command: Sequence[str], task: dict[str, Any] | None = None, **config: Any) -> RolloutSpec:
    return RolloutSpec(
        task or {"question": "2+3?"}, config=RolloutConfig(runner={"command": list(command)}, **config)
    )


async def test_an_agent_in_sh_and_curl_completes(start: Any) -> None:
    async with start(runner={}) as s:
        (rid,) = await s.enqueue([spec(["/bin/sh", s.script("agent.sh", SH_AGENT)])])
        done = await s.wait([rid])
        (attempt,) = await s.client.attempts(rid)
        (call,) = await s.client.calls(rid)
        notes = await s.client.events(rid, kind="note")
    assert done[rid].status is RolloutStatus.SUCCEEDED
    assert (attempt.status, attempt.exit_code) == (AttemptStatus.SUCCEEDED, 0)
    assert (call.attempt_id, call.outcome.value) == (attempt.id, "ok")
    assert [(e.data, e.source, e.attempt_id) for e in notes] == [({"lang": "sh"}, "agent", attempt.id)]


async def test_an_agent_failing_its_first_attempt_succeeds_on_a_fresh_one(start: Any, tmp_path: Path) -> None:
    async with start(runner={}) as s:
        task = {"question": "2+3?", "fail_first": str(tmp_path / "failed-once")}
        (rid,) = await s.enqueue(
            [spec([sys.executable, s.script("agent.py", PY_AGENT)], task, max_attempts=2)]
        )
        done = await s.wait([rid])
        first, second = await s.client.attempts(rid)
        calls = await s.client.calls(rid)
    assert done[rid].status is RolloutStatus.SUCCEEDED
    assert (first.status, first.exit_code, second.status) == ("failed", 1, "succeeded")
    assert first.id != second.id
    assert "answer:" in (first.message or "")  # the output tail is kept on the attempt
    assert [c.attempt_id for c in calls] == [first.id, second.id]  # each attempt called with its own id


async def test_a_hanging_agent_is_killed_at_its_timeout(start: Any) -> None:
    async with running_probe() as probe, start(runner={}) as s:
        (rid,) = await s.enqueue([spec(hanging_agent(probe), timeout_s=3.0)])
        await probe.wait_started(rid)
        pids = marked_pids(probe.marker)
        assert len(pids) >= 2  # the agent and the child it started
        done = await s.wait([rid])
        (attempt,) = await s.client.attempts(rid)
    for pid in pids:
        await exited(pid)
    assert attempt.status is AttemptStatus.TIMEOUT
    assert (attempt.message or "").startswith("agent timed out after 3 s")
    assert done[rid].status is RolloutStatus.FAILED


async def test_cancel_kills_the_running_attempt(start: Any) -> None:
    async with running_probe() as probe, start(runner={}) as s:
        (rid,) = await s.enqueue([spec(hanging_agent(probe), max_attempts=3)])
        await probe.wait_started(rid)
        pids = marked_pids(probe.marker)
        await s.client.cancel(rid, "not needed any more")
        for pid in pids:
            await exited(pid)
        rollout, attempts = await s.client.get_rollout_with_attempts(rid)
    assert rollout.status is RolloutStatus.CANCELLED
    assert [a.status for a in attempts] == [AttemptStatus.CANCELLED]  # and no retry


async def test_the_reward_is_in_before_the_rollout_reaches_the_completion_cursor(
    start: Any, tmp_path: Path
) -> None:
    async with start(runner={"grader_command": [sys.executable, str(tmp_path / "grader.py")]}) as s:
        s.script("grader.py", GRADER)
        agent = [sys.executable, s.script("agent.py", GRADED_AGENT)]
        tasks = [{"a": 2, "b": 3, "env_dump": str(tmp_path / f"env{i}.json")} for i in range(2)]
        ids = await s.enqueue(
            [
                RolloutSpec(t, config=RolloutConfig(runner={"command": agent}), metadata={"expected": e})
                for t, e in zip(tasks, (5, 6), strict=True)
            ]
        )
        seen = await s.follow_completions(2, wait_s=60)
    assert [(seen[i].status, seen[i].reward) for i in ids] == [("succeeded", 1.0), ("succeeded", 0.0)]
    for i, rid in enumerate(ids):
        env = json.loads((tmp_path / f"env{i}.json").read_text())
        grader_key = derive_key(ADMIN_KEY, rid, KeyRole.GRADER)
        assert "AGL_GRADER_KEY" not in env
        assert "AGL_RESULT_DIR" in env
        assert grader_key not in env.values()
        assert ADMIN_KEY not in env.values()
        assert env["OPENAI_API_KEY"] == derive_key(ADMIN_KEY, rid, KeyRole.AGENT)


# --- fifty Python agents -----------------------------------------------------------------------------------------

ZYGOTE = """
import json, os, runpy, signal, socket, sys, traceback
import openai  # imported once here, so each agent forked below starts with the SDK loaded

# what the SDK loads lazily on first use, loaded once too
openai.OpenAI(api_key="-", base_url="http://127.0.0.1:9/v1").chat.completions.create
choice = {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "-"}}
openai.types.chat.ChatCompletion.model_validate(
    {"id": "-", "object": "chat.completion", "created": 0, "model": "-", "choices": [choice]}
)

signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the children
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(sys.argv[1])
server.listen(64)
print("ready", flush=True)
while True:
    conn, _ = server.accept()
    data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 2)
    while more := conn.recv(1 << 20):
        data += more
    if os.fork() == 0:
        server.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        request = json.loads(data)
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = request["argv"]
        code = 0
        try:
            runpy.run_path(sys.argv[0], run_name="__main__")
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        conn.sendall(str(code).encode())
        os._exit(code)
    for fd in fds:
        os.close(fd)
    conn.close()
"""

LAUNCHER = """
import json, os, socket, sys
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(sys.argv[1])
payload = json.dumps({"env": dict(os.environ), "argv": sys.argv[2:]}).encode()
sent = socket.send_fds(sock, [payload], [1, 2])
sock.sendall(payload[sent:])
sock.shutdown(socket.SHUT_WR)
status = sock.recv(16)
sys.exit(int(status) if status else 1)
"""


async def test_fifty_python_agents_with_the_openai_sdk_complete(start: Any, tmp_path: Path) -> None:
    """Each attempt is its own process, started by the runner with the agent env; it hands that env and its
    stdout to a warm interpreter that forks and runs the agent script. Importing the openai SDK costs about 1.7
    CPU-seconds per process on this machine, which fifty times over would be most of the suite's time budget."""
    sock = str(tmp_path / "zygote.sock")
    (tmp_path / "zygote.py").write_text(ZYGOTE)
    zygote = await asyncio.create_subprocess_exec(
        sys.executable,
        str(tmp_path / "zygote.py"),
        sock,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if k != "AGL_KEY"},
    )
    assert zygote.stdout is not None
    try:
        assert await asyncio.wait_for(zygote.stdout.readline(), 120) == b"ready\n"
        async with start(runner={"concurrency": 8}) as s:
            command = [sys.executable, "-I", "-S", s.script("launcher.py", LAUNCHER), sock]
            command.append(s.script("agent.py", PY_AGENT))
            ids = await s.enqueue([spec(command, {"question": f"{i}+1?"}) for i in range(50)])
            done = await s.wait(ids, timeout=300)
            attempts = {rid: await s.client.attempts(rid) for rid in ids}
            calls = {rid: await s.client.calls(rid) for rid in ids}
    finally:
        zygote.kill()
        await zygote.wait()
    assert {r.status for r in done.values()} == {RolloutStatus.SUCCEEDED}
    for rid in ids:
        (attempt,) = attempts[rid]
        (call,) = calls[rid]
        assert attempt.status is AttemptStatus.SUCCEEDED
        assert (call.attempt_id, call.outcome.value, call.rollout_id) == (attempt.id, "ok", rid)
    assert len({c[0].response_id for c in calls.values()}) == 50


# --- a runner-only process, killed and restarted ------------------------------------------------------------------

RESTART_AGENT = """
set -eu
curl -sf "$PROBE/started/$AGL_ROLLOUT_ID.$AGL_ATTEMPT_ID" >/dev/null
curl -sf -H "Authorization: Bearer $OPENAI_API_KEY" -H "Content-Type: application/json" \\
  "$OPENAI_BASE_URL/chat/completions" -d '{"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}'
"""


async def start_runner_process(config: Path, log: Path) -> asyncio.subprocess.Process:
    with log.open("ab") as out:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "agl_lite", "run", "--config", str(config), stdout=out, stderr=out
        )


async def test_a_killed_and_restarted_runner_process_leaves_no_rollout_running(
    start: Any, tmp_path: Path
) -> None:
    async with running_probe() as probe, start(runner=None) as s:
        config = tmp_path / "runner.toml"
        runner = {
            "store_url": gateway_url(s.gateway),
            "runner_id": "ctl",
            "concurrency": 3,
            "poll_s": 0.05,
            "grace_s": 0.5,
            "command": ["/bin/sh", s.script("agent.sh", RESTART_AGENT)],
            "env": {"PROBE": probe.url},
        }
        doc = {"server": {"host": "127.0.0.1", "port": 0}, "addons": {"chain": ["runner"], "runner": runner}}
        config.write_text(tomli_w.dumps(doc))
        ids = await s.enqueue([RolloutSpec({"q": i}, config=RolloutConfig(max_attempts=2)) for i in range(5)])
        probe.hold = True  # the first runner's agents hang once started
        first = await start_runner_process(config, tmp_path / "runner.log")
        try:
            started = await probe.wait_count(3, timeout=120)
        finally:
            first.send_signal(signal.SIGKILL)
            await first.wait()
        assert len(started) == 3
        for pid in marked_pids(
            probe.url
        ):  # the killed runner's agents, held in their report: they end with it
            await exited(pid)
        running = [r for r in await s.client.list_rollouts() if r.status is RolloutStatus.RUNNING]
        assert len(running) == 3
        probe.hold = False
        probe.release()
        second = await start_runner_process(config, tmp_path / "runner.log")
        try:
            done = await s.wait(ids)
        finally:
            second.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(second.wait(), 30)
        attempts = {rid: await s.client.attempts(rid) for rid in ids}
    assert code == 0
    assert {r.status for r in done.values()} == {RolloutStatus.SUCCEEDED}
    assert {r.runner_id for r in done.values()} == {"ctl"}
    taken_back = {r.id for r in running}
    for rid in ids:
        statuses = [a.status for a in attempts[rid]]
        if rid in taken_back:
            assert statuses == [AttemptStatus.LOST, AttemptStatus.SUCCEEDED]
            assert "restarted" in (attempts[rid][0].message or "")
            assert f"{rid}.{attempts[rid][0].id}" in started
        else:
            assert statuses == [AttemptStatus.SUCCEEDED]
