"""Real Codex CLI (pinned in examples/codex/package-lock.json) through the gateway's Responses API to the mock vLLM.

The mock is scripted as a model would act: on the first turn it calls the shell tool Codex sends (`exec_command`)
to write a file, and on the turn that carries the tool's output it answers. Codex must run the command, exit 0, and
every turn must be captured with the upstream's token ids, the second turn's prompt extending the first's (one
training row). Once with `codex exec` run straight at the gateway (the admin key, an isolated HOME and
CODEX_HOME, loopback only, no update check or analytics), once as a rollout's agent under the local runner
(examples/codex/agent.sh, the agent contract's URL and key).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agl_lite.addons import DEFAULT_CHAIN
from agl_lite.client import AglLiteClient
from agl_lite.integrations.trajectory import merge_trajectories
from agl_lite.service import running_gateway
from agl_lite.store.records import AttemptStatus, CallOutcome, LLMCall, RolloutConfig, RolloutStatus
from agl_lite.store.rules import STORE, RolloutSpec
from agl_lite.store.triplets import Triplet
from agl_lite.testing import MockVLLM, Scenario, ToolCallSpec, running_mock
from agl_lite.testing.gateway import write_config
from tests.conftest import ADMIN_KEY, gateway_url

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "codex"
CODEX = EXAMPLE / "node_modules" / ".bin" / "codex"
MODEL = "gpt-5-codex"
COMMAND = "echo agl-lite was here > hello.txt"
DONE_TEXT = "I wrote hello.txt."

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not CODEX.exists(),
        reason="Codex CLI is not installed: `make codex` installs it with npm"
        + ("" if shutil.which("node") else " (node is not on this machine)"),
    ),
]


@dataclass
class ShellOnce:
    """A mock vLLM hook in place of a model: run the shell command once, then, given its output, say it is done."""

    tools: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The tools of the last turn, by name, as the upstream saw them (chat `function` definitions)."""

    def __call__(self, request: dict[str, Any]) -> Scenario:
        self.tools = {t["function"]["name"]: t["function"] for t in request.get("tools") or []}
        if "exec_command" not in self.tools:
            return Scenario(content="OK.")  # a side call without tools: answer plainly
        if any(m.get("role") == "tool" for m in request["messages"]):
            return Scenario(content=DONE_TEXT)
        return Scenario(tool_call=ToolCallSpec("exec_command", {"cmd": COMMAND}))


def project(tmp: Path) -> Path:
    repo = tmp / "project"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    return repo


def check_turns(calls: list[LLMCall]) -> None:
    """Both turns captured whole, as Responses calls, the second's prompt extending the first's."""
    turns = [c for c in calls if c.request and c.request.get("tools")]
    assert len(turns) == 2, [c.request for c in calls]
    for call in turns:
        assert (call.api, call.outcome, call.complete) == ("responses", CallOutcome.OK, True)
        assert call.prompt_token_ids
        assert call.choices[0].token_ids
    first, second = (list(c.prompt_token_ids or ()) for c in turns)
    assert second[: len(first)] == first
    assert turns[1].upstream_request["messages"][-1]["role"] == "tool"


async def test_codex_exec_runs_the_shell_command_through_the_gateway(tmp_path: Path) -> None:
    repo, home = project(tmp_path), tmp_path / "home"
    (home / ".codex").mkdir(parents=True)
    shutil.copy(EXAMPLE / "config.toml", home / ".codex" / "config.toml")
    hook = ShellOnce()
    async with running_mock(MockVLLM(("smollm2",), max_model_len=200_000, hook=hook)) as url:
        config = write_config(
            tmp_path / "gateway",
            {"smollm2": [url]},
            aliases={"smollm2": [MODEL]},
            chain=DEFAULT_CHAIN,
            addons={"store": {"backend": "memory"}},
        )
        async with running_gateway(config) as gw:
            base = f"{gateway_url(gw)}/v1"
            env = {
                "PATH": os.environ["PATH"],
                "HOME": str(home),
                "CODEX_HOME": str(home / ".codex"),
                "OPENAI_API_KEY": ADMIN_KEY,  # the admin key: calls recorded unattributed
            }
            argv = [str(CODEX), "exec", "--skip-git-repo-check", "-s", "danger-full-access"]
            argv += ["-c", f'model_providers.agl.base_url="{base}"', "Write hello.txt."]
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=repo,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            out, _ = await asyncio.wait_for(proc.communicate(), 120)
            assert proc.returncode == 0, out.decode()[-3000:]
            calls = await gw.addons.ctx.services.require(STORE, by="test").calls(None)
    assert "exec_command" in hook.tools
    assert (repo / "hello.txt").read_text() == "agl-lite was here\n"
    assert DONE_TEXT in out.decode()
    check_turns(calls)


async def test_codex_as_a_rollout_agent_of_the_local_runner(tmp_path: Path) -> None:
    repo, home, scratch = project(tmp_path), tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    scratch.mkdir()
    runner = {
        "command": [str(EXAMPLE / "agent.sh")],
        "workdir": str(repo),
        "writable": [
            str(tmp_path)
        ],  # the test reads what the agent leaves there (the sandbox: docs/runners.md)
        "timeout_s": 120.0,
        "grace_s": 1.0,
        "pass_env": ["PATH"],
        "env": {"HOME": str(home), "TMPDIR": str(scratch)},
    }
    async with running_mock(MockVLLM(("smollm2",), max_model_len=200_000, hook=ShellOnce())) as url:
        config = write_config(
            tmp_path / "gateway",
            {"smollm2": [url]},
            aliases={"smollm2": [MODEL]},
            chain=(*DEFAULT_CHAIN, "runner"),
            addons={"store": {"backend": "sqlite", "path": "agl.db"}, "runner": runner},
        )
        async with running_gateway(config) as gw, AglLiteClient(gateway_url(gw), ADMIN_KEY) as client:
            spec = RolloutSpec({"prompt": "Write hello.txt."}, config=RolloutConfig(max_attempts=1))
            (rollout,) = await client.enqueue([spec])
            done = await client.wait([rollout.id], 150.0, poll_s=150.0)
            assert done.pending == [], "Codex's rollout did not finish in time"
            (attempt,) = await client.attempts(rollout.id)
            calls = await client.calls(rollout.id)
            triplets: list[Triplet] = (await client.triplets(rollout.id)).triplets
    assert (done.rollouts[0].status, attempt.status, attempt.exit_code) == (
        RolloutStatus.SUCCEEDED,
        AttemptStatus.SUCCEEDED,
        0,
    ), attempt.message
    assert (repo / "hello.txt").read_text() == "agl-lite was here\n"
    check_turns(calls)
    rows, stats = merge_trajectories([t for t in triplets if t.prompt_ids])
    assert stats.merged_steps >= 1
    assert any(len(row.spans) == 2 for row in rows)
