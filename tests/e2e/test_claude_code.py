"""Real Claude Code (pinned in examples/swe-bench/package-lock.json) through the gateway to the mock vLLM.

The local runner starts `claude -p` as a rollout's agent, so it gets the agent contract's `ANTHROPIC_BASE_URL`
and agent key, with a HOME and TMPDIR of its own, no telemetry, no update checks. The mock is scripted to answer
the first turn with a call of Claude Code's file-writing tool (`Write`, as the tools Claude Code sends define it),
and the turn that carries its `tool_result` with a final text. The file must exist afterwards, the process exit 0,
and the store hold both calls with the token ids the upstream produced. The run is made once for the module (Claude
Code's start is the slow part), under strace where it can be, to check that Claude Code connects to loopback
addresses only.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agl_lite.addons import DEFAULT_CHAIN
from agl_lite.client import AglLiteClient
from agl_lite.service import running_gateway
from agl_lite.store.records import AttemptStatus, CallOutcome, LLMCall, RolloutConfig, RolloutStatus
from agl_lite.store.rules import RolloutSpec
from agl_lite.testing import MockVLLM, Scenario, ToolCallSpec, running_mock
from agl_lite.testing.gateway import write_config
from tests.conftest import ADMIN_KEY, gateway_url

ROOT = Path(__file__).resolve().parents[2]
CLAUDE = ROOT / "examples" / "swe-bench" / "node_modules" / ".bin" / "claude"
VERSION = "2.1.332"
"""The version examples/swe-bench/package.json pins (checked below against what is installed)."""
MODEL, SMALL_MODEL = "claude-sonnet-4-6", "claude-haiku-4-5"
CONTENT = "agl-lite was here\n"
DONE_TEXT = "I created hello.txt."

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not CLAUDE.exists(),
        reason="Claude Code is not installed: `make claude-code` installs it with npm"
        + ("" if shutil.which("node") else " (node is not on this machine)"),
    ),
]


@dataclass
class WriteOnce:
    """A mock vLLM hook in place of a model: call `Write` once, then, given its tool_result, say it is done."""

    path: str
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The tools of the last request, by name, as the upstream saw them (chat `function` definitions)."""

    def __call__(self, request: dict[str, Any]) -> Scenario:
        self.tools = {t["function"]["name"]: t["function"] for t in request.get("tools") or []}
        if "Write" not in self.tools:
            return Scenario(content="OK.")  # a side call without tools: answer plainly
        if any(m.get("role") == "tool" for m in request["messages"]):
            return Scenario(content=DONE_TEXT)
        return Scenario(tool_call=ToolCallSpec("Write", {"file_path": self.path, "content": CONTENT}))


@dataclass
class Run:
    """What one `claude -p` rollout left behind, read back from the store before the gateway stopped."""

    rollout_status: RolloutStatus
    attempt_status: AttemptStatus
    exit_code: int | None
    message: str
    calls: list[LLMCall]
    project: Path
    home: Path
    hook: WriteOnce
    trace: Path | None
    """strace's record of Claude Code's connects and sends; None where strace cannot trace."""


def _strace() -> str | None:
    strace = shutil.which("strace")
    if strace is None or subprocess.run([strace, "-o", os.devnull, "true"], check=False).returncode != 0:
        return None
    return strace


