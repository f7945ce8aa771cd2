"""The SWE-bench example (examples/swe-bench) end to end on the local runner, with real Claude Code.

The test builds the tiny git repository the example's two self-written instances are about (`tiny_repo.py`) and
runs `algorithm.py` against a gateway with the local runner: the loader turns the JSONL into rollouts, the agent
runs `claude -p` in a clone through the gateway against the mock vLLM, scripted here to make Claude Code read the
buggy file and edit it (rightly for the first instance, wrongly for the second), and the grading step applies the
agent's diff to a clean checkout, runs the instance's FAIL_TO_PASS and PASS_TO_PASS tests and posts the reward with
the grader key. The fix must get reward 1, the wrong edit 0, and the agent's env hold no grader key. That run is
made once for the module (Claude Code's start is the slow part). The shipped instances are checked against the
repository (their tests fail at the base commit and pass with the gold patch, so reward 1 means something), and
the Job per instance image is rendered offline and validated against the Kubernetes schema.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import kubernetes_validate
import pytest
import yaml

from agl_lite.addons import DEFAULT_CHAIN
from agl_lite.client import AglLiteClient
from agl_lite.core.contract import KeyRole, derive_key
from agl_lite.service import running_gateway
from agl_lite.store.records import Attempt, AttemptStatus, CallOutcome, Event, LLMCall, Rollout, RolloutStatus
from agl_lite.testing import MockVLLM, Scenario, ToolCallSpec, running_mock
from agl_lite.testing.gateway import write_config
from tests.conftest import ADMIN_KEY, gateway_url

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "swe-bench"
INSTANCES = EXAMPLE / "instances.jsonl"
CLAUDE = EXAMPLE / "node_modules" / ".bin" / "claude"
NO_CLAUDE = "Claude Code is not installed: `make claude-code` installs it with npm" + (
    "" if shutil.which("node") else " (node is not on this machine)"
)
MODELS = ["claude-sonnet-4-6", "claude-haiku-4-5"]
I1, I2 = "agl-lite__tiny-calc-1", "agl-lite__tiny-calc-2"
K8S_SCHEMA = "1.31.0"
TEST_CMD = f"{sys.executable} -m pytest -rA -p no:cacheprovider"


@dataclass(frozen=True)
class Edit:
    """What the scripted model changes for the instance whose problem statement contains `marker`."""

    marker: str
    file: str
    old: str
    new: str


FIX_1 = Edit(
    "calc.add returns", "calc.py", "def add(a, b):\n    return a - b", "def add(a, b):\n    return a + b"
)
WRONG_2 = Edit(
    "stats.mean rounds", "stats.py", "return sum(xs) // len(xs)", "return round(sum(xs) / len(xs))"
)
"""Still wrong: mean([1, 2]) is now 2."""
_WORKDIR = re.compile(r"Primary working directory: (\S+)")


def _texts(messages: list[dict[str, Any]]) -> list[str]:
    """Every text of a chat request's messages (string contents and text parts)."""
    out: list[str] = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, str):
            out.append(content)
        elif isinstance(content, list):
            out += [str(p.get("text", "")) for p in content if isinstance(p, dict)]
    return out


@dataclass
class ScriptedCoder:
    """A mock vLLM hook in place of a model that fixes bugs: `Read` the file, `Edit` it, then say it is done.

    It finds the instance by its problem statement and the checkout in the `Primary working directory:` line Claude
    Code puts in its prompt; the step is the number of tool results the conversation holds, so concurrent
    conversations need no state here."""

    edits: Sequence[Edit]
    steps: list[tuple[str, str]] = field(default_factory=list)
    """(file, what was scripted) per request, for the failure messages."""

    def __call__(self, request: dict[str, Any]) -> Scenario:
        text = "\n".join(_texts(request["messages"]))
        edit = next((e for e in self.edits if e.marker in text), None)
        tools = {t["function"]["name"] for t in request.get("tools") or []}
        workdir = _WORKDIR.search(text)
        if edit is None or workdir is None or not {"Read", "Edit"} <= tools:
            self.steps.append(("-", "plain answer"))
            return Scenario(content="OK.")
        path = f"{workdir.group(1)}/{edit.file}"
        done = sum(1 for m in request["messages"] if m.get("role") == "tool")
        if done == 0:
            self.steps.append((edit.file, "Read"))
            return Scenario(tool_call=ToolCallSpec("Read", {"file_path": path}))
        if done == 1:
            self.steps.append((edit.file, "Edit"))
            arguments = {"file_path": path, "old_string": edit.old, "new_string": edit.new}
            return Scenario(tool_call=ToolCallSpec("Edit", arguments))
        self.steps.append((edit.file, "done"))
        return Scenario(content=f"I fixed {edit.file}.")


