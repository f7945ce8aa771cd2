"""The math PoC end to end with real processes: run.sh starts the mock vLLM, the gateway (SQLite, local runner)
and the RL loop; the agents are real processes using the openai SDK. Afterwards the test opens the store itself.

The mock answers GSM8K questions, wrong for a seeded subset whose rule is public (a hash of seed, question and
the how-many-th time it was asked, `agl_lite.testing.mock_vllm.math_tutor`); the test re-states that rule and scores
every answer with its own parser, written here, not imported from the example.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from agl_lite.store.records import CallOutcome, RolloutStatus
from agl_lite.store.sqlite import SQLiteStore

ROOT = Path(__file__).resolve().parents[2]
RUN_SH = ROOT / "examples" / "math-poc" / "run.sh"
GSM8K = ROOT.parent / "shared" / "data" / "gsm8k" / "test.jsonl"
SEED, WRONG_RATE, SAMPLES = 7, 0.4, 2

pytestmark = pytest.mark.slow


def _wrong(question: str, k: int) -> bool:
    digest = hashlib.sha256(f"{SEED}\x00{question}\x00{k}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < WRONG_RATE


def _reference(answer_field: str) -> str:
    number = answer_field.rsplit("####", 1)[1].strip().replace(",", "")
    return str(int(float(number))) if float(number) == int(float(number)) else number


def _answer_in(text: str) -> str | None:
    found = re.findall(r"####\s*(-?[\d,]*\.?\d+)", text)
    if not found:
        return None
    value = float(found[-1].replace(",", ""))
    return str(int(value)) if value == int(value) else str(value)


def _problems(path: Path, n: int) -> list[dict[str, str]]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return rows[:n]


def _run_demo(tmp_path: Path, data: Path, problems: int) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "AGL_DEMO_PYTHON": sys.executable,
        "AGL_DEMO_CONCURRENCY": "6",
        "AGL_DEMO_SUMMARY": str(tmp_path / "summary.json"),
    }
    env.pop("AGL_URL", None)
    return subprocess.run(
        [
            str(RUN_SH),
            "--mode",
            "mock",
            "--runner",
            "local",
            "--iterations",
            "1",
            "--problems",
            str(problems),
            "--samples",
            str(SAMPLES),
            "--seed",
            str(SEED),
            "--wrong-rate",
            str(WRONG_RATE),
            "--data",
            str(data),
            "--workdir",
            str(tmp_path / "run"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.parametrize("dataset", ["example", "gsm8k"])
async def test_the_loop_solves_exactly_what_the_mock_answered_right(tmp_path: Path, dataset: str) -> None:
    if dataset == "gsm8k" and not GSM8K.exists():
        pytest.skip(f"{GSM8K} is not on this machine")
    data = ROOT / "examples" / "math-poc" / "problems.jsonl" if dataset == "example" else GSM8K
    problems = _problems(data, 5)
    done = _run_demo(tmp_path, data, len(problems))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    expected_solved = sum(not _wrong(p["question"].strip(), k) for p in problems for k in range(SAMPLES))
    assert 0 < expected_solved < len(problems) * SAMPLES  # the seed gives a mix, or the test proves little

    store = await SQLiteStore.open(tmp_path / "run" / "agl-lite.db")
    try:
        rollouts = await store.list_rollouts()
        assert len(rollouts) == len(problems) * SAMPLES
        by_question = {p["question"].strip(): _reference(p["answer"]) for p in problems}
        solved, asked = 0, Counter[str]()
        for rollout in rollouts:
            assert rollout.status is RolloutStatus.SUCCEEDED, rollout
            question = rollout.input["question"]
            assert "answer" not in rollout.input  # the reference stays in metadata, away from the agent
            assert rollout.metadata["answer"] == by_question[question]
            asked[question] += 1

            calls = await store.calls(rollout.id)
            assert len(calls) == 1
            (call,) = calls
            assert call.outcome is CallOutcome.OK
            assert call.complete is True
            assert call.prompt_token_ids is not None
            assert len(call.prompt_token_ids) > 0
            (choice,) = call.choices
            assert len(choice.token_ids) == call.usage["completion_tokens"]
            mine = 1.0 if _answer_in(choice.text or "") == by_question[question] else 0.0

            rewards = await store.events(rollout.id, kind="reward")
            assert [e.data["value"] for e in rewards] == [mine]
            solved += int(mine)
        assert solved == expected_solved
        assert set(asked.values()) == {SAMPLES}
    finally:
        await store.close()

    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary[0]["solved"] == expected_solved
    assert summary[0]["calls_with_token_ids"] == len(problems) * SAMPLES


def test_make_demo_math_from_a_fresh_copy(tmp_path: Path) -> None:
    """`make demo-math` in a copy of the working tree (what `git clone` would give, untracked files included), with
    a new virtual environment: nothing but Python on the PATH is assumed."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    clone = tmp_path / "agl-lite"
    for name in filter(None, listed):
        src = ROOT / name.decode()
        if src.is_file():
            dst = clone / name.decode()
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGL_", "VIRTUAL_ENV"))}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if ".venv" not in p)
    done = subprocess.run(
        ["make", "demo-math", f"PYTHON={sys.base_prefix}/bin/python3"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    tail = done.stdout[-4000:] + done.stderr[-4000:]
    assert done.returncode == 0, tail
    assert "math PoC" in done.stdout, tail
    assert "Where the data is" in done.stdout, tail
    assert (clone / "examples" / "math-poc" / ".run" / "agl-lite.db").exists()
