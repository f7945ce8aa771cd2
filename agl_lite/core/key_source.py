"""Where the admin key comes from, and keeping it inside this process (docs/runners.md, "What a local agent can
reach").

`read_key("AGL_KEY")` takes the variable, else the file that `AGL_KEY_FILE` names, else the key this process read
before it wiped the variable. `protect_process()` (what `agl-lite run` calls once it is configured) makes the process
non-dumpable, so that other processes of the same user can read neither its `/proc` files nor its memory, and
wipes every key read from the environment, the block `/proc/PID/environ` shows included.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

from agl_lite.errors import ConfigError

__all__ = ["key_file", "protect_process", "read_key"]

_PR_SET_DUMPABLE = 4

_read: dict[str, str] = {}
"""Keys by variable name, as read from the environment: what `protect_process` wipes."""
_wiped: dict[str, str] = {}
"""The keys `protect_process` wiped: what `read_key` answers for them from then on."""


def key_file(env_name: str) -> Path | None:
    """The file `{env_name}_FILE` names, if it does."""
    name = os.environ.get(f"{env_name}_FILE")
    return Path(name) if name else None


def read_key(env_name: str) -> str:
    """The key in `env_name`, else in the file `{env_name}_FILE` names (stripped), else the one `protect_process`
    wiped; empty when there is none. ConfigError when the file cannot be read."""
    value = os.environ.get(env_name)
    if value:
        _read[env_name] = value
        return value
    path = key_file(env_name)
    if path is not None:
        try:
            value = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{env_name}_FILE: cannot read {str(path)!r}: {exc}") from exc
        return value
    return _wiped.get(env_name, "")


def protect_process() -> None:
    """Non-dumpable, and every key read so far gone from the environment (no-op off Linux)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")
    for name, value in _read.items():
        _wipe(libc, name)
        _wiped[name] = value


def _wipe(libc: ctypes.CDLL, name: str) -> None:
    """Overwrite `NAME=value` in place (the kernel shows the original block, whatever `unsetenv` does to the
    pointers), then drop it from `os.environ` and the C environment."""
    prefix = os.fsencode(name) + b"="
    environ = ctypes.POINTER(ctypes.c_void_p).in_dll(libc, "environ")
    i = 0
    while (addr := environ[i]) is not None:
        entry = ctypes.string_at(addr)
        if entry.startswith(prefix):
            ctypes.memset(addr + len(prefix), 0, len(entry) - len(prefix))
        i += 1
    os.environ.pop(name, None)