async def _run(tmp: Path) -> Run:
    project, home, scratch = tmp / "project", tmp / "home", tmp / "tmp"
    for d in (project, home, scratch):
        d.mkdir()
    hook = WriteOnce(str(project / "hello.txt"))
    # Claude Code's prompt is long (system prompt and tool schemas): room for it, and for its max_tokens.
    mock = MockVLLM(("smollm2",), max_model_len=200_000, hook=hook)
    strace = _strace()
    trace = tmp / "connects.txt" if strace else None
    # Under strace when it can: one run serves every test below (Claude Code's start is the slow part).
    prefix = [strace, "-f", "-qq", "-e", "trace=connect,sendto,sendmsg", "-o", str(trace)] if strace else []
    prompt = "Create hello.txt saying that agl-lite was here."
    runner = {
        "command": [*prefix, str(CLAUDE), "-p", prompt, "--allowedTools", "Write"],
        "workdir": str(project),
        "writable": [str(tmp)],  # the test reads what the agent leaves there (the sandbox: docs/runners.md)
        "timeout_s": 120.0,
        "grace_s": 1.0,
        "pass_env": ["PATH"],
        "env": {
            "HOME": str(home),
            "TMPDIR": str(scratch),
            "ANTHROPIC_MODEL": MODEL,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": SMALL_MODEL,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
        },
    }
    async with running_mock(mock) as url:
        config = write_config(
            tmp / "gateway",
            {"smollm2": [url]},
            aliases={"smollm2": [MODEL, SMALL_MODEL]},
            chain=(*DEFAULT_CHAIN, "runner"),
            addons={"store": {"backend": "sqlite", "path": "agl.db"}, "runner": runner},
        )
        async with running_gateway(config) as gw, AglLiteClient(gateway_url(gw), ADMIN_KEY) as client:
            (rollout,) = await client.enqueue([RolloutSpec({"task": "write a file"}, config=RolloutConfig())])
            done = await client.wait([rollout.id], 150.0, poll_s=150.0)
            assert done.pending == [], "Claude Code's rollout did not finish in time"
            (attempt,) = await client.attempts(rollout.id)
            calls = await client.calls(rollout.id)
    return Run(
        done.rollouts[0].status,
        attempt.status,
        attempt.exit_code,
        attempt.message or "",
        calls,
        project,
        home,
        hook,
        trace,
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """One rollout whose agent is `claude -p ...` (the local runner), run to its end."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AGL_KEY", ADMIN_KEY)
        return asyncio.run(_run(tmp_path_factory.mktemp("claude-code")))


def tool_result_call(calls: list[LLMCall]) -> LLMCall:
    """The call that carried Claude Code's tool_result back (a `tool` message upstream)."""
    found = [c for c in calls if any(m.get("role") == "tool" for m in c.upstream_request["messages"])]
    assert len(found) == 1, [c.upstream_request["messages"][-1] for c in calls]
    return found[0]


def test_the_installed_claude_code_is_the_pinned_version() -> None:
    done = subprocess.run([str(CLAUDE), "--version"], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.split()[0] == VERSION
    assert f'"@anthropic-ai/claude-code": "{VERSION}"' in (CLAUDE.parents[2] / "package.json").read_text()


def test_claude_code_exits_0_having_written_the_file_with_its_write_tool(run: Run) -> None:
    assert (run.attempt_status, run.exit_code) == (AttemptStatus.SUCCEEDED, 0), run.message
    assert run.rollout_status is RolloutStatus.SUCCEEDED
    assert (run.project / "hello.txt").read_text() == CONTENT
    write = run.hook.tools["Write"]["parameters"]  # the schema the scripted call was written against
    assert {"file_path", "content"} <= set(write["properties"])
    assert set(write["required"]) == {"file_path", "content"}


def test_claude_code_keeps_its_state_in_the_isolated_home(run: Run) -> None:
    assert (run.home / ".claude.json").exists()
    assert not (run.project / ".claude.json").exists()


def test_the_tool_result_turn_is_captured_with_the_upstreams_token_ids(run: Run) -> None:
    assert run.calls
    assert all(c.outcome is CallOutcome.OK and c.complete for c in run.calls)
    first = next(c for c in run.calls if c.client_response and c.client_response["stop_reason"] == "tool_use")
    (tool_use,) = [b for b in first.client_response["content"] if b["type"] == "tool_use"]
    assert tool_use["name"] == "Write"
    assert tool_use["input"] == {"file_path": str(run.project / "hello.txt"), "content": CONTENT}

    result = tool_result_call(run.calls)
    assert (result.api, result.requested_model) == ("messages", MODEL)
    # The Anthropic view: Claude Code answered the tool_use with a tool_result block naming it.
    blocks = [b for m in result.request["messages"] if isinstance(m["content"], list) for b in m["content"]]
    (tool_result,) = [b for b in blocks if b["type"] == "tool_result"]
    assert tool_result["tool_use_id"] == tool_use["id"]
    assert result.client_response["content"] == [{"type": "text", "text": DONE_TEXT}]
    assert result.client_response["stop_reason"] == "end_turn"
    assert result.prompt_token_ids is not None
    assert result.usage is not None
    assert len(result.choices[0].token_ids) == result.usage["completion_tokens"] > 0


def test_the_first_turn_is_a_token_prefix_of_the_tool_result_turn(run: Run) -> None:
    """What lets the trajectory merge chain the two turns into one training row."""
    first = next(c for c in run.calls if c.client_response and c.client_response["stop_reason"] == "tool_use")
    result = tool_result_call(run.calls)
    assert first.prompt_token_ids is not None
    assert result.prompt_token_ids is not None
    turn = [*first.prompt_token_ids.tolist(), *first.choices[0].token_ids.tolist()]
    assert result.prompt_token_ids.tolist()[: len(turn)] == turn


_ADDRESS = re.compile(r'inet_addr\("([^"]+)"\)|inet_pton\(AF_INET6, "([^"]+)"')


def _loopback(address: str) -> bool:
    return address.startswith("127.") or address in ("::1", "::") or address.startswith("::ffff:127.")


def test_claude_code_connects_to_loopback_addresses_only(run: Run) -> None:
    if run.trace is None:
        pytest.skip("strace is not installed or may not trace here")
    addresses = [a or b for a, b in _ADDRESS.findall(run.trace.read_text())]
    assert addresses, "strace saw no network traffic at all: it did not trace Claude Code"
    assert [a for a in addresses if not _loopback(a)] == []
