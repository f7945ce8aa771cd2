"""The SWE-bench grading step: the agent's diff on a clean checkout, the instance's tests, the reward.

The runner starts it after the agent exited 0, with the grader env (docs/runners.md): `AGL_GRADER_KEY` (which the
agent never had), `AGL_GRADE_URL` and `AGL_RESULT_DIR`, where the agent left `patch.diff`. As SWE-bench's harness
does, it reads the instance from the rollout's metadata (`GET $AGL_GRADE_URL`: test patch, FAIL_TO_PASS,
PASS_TO_PASS, test command), applies the agent's patch to a clean checkout at the base commit, puts the test files
back to the base commit and applies the test patch over them, runs the tests and reads pytest's `-rA` summary. The
reward is 1 when every FAIL_TO_PASS and PASS_TO_PASS test passed, else 0; it is posted last, after a
`swe_bench_report` event with the details. Exit 0 means a verdict was posted (a patch that does not apply is a
verdict: 0); 2, that the instance could not be graded (no checkout, a test patch that does not apply).

The clean checkout is `SWE_TESTBED` when set (on Kubernetes the grader is the pod's main container: its
`/testbed` is the image's, untouched by the agent's init container), else a clone of the metadata's `repo_url`.
Standard library only; `SWE_TEST_TIMEOUT_S` (default 1800) bounds the test run.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

PASSING = frozenset({"PASSED", "XFAIL"})
"""SWE-bench's harness counts an expected failure as a pass too."""
_SUMMARY = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS) (.+)$")
_DIFF_FILE = re.compile(r"^diff --git a/(.+?) b/(.+)$", re.MULTILINE)
# What the tests must not see: the code under test is the agent's, and may try to reward itself.
_SECRET_ENV = ("AGL_GRADER_KEY", "AGL_GRADE_URL", "AGL_KEY", "OPENAI_API_KEY", "ANTHROPIC_API_KEY")


class Ungradable(Exception):
    """The instance cannot be graded here (exit 2): not the agent's fault, so no reward is posted."""


