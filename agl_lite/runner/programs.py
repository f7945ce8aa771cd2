"""Whether a program can start, asked the way exec will resolve it: once at start-up for the configured commands
(a config error then), and again for each step (a failed attempt then, with the same reason)."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

__all__ = ["cannot_start"]


def cannot_start(program: str, search_path: str, cwd: Path) -> str | None:
    """Why exec would fail for `program` (a path is taken from `cwd`, a bare name looked up on `search_path`), as
    `strerror` says it; None when it would start."""
    if "/" in program:
        path = cwd / program
        if not path.exists():
            return os.strerror(errno.ENOENT)
        if not (path.is_file() and os.access(path, os.X_OK)):
            return os.strerror(errno.EACCES)
        return None
    return None if shutil.which(program, path=search_path) else os.strerror(errno.ENOENT)
