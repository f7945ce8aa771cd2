"""The admin key's source: the variable or the `_FILE` it names, and what `protect_process` leaves of it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agl_lite.core import key_source
from agl_lite.errors import ConfigError

KEY = "k-" + "7" * 40

CHILD = """
import ctypes, os, sys
from agl_lite.core.key_source import protect_process, read_key
assert read_key("AGL_KEY") == sys.argv[1]
protect_process()
libc = ctypes.CDLL(None)
print(libc.prctl(3, 0, 0, 0, 0))  # PR_GET_DUMPABLE
print(read_key("AGL_KEY") == sys.argv[1], "AGL_KEY" in os.environ)
sys.stdout.flush()
sys.stdin.read()  # held until the test has read /proc/PID/environ
"""


def test_the_variable_wins_then_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "key").write_text(KEY + "\n")
    monkeypatch.setenv("AGL_KEY_FILE", str(tmp_path / "key"))
    monkeypatch.delenv("AGL_KEY", raising=False)
    assert key_source.read_key("AGL_KEY") == KEY
    assert key_source.key_file("AGL_KEY") == tmp_path / "key"
    monkeypatch.setenv("AGL_KEY", "from-the-env-0123456789")
    assert key_source.read_key("AGL_KEY") == "from-the-env-0123456789"


def test_an_unreadable_key_file_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGL_KEY", raising=False)
    monkeypatch.setenv("AGL_KEY_FILE", str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="AGL_KEY_FILE: cannot read"):
        key_source.read_key("AGL_KEY")


def test_a_protected_process_shows_no_key_in_its_environment_block_and_is_not_dumpable() -> None:
    with subprocess.Popen(
        [sys.executable, "-c", CHILD, KEY],
        env={"AGL_KEY": KEY, "PATH": "/usr/bin:/bin"},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        assert proc.stdin is not None
        dumpable = proc.stdout.readline().strip()
        still_read, in_environ = proc.stdout.readline().split()
        try:
            block = Path(f"/proc/{proc.pid}/environ").read_bytes()  # as root: readable, and wiped
        except PermissionError:  # not root: a non-dumpable process's /proc files are closed to us
            block = b""
        proc.stdin.close()
    assert dumpable == "0"
    assert (still_read, in_environ) == ("True", "False")  # the process itself still has it
    assert KEY.encode() not in block
