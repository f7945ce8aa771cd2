"""The SWE-bench agent: Claude Code, headless (`claude -p`), in the instance's checkout, through the gateway.

A plain program (standard library only, no agl-lite import). The runner starts it with the agent contract's
environment (DESIGN.md §2); it uses:
- `AGL_TASK_INPUT` (or `AGL_TASK_URL`): `{instance_id, repo, base_commit, problem_statement[, repo_url]}`;
- `ANTHROPIC_BASE_URL` / `ANTHROPIC_API_KEY`: the gateway with this rollout and attempt in the path, and the
  rollout's agent key — the only endpoint Claude Code is given;
- `AGL_RESULT_DIR`: where the diff goes (`patch.diff`) for the grading step, which applies it to a clean checkout;
- `AGL_EVENT_URL`: one `patch` event with what Claude Code changed, for the logs.

The checkout is `SWE_TESTBED` when set (SWE-bench's images have the repository at `/testbed`, at the base commit);
otherwise `repo_url` is cloned at `base_commit` into a directory of this attempt. Claude Code runs with a HOME and
TMPDIR of its own (concurrent attempts must not share `~/.claude`), no telemetry, no auto-update, and an env that
holds nothing of the agent's but what it needs.

Settings (env): `CLAUDE_BIN` (default: `node_modules/.bin/claude` beside this file, else `claude` on PATH),
`SWE_AGENT_MODEL` (`claude-sonnet-4-6`), `SWE_AGENT_SMALL_MODEL` (`claude-haiku-4-5`; both are names
`routes.toml` maps), `SWE_AGENT_MAX_TURNS` (50), `SWE_AGENT_TOOLS` (`Bash,Read,Edit,Write,Glob,Grep`),
`SWE_AGENT_TIMEOUT_S` (3000), `SWE_AGENT_MAX_OUTPUT_TOKENS` (Claude Code's own default when unset).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PROMPT = """\
You are working in a checkout of the repository {repo} at commit {base_commit} (SWE-bench instance \
{instance_id}). Resolve the issue below by editing the repository's source files.

<issue>
{problem_statement}
</issue>

Make the smallest change that resolves the issue. Do not add or change tests: the change is graded with the \
repository's own tests, which replace yours."""
# Claude Code's own state: never part of the diff, wherever it puts it.
EXCLUDE = (":(exclude).claude", ":(exclude)CLAUDE.md")
PASS_THROUGH = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ")


class CannotRun(Exception):
    """The task cannot be run here (no checkout, no Claude Code): exit 2, which no retry fixes."""