def call(method: str, body: dict[str, Any] | None = None) -> Any:
    req = urllib.request.Request(
        os.environ["AGL_GRADE_URL"],
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={
            "Authorization": f"Bearer {os.environ['AGL_GRADER_KEY']}",
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.load(resp)


def run(argv: list[str], cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in _SECRET_ENV}
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_TERMINAL_PROMPT="0")
    return subprocess.run(argv, cwd=cwd, input=stdin, capture_output=True, text=True, env=env, check=False)


def git(repo: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return run(["git", *args], repo, stdin)


def clean_checkout(meta: dict[str, Any], scratch: Path) -> Path:
    testbed = os.environ.get("SWE_TESTBED")
    if testbed:
        repo = Path(testbed)
        if git(repo, "rev-parse", "HEAD").stdout.strip() == meta["base_commit"]:
            return repo  # the image's checkout as its build left it (what it installed in place stays)
    elif meta.get("repo_url"):
        repo = scratch / "repo"
        done = git(scratch, "clone", "--quiet", "--no-checkout", str(meta["repo_url"]), str(repo))
        if done.returncode != 0:
            raise Ungradable(f"cannot clone {meta['repo_url']}: {done.stderr.strip()}")
    else:
        raise Ungradable("no clean checkout: set SWE_TESTBED or give the metadata a repo_url")
    done = git(repo, "checkout", "--quiet", "--force", "--detach", str(meta["base_commit"]))
    if done.returncode != 0:
        raise Ungradable(f"cannot check out {meta['base_commit']}: {done.stderr.strip()}")
    return repo


def apply(repo: Path, patch: str) -> bool:
    """SWE-bench's order: `git apply`, then GNU patch with fuzz (diffs written by hand are often a little off)."""
    if git(repo, "apply", "--verbose", "-", stdin=patch).returncode == 0:
        return True
    if shutil.which("patch") is None:
        return False
    return run(["patch", "--batch", "--fuzz=5", "-p1", "--forward"], repo, patch).returncode == 0


def patched_files(patch: str) -> list[str]:
    return [b for _, b in _DIFF_FILE.findall(patch)]


def reset_tests(repo: Path, base_commit: str, files: list[str]) -> None:
    """Test files back to the base commit (or gone, if the test patch creates them): the agent's edits to the
    tests never count."""
    for name in files:
        if git(repo, "cat-file", "-e", f"{base_commit}:{name}").returncode == 0:
            git(repo, "checkout", base_commit, "--", name)
        else:
            (repo / name).unlink(missing_ok=True)


def run_tests(repo: Path, command: str, files: list[str]) -> tuple[str, bool]:
    """The test command with the test files appended, in its own process group (killed afterwards, so nothing it
    started outlives the verdict); returns the log and whether it timed out."""
    timeout = float(os.environ.get("SWE_TEST_TIMEOUT_S", "1800"))
    shell = shutil.which("bash") or "/bin/sh"
    script = " ".join([command, *(shlex.quote(f) for f in files)])
    env = {k: v for k, v in os.environ.items() if k not in _SECRET_ENV}
    proc = subprocess.Popen(
        [shell, "-c", script],
        cwd=repo,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        log, timed_out = proc.communicate(timeout=timeout)[0], False
    except subprocess.TimeoutExpired:
        log, timed_out = "", True
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    if timed_out:
        log = proc.communicate()[0] or ""
    return log, timed_out


def parse_pytest(log: str) -> dict[str, str]:
    """Test id → status from pytest's `-rA` short summary (`PASSED id`, `FAILED id - message`)."""
    out: dict[str, str] = {}
    for line in log.splitlines():
        m = _SUMMARY.match(line.strip())
        if m:
            status, rest = m.groups()
            out[rest.split(" - ", 1)[0] if status in ("FAILED", "ERROR") else rest] = status
    return out


def grade(rollout: dict[str, Any], patch: str, scratch: Path) -> dict[str, Any]:
    meta = rollout["metadata"]
    f2p, p2p = list(meta["FAIL_TO_PASS"]), list(meta["PASS_TO_PASS"])
    report: dict[str, Any] = {"instance_id": meta.get("instance_id"), "patch_bytes": len(patch.encode())}
    if not patch.strip():
        return {**report, "resolved": False, "reason": "empty patch"}
    repo = clean_checkout(meta, scratch)
    if not apply(repo, patch):
        return {**report, "resolved": False, "reason": "the patch does not apply"}
    test_files = patched_files(meta["test_patch"])
    reset_tests(repo, str(meta["base_commit"]), test_files)
    if not apply(repo, meta["test_patch"]):
        raise Ungradable("the instance's test patch does not apply over the agent's patch at the base commit")
    # The files of the test patch, and those the named tests live in (pytest ids: `path::name`).
    files = list(dict.fromkeys(test_files + [t.split("::", 1)[0] for t in f2p + p2p if "::" in t]))
    log, timed_out = run_tests(repo, str(meta.get("test_cmd") or "python -m pytest -rA"), files)
    status = parse_pytest(log)
    failed_f2p = [t for t in f2p if status.get(t) not in PASSING]
    failed_p2p = [t for t in p2p if status.get(t) not in PASSING]
    return {
        **report,
        "resolved": not timed_out and not failed_f2p and not failed_p2p,
        "reason": "tests timed out" if timed_out else None,
        "FAIL_TO_PASS": {"passed": len(f2p) - len(failed_f2p), "failed": failed_f2p},
        "PASS_TO_PASS": {"passed": len(p2p) - len(failed_p2p), "failed": failed_p2p},
        "log_tail": log[-2000:],
    }


def main() -> int:
    rollout = call("GET")  # the metadata holds the tests and the test patch; the agent's key cannot read it
    result_dir = os.environ.get("AGL_RESULT_DIR")
    path = Path(result_dir, "patch.diff") if result_dir else None
    patch = path.read_text(encoding="utf-8") if path is not None and path.exists() else ""
    try:
        with tempfile.TemporaryDirectory(prefix="swe-grade-") as tmp:
            report = grade(rollout, patch, Path(tmp))
    except Ungradable as exc:
        print(f"grade: cannot grade {rollout['id']}: {exc}", file=sys.stderr)
        return 2
    reward = 1.0 if report["resolved"] else 0.0
    call("POST", {"kind": "swe_bench_report", "data": report})
    call("POST", {"kind": "reward", "value": reward})  # last: the reward a rollout ends with
    print(f"grade: {report.get('instance_id')}: reward {reward} ({report.get('reason') or 'tests ran'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