# The agent, wrapped: its env is written down first (to check what it holds), then it runs as it would.
ENV_DUMP = """
import json, os, runpy, sys
with open(os.path.join(sys.argv[1], os.environ["AGL_ROLLOUT_ID"] + ".json"), "w") as f:
    json.dump(dict(os.environ), f)
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@dataclass
class Graded:
    """One rollout as the store holds it after the run."""

    rollout: Rollout
    attempts: list[Attempt]
    events: dict[str, list[Event]]
    calls: list[LLMCall]
    env: dict[str, str]


@dataclass
class Outcome:
    by_instance: dict[str, Graded]
    summary: list[dict[str, Any]]
    output: str
    steps: list[tuple[str, str]]

    def __getitem__(self, instance_id: str) -> Graded:
        return self.by_instance[instance_id]


def _build_repos(root: Path) -> Path:
    subprocess.run(
        [sys.executable, str(EXAMPLE / "tiny_repo.py"), str(root)], check=True, capture_output=True
    )
    return root


async def _run(tmp: Path, edits: Sequence[Edit]) -> Outcome:
    """algorithm.py run to its end against a gateway whose local runner runs the example's agent and grader."""
    repos, envs, scratch = _build_repos(tmp / "repos"), tmp / "envs", tmp / "scratch"
    envs.mkdir()
    scratch.mkdir()
    coder = ScriptedCoder(edits)
    mock = MockVLLM(("smollm2",), max_model_len=200_000, hook=coder)
    runner = {
        "command": [sys.executable, "-c", ENV_DUMP, str(envs), str(EXAMPLE / "agent.py")],
        "grader_command": [sys.executable, str(EXAMPLE / "grade.py")],
        "workdir": str(tmp),
        "writable": [str(tmp)],  # the test reads what the agent leaves there (the sandbox: docs/runners.md)
        "concurrency": 2,
        "timeout_s": 150.0,
        "grader_timeout_s": 120.0,
        "grace_s": 1.0,
        "pass_env": ["PATH", "LANG"],
        "env": {
            "CLAUDE_BIN": str(CLAUDE),
            "TMPDIR": str(scratch),
            "SWE_TEST_TIMEOUT_S": "100",
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",  # the tiny repository needs none; loading them costs seconds
        },
    }
    async with running_mock(mock) as url:
        config = write_config(
            tmp / "gateway",
            {"smollm2": [url]},
            aliases={"smollm2": MODELS},
            chain=(*DEFAULT_CHAIN, "runner"),
            addons={"store": {"backend": "sqlite", "path": "agl.db"}, "runner": runner},
        )
        async with running_gateway(config) as gw, AglLiteClient(gateway_url(gw), ADMIN_KEY) as client:
            summary = tmp / "summary.json"
            algorithm = await asyncio.create_subprocess_exec(
                sys.executable,
                str(EXAMPLE / "algorithm.py"),
                *(
                    "--repos",
                    str(repos),
                    "--test-cmd",
                    TEST_CMD,
                    "--summary",
                    str(summary),
                    "--wait-s",
                    "200",
                ),
                env={**os.environ, "AGL_URL": gateway_url(gw), "AGL_KEY": ADMIN_KEY},
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
            output, _ = await asyncio.wait_for(algorithm.communicate(), 240)
            assert algorithm.returncode == 0, output.decode()[-3000:]
            by_instance = {}
            async for rollout in client.iter_rollouts():
                events: dict[str, list[Event]] = defaultdict(list)
                for event in await client.events(rollout.id):
                    events[event.kind].append(event)
                by_instance[rollout.input["instance_id"]] = Graded(
                    rollout,
                    await client.attempts(rollout.id),
                    events,
                    await client.calls(rollout.id),
                    json.loads((envs / f"{rollout.id}.json").read_text()),
                )
    return Outcome(by_instance, json.loads(summary.read_text()), output.decode(), coder.steps)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    """Both instances at once: the scripted model fixes the first and gets the second wrong."""
    if not CLAUDE.exists():
        pytest.skip(NO_CLAUDE)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AGL_KEY", ADMIN_KEY)
        return asyncio.run(_run(tmp_path_factory.mktemp("swe-bench"), [FIX_1, WRONG_2]))


def _report(graded: Graded) -> dict[str, Any]:
    (report,) = graded.events["swe_bench_report"]
    assert report.source == "grader"
    return dict(report.data)


def test_both_rollouts_succeed_agent_and_grader_alike(run: Outcome) -> None:
    assert sorted(run.by_instance) == [I1, I2]
    for graded in run.by_instance.values():
        (attempt,) = graded.attempts
        assert graded.rollout.status is RolloutStatus.SUCCEEDED, (attempt.message, run.steps)
        assert (attempt.status, attempt.exit_code) == (AttemptStatus.SUCCEEDED, 0)
        (patch,) = graded.events["patch"]  # the agent's own event: Claude Code exited 0 and changed one file
        assert (patch.source, patch.data["files"], patch.data["claude_exit_code"]) == ("agent", 1, 0)


def test_a_fixing_edit_gets_reward_1(run: Outcome) -> None:
    graded = run[I1]
    report = _report(graded)
    assert report["resolved"] is True, report
    assert report["FAIL_TO_PASS"] == {"passed": 1, "failed": []}
    assert report["PASS_TO_PASS"] == {"passed": 1, "failed": []}
    (reward,) = graded.events["reward"]
    assert (reward.data["value"], reward.source, graded.rollout.reward) == (1.0, "grader", 1.0)


def test_a_wrong_edit_gets_reward_0(run: Outcome) -> None:
    graded = run[I2]
    report = _report(graded)
    assert report["resolved"] is False
    assert report["patch_bytes"] > 0  # an edit was made and applied; the tests judged it
    assert report["FAIL_TO_PASS"] == {"passed": 0, "failed": ["tests/test_stats.py::test_mean"]}
    assert report["PASS_TO_PASS"] == {"passed": 2, "failed": []}
    (reward,) = graded.events["reward"]
    assert (reward.data["value"], reward.source, graded.rollout.reward) == (0.0, "grader", 0.0)


def test_the_agent_env_holds_no_grader_key_and_no_grading_data(run: Outcome) -> None:
    for graded in run.by_instance.values():
        rid, env = graded.rollout.id, graded.env
        assert derive_key(ADMIN_KEY, rid, KeyRole.GRADER) not in env.values()
        assert ADMIN_KEY not in env.values()
        assert not {"AGL_GRADER_KEY", "AGL_GRADE_URL", "AGL_KEY"} & set(env)
        assert env["ANTHROPIC_API_KEY"] == derive_key(ADMIN_KEY, rid, KeyRole.AGENT)
        assert env["ANTHROPIC_BASE_URL"].endswith(f"/r/{rid}/a/{graded.attempts[0].id}")
        task = json.loads(env["AGL_TASK_INPUT"])
        assert set(task) == {"instance_id", "repo", "base_commit", "problem_statement", "repo_url"}


def test_every_turn_is_captured_and_the_tool_result_turns_carry_token_ids(run: Outcome) -> None:
    for graded in run.by_instance.values():
        calls = graded.calls
        assert [c.outcome for c in calls] == [CallOutcome.OK] * 3, run.steps  # Read, Edit, done
        assert all(c.api == "messages" and c.complete for c in calls)
        tool_turns = [c for c in calls if any(m["role"] == "tool" for m in c.upstream_request["messages"])]
        assert len(tool_turns) == 2
        for call in tool_turns:
            assert call.prompt_token_ids is not None
            assert len(call.prompt_token_ids) > 0
            assert call.usage is not None
            assert len(call.choices[0].token_ids) == call.usage["completion_tokens"] > 0


def test_the_algorithm_summary_agrees_with_the_store(run: Outcome) -> None:
    assert sorted((r["instance_id"], r["reward"]) for r in run.summary) == [(I1, 1.0), (I2, 0.0)], run.output
    assert all(r["tool_result_turns"] == 2 and r["calls_with_token_ids"] == 3 for r in run.summary)


# --- the shipped data, the loader and the Kubernetes Jobs (no Claude Code needed) ---------------------------------


@pytest.fixture
def repos(tmp_path: Path) -> Path:
    return _build_repos(tmp_path / "repos")


def _git(repo: Path, *args: str, stdin: str | None = None) -> None:
    subprocess.run(["git", "-C", str(repo), *args], input=stdin, text=True, check=True, capture_output=True)


def _statuses(repo: Path, tests: list[str]) -> dict[str, str]:
    """pytest's verdict per test id, from its `-rA` summary lines (`PASSED id`, `FAILED id - why`)."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", *tests],
        cwd=repo,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
        check=False,
    )
    found = re.findall(r"^(PASSED|FAILED) (\S+)", done.stdout, re.MULTILINE)
    return {test: status for status, test in found}


@pytest.mark.parametrize("row", [json.loads(line) for line in INSTANCES.read_text().splitlines()])
def test_each_shipped_instance_fails_at_its_base_commit_and_passes_with_its_gold_patch(
    row: dict[str, Any], repos: Path, tmp_path: Path
) -> None:
    clone = tmp_path / "clone"
    _git(tmp_path, "clone", "--quiet", str(repos / row["repo"]), str(clone))
    _git(clone, "checkout", "--quiet", row["base_commit"])
    _git(clone, "apply", "-", stdin=row["test_patch"])
    fail_to_pass, pass_to_pass = json.loads(row["FAIL_TO_PASS"]), json.loads(row["PASS_TO_PASS"])
    before = _statuses(clone, fail_to_pass + pass_to_pass)
    assert before == {**dict.fromkeys(fail_to_pass, "FAILED"), **dict.fromkeys(pass_to_pass, "PASSED")}
    _git(clone, "apply", "-", stdin=row["patch"])
    assert _statuses(clone, fail_to_pass + pass_to_pass) == dict.fromkeys(
        fail_to_pass + pass_to_pass, "PASSED"
    )


def test_a_bad_row_stops_the_loader_with_its_line_and_field(tmp_path: Path) -> None:
    rows = INSTANCES.read_text().splitlines()
    broken = json.loads(rows[1])
    broken["base_commit"] = "HEAD"
    data = tmp_path / "bad.jsonl"
    data.write_text(rows[0] + "\n" + json.dumps(broken) + "\n")
    done = subprocess.run(
        [sys.executable, str(EXAMPLE / "algorithm.py"), "--data", str(data)],
        env={**os.environ, "AGL_URL": "http://127.0.0.1:9", "AGL_KEY": ADMIN_KEY},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert f"{data}:2" in done.stderr
    assert "base_commit" in done.stderr
    assert "Traceback" not in done.stderr


def test_each_instance_gets_a_valid_job_with_its_image_agent_first_and_the_grader_key_only_in_the_grader(
    tmp_path: Path,
) -> None:
    subprocess.run(
        [
            sys.executable,
            str(EXAMPLE / "k8s_jobs.py"),
            "--image-template",
            "registry.example/agl-swe.{key}:0.1.0",
            "--store-url",
            "http://agl-lite.agl-lite.svc:8100",
            "--out",
            str(tmp_path),
        ],
        check=True,
    )
    jobs = {p.stem: yaml.safe_load(p.read_text()) for p in sorted(tmp_path.glob("*.yaml"))}
    assert set(jobs) == {"agl-lite__tiny-calc-1", "agl-lite__tiny-calc-2"}
    for instance_id, job in jobs.items():
        kubernetes_validate.validate(job, K8S_SCHEMA, strict=True)
        pod = job["spec"]["template"]["spec"]
        (agent,), (grader,) = pod["initContainers"], pod["containers"]
        image = f"registry.example/agl-swe.{instance_id.replace('__', '_1776_')}:0.1.0"
        assert agent["image"] == grader["image"] == image  # the grader needs the instance's environment too
        assert agent["command"][-1] == "/agl/agent.py"
        assert grader["command"][-1] == "/agl/grade.py"
        agent_env = {e["name"]: e for e in agent["env"]}
        grader_env = {e["name"]: e for e in grader["env"]}
        assert "AGL_GRADER_KEY" not in agent_env
        assert "secretKeyRef" in grader_env["AGL_GRADER_KEY"]["valueFrom"]  # from the rollout's Secret
        assert "secretKeyRef" in agent_env["ANTHROPIC_API_KEY"]["valueFrom"]
        assert agent_env["SWE_TESTBED"]["value"] == grader_env["SWE_TESTBED"]["value"] == "/testbed"
        shared = {m["name"] for m in agent["volumeMounts"]} & {m["name"] for m in grader["volumeMounts"]}
        assert {v["name"] for v in pod["volumes"] if "emptyDir" in v} & shared
        task = json.loads(agent_env["AGL_TASK_INPUT"]["value"])
        assert task["instance_id"] == instance_id
        assert "FAIL_TO_PASS" not in task
        assert "test_patch" not in task


def test_a_latest_image_is_refused(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(EXAMPLE / "k8s_jobs.py"),
            *("--image-template", "registry.example/agl-swe.{key}:latest", "--out", str(tmp_path)),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert "latest" in done.stderr
    assert list(tmp_path.iterdir()) == []


# --- the grader on its own: the image's checkout (SWE_TESTBED), the agent's test edits, a patch that fails ---------


def _grade_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("swe_bench_grade", EXAMPLE / "grade.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rollout(row: dict[str, Any]) -> dict[str, Any]:
    """The rollout as `GET $AGL_GRADE_URL` returns it (what the grader reads), without a repo_url."""
    metadata = {
        "instance_id": row["instance_id"],
        "base_commit": row["base_commit"],
        "test_patch": row["test_patch"],
        "FAIL_TO_PASS": json.loads(row["FAIL_TO_PASS"]),
        "PASS_TO_PASS": json.loads(row["PASS_TO_PASS"]),
        "test_cmd": TEST_CMD,
    }
    return {"id": "ro-1", "metadata": metadata}


@pytest.fixture
def testbed(repos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, dict[str, Any]]:
    """Instance 1's checkout at its base commit, as an image has it at /testbed."""
    row = json.loads(INSTANCES.read_text().splitlines()[0])
    clone = tmp_path / "testbed"
    _git(tmp_path, "clone", "--quiet", str(repos / row["repo"]), str(clone))
    _git(clone, "checkout", "--quiet", row["base_commit"])
    monkeypatch.setenv("SWE_TESTBED", str(clone))
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    return clone, row


def _agent_diff(clone: Path, edits: dict[str, tuple[str, str]]) -> str:
    """The diff an agent would leave: `edits` (file -> (old, new)) made in a throwaway copy of `clone`."""
    work = clone.parent / "agent-copy"
    _git(clone.parent, "clone", "--quiet", str(clone), str(work))
    for name, (old, new) in edits.items():
        path = work / name
        text = path.read_text()
        assert old in text
        path.write_text(text.replace(old, new))
    return subprocess.run(["git", "-C", str(work), "diff"], capture_output=True, text=True, check=True).stdout


def test_the_grader_grades_in_the_images_checkout(
    testbed: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    clone, row = testbed
    report = _grade_module().grade(_rollout(row), row["patch"], tmp_path)
    assert report["resolved"] is True, report
    assert (clone / "tests" / "test_calc.py").read_text().count(
        "def test_add"
    ) == 1  # the test patch went there


def test_the_agents_edits_to_the_tests_do_not_count(
    testbed: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    clone, row = testbed
    # A wrong fix, and a test file rewritten so that its tests would pass anyway.
    cheat = _agent_diff(
        clone,
        {
            "calc.py": ("return a - b\n\n\ndef sub", "return a * b\n\n\ndef sub"),
            "tests/test_calc.py": (
                "assert sub(5, 3) == 2",
                "assert True\n\n\ndef test_add():\n    assert True",
            ),
        },
    )
    report = _grade_module().grade(_rollout(row), cheat, tmp_path)
    assert report["resolved"] is False
    assert report["FAIL_TO_PASS"] == {"passed": 0, "failed": ["tests/test_calc.py::test_add"]}


def test_a_patch_that_does_not_apply_is_a_verdict_not_an_error(
    testbed: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    _, row = testbed
    broken = row["patch"].replace("-    return a - b", "-    return a / b")
    report = _grade_module().grade(_rollout(row), broken, tmp_path)
    assert (report["resolved"], report["reason"]) == (False, "the patch does not apply")
