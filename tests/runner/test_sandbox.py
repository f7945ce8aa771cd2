"""`sandbox.py` on its own: what a command inside it sees of the file tree and of other processes, and how its
end is reported. (`test_local.py` runs it through the local backend, `tests/reliability/test_hostile_agent.py`
attacks it.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from agl_lite.runner.local import SANDBOX
from agl_lite.runner.sandbox import CANNOT_EXEC, SETUP_FAILED


def sandboxed(tmp_path: Path, script: str, **spec: object) -> subprocess.CompletedProcess[str]:
    own = tmp_path / "base" / "own"
    own.mkdir(parents=True, exist_ok=True)
    full = {"own": [str(own)], "mask_dirs": [str(tmp_path / "base")], "mask_files": [], **spec}
    full["runner_pid"] = os.getpid()
    return subprocess.run(
        [sys.executable, "-I", "-S", str(SANDBOX), json.dumps(full), "/bin/sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )


def test_a_masked_file_reads_empty_and_the_rest_reads_as_it_is(tmp_path: Path) -> None:
    (tmp_path / "store.db").write_text("the store")
    (tmp_path / "plain.txt").write_text("plain")
    done = sandboxed(tmp_path, "cat store.db; echo; cat plain.txt", mask_files=[str(tmp_path / "store.db")])
    assert done.stdout.splitlines() == ["", "plain"]
    assert (tmp_path / "store.db").read_text() == "the store"


def test_only_its_own_directories_are_writable(tmp_path: Path) -> None:
    (tmp_path / "base" / "other").mkdir(parents=True)
    (tmp_path / "base" / "other" / "theirs").write_text("x")
    done = sandboxed(
        tmp_path,
        "echo a > base/own/mine && echo own-ok; echo b > outside 2>/dev/null || echo outside-refused;"
        " ls base; cat base/other/theirs 2>/dev/null || echo others-hidden",
    )
    assert done.stdout.splitlines() == ["own-ok", "outside-refused", "own", "others-hidden"]
    assert (tmp_path / "base" / "own" / "mine").read_text() == "a\n"
    assert not (tmp_path / "outside").exists()


def test_it_sees_only_its_own_processes_and_has_no_capabilities(tmp_path: Path) -> None:
    done = sandboxed(tmp_path, "ls /proc | grep -c '^[0-9]'; grep CapEff /proc/self/status")
    count, caps = done.stdout.splitlines()
    assert int(count) <= 4  # init, the shell, ls and grep
    assert caps.split() == ["CapEff:", "0000000000000000"]


def test_its_exit_code_and_its_death_by_signal_are_passed_on(tmp_path: Path) -> None:
    assert sandboxed(tmp_path, "exit 7").returncode == 7
    assert sandboxed(tmp_path, "kill -TERM $$").returncode == -15


def test_a_command_that_cannot_start_and_a_setup_that_fails_say_why(tmp_path: Path) -> None:
    missing = subprocess.run(
        [
            sys.executable,
            "-I",
            "-S",
            str(SANDBOX),
            json.dumps({"own": [], "mask_dirs": [], "mask_files": [], "runner_pid": os.getpid()}),
            "no-such-program",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert missing.returncode == CANNOT_EXEC
    assert "agl-lite sandbox: cannot start 'no-such-program'" in missing.stderr
    broken = sandboxed(tmp_path, "true", mask_files=[str(tmp_path / "no-such-file")])
    assert broken.returncode == SETUP_FAILED
    assert broken.stderr.startswith("agl-lite sandbox: mount ")
    assert "Traceback" not in broken.stderr