def task() -> dict[str, Any]:
    raw = os.environ.get("AGL_TASK_INPUT")
    if raw is None:  # a large input is served by the gateway instead of the environment
        req = urllib.request.Request(
            os.environ["AGL_TASK_URL"], headers={"Authorization": f"Bearer {os.environ['ANTHROPIC_API_KEY']}"}
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            raw = resp.read().decode()
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise CannotRun("the task input is not a JSON object")
    return data


def post_event(kind: str, data: dict[str, Any]) -> None:
    url = os.environ.get("AGL_EVENT_URL")
    if not url:
        return
    req = urllib.request.Request(
        url,
        data=json.dumps({"kind": kind, "data": data}).encode(),
        headers={
            "Authorization": f"Bearer {os.environ['ANTHROPIC_API_KEY']}",
            "Content-Type": "application/json",
        },
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=30):
        pass


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0"}
    done = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, env=env, check=False
    )
    if done.returncode != 0:
        raise CannotRun(f"git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def checkout(t: dict[str, Any], scratch: Path) -> Path:
    """The repository at the base commit: the image's (SWE_TESTBED) or a fresh clone of `repo_url`."""
    testbed = os.environ.get("SWE_TESTBED")
    if testbed:
        repo = Path(testbed)
    elif t.get("repo_url"):
        repo = scratch / "repo"
        git(scratch, "clone", "--quiet", "--no-checkout", str(t["repo_url"]), str(repo))
    else:
        raise CannotRun("no checkout: set SWE_TESTBED or give the task a repo_url")
    git(repo, "checkout", "--quiet", "--detach", str(t["base_commit"]))
    return repo


def claude_bin() -> str:
    configured = os.environ.get("CLAUDE_BIN")
    if configured:
        return configured
    local = HERE / "node_modules" / ".bin" / "claude"
    if local.exists():
        return str(local)
    found = shutil.which("claude")
    if found is None:
        raise CannotRun("Claude Code not found: run `npm ci` in examples/swe-bench or set CLAUDE_BIN")
    return found


def claude_env(scratch: Path) -> dict[str, str]:
    """Only what Claude Code needs: the gateway, the model names, a home of its own, and quiet."""
    home, tmp = scratch / "home", scratch / "tmp"
    home.mkdir()
    tmp.mkdir()
    env = {k: os.environ[k] for k in PASS_THROUGH if k in os.environ}
    env.update(
        HOME=str(home),
        TMPDIR=str(tmp),
        ANTHROPIC_BASE_URL=os.environ["ANTHROPIC_BASE_URL"],
        ANTHROPIC_API_KEY=os.environ["ANTHROPIC_API_KEY"],
        ANTHROPIC_MODEL=os.environ.get("SWE_AGENT_MODEL", "claude-sonnet-4-6"),
        # The small/fast model Claude Code uses for side calls: also a name routes.toml must map.
        ANTHROPIC_DEFAULT_HAIKU_MODEL=os.environ.get("SWE_AGENT_SMALL_MODEL", "claude-haiku-4-5"),
        ANTHROPIC_SMALL_FAST_MODEL=os.environ.get("SWE_AGENT_SMALL_MODEL", "claude-haiku-4-5"),
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        DISABLE_AUTOUPDATER="1",
        DISABLE_TELEMETRY="1",
        DISABLE_ERROR_REPORTING="1",
    )
    # Claude Code asks for 32000 output tokens; a model served with a small context cannot take that.
    if os.environ.get("SWE_AGENT_MAX_OUTPUT_TOKENS"):
        env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = os.environ["SWE_AGENT_MAX_OUTPUT_TOKENS"]
    return env


def run_claude(repo: Path, prompt: str, env: dict[str, str]) -> tuple[int, dict[str, Any]]:
    argv = [
        claude_bin(),
        "-p",
        prompt,
        "--output-format",
        "json",
        "--max-turns",
        os.environ.get("SWE_AGENT_MAX_TURNS", "50"),
        "--permission-mode",
        "acceptEdits",
        "--allowedTools",
        os.environ.get("SWE_AGENT_TOOLS", "Bash,Read,Edit,Write,Glob,Grep"),
    ]
    timeout = float(os.environ.get("SWE_AGENT_TIMEOUT_S", "3000"))
    try:
        done = subprocess.run(
            argv, cwd=repo, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return 124, {"is_error": True, "result": f"Claude Code timed out after {timeout:g} s"}
    sys.stderr.write(done.stderr[-4000:])
    try:
        result = json.loads(done.stdout)
    except ValueError:
        result = {"raw": done.stdout[-2000:]}
    return done.returncode, result if isinstance(result, dict) else {"raw": result}


def diff(repo: Path, base_commit: str) -> str:
    """Everything Claude Code changed, new files included, as one patch against the base commit."""
    git(repo, "add", "--all", "--", ".", *EXCLUDE)
    return git(repo, "diff", "--cached", "--binary", base_commit, "--", ".", *EXCLUDE)


def main() -> int:
    try:
        return run()
    except CannotRun as exc:
        print(f"agent: {exc}", file=sys.stderr)
        return 2


def run() -> int:
    t = task()
    with tempfile.TemporaryDirectory(prefix="swe-agent-") as tmp:
        scratch = Path(tmp)
        repo = checkout(t, scratch)
        prompt = PROMPT.format(
            repo=t.get("repo", ""),
            base_commit=t["base_commit"],
            instance_id=t.get("instance_id", ""),
            problem_statement=t["problem_statement"],
        )
        code, result = run_claude(repo, prompt, claude_env(scratch))
        patch = diff(repo, str(t["base_commit"]))
    out_dir = os.environ.get("AGL_RESULT_DIR")
    if out_dir:
        Path(out_dir, "patch.diff").write_text(patch, encoding="utf-8")
    else:
        sys.stdout.write(patch)
    post_event(
        "patch",
        {
            "instance_id": t.get("instance_id"),
            "bytes": len(patch.encode()),
            "files": patch.count("\ndiff --git ") + patch.startswith("diff --git "),
            "claude_exit_code": code,
            "num_turns": result.get("num_turns"),
            "is_error": result.get("is_error"),
            "result": str(result.get("result", ""))[:500],
        },
    )
    print(f"agent: Claude Code exited {code} after {result.get('num_turns')} turns; patch {len(patch)} bytes")
    return 0 if code == 0 else 1  # a failed session may go better on another attempt (2 means it cannot)


if __name__ == "__main__":
    sys.exit(main())
