"""Where a server's CPU time goes while it is under load: py-spy samples, summarised by function and by package.

Used by `gateway.py --profile`; needs py-spy (`pip install py-spy`) and permission to ptrace the server.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

__all__ = ["py_spy_path", "record", "summarise"]

_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^():]+)(?::\d+)?\)$")
_LOOP_FRAMES = ("Handle._run (asyncio/events.py", "Runner.run (asyncio/runners.py")
"""Where the event loop calls a callback: asyncio's Handle._run, or (uvloop's loop is compiled, so py-spy sees no
frame of it) the Runner.run that started the loop."""
_PACKAGES = (
    "agl_lite",
    "aiohttp",
    "asyncio",
    "multidict",
    "yarl",
    "structlog",
    "json",
    "selectors",
    "socket",
    "litellm",
    "uvicorn",
    "starlette",
    "fastapi",
    "httpx",
    "httpcore",
    "pydantic",
)


def py_spy_path() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def record(
    py_spy: str, pid: int, seconds: float, out: Path, during: Callable[[], None], rate: int = 250
) -> None:
    """Sample `pid` for `seconds` while `during()` (the load) runs; the collapsed stacks land in `out`."""
    spy = subprocess.Popen(
        [
            py_spy,
            "record",
            "--pid",
            str(pid),
            "-d",
            f"{max(1, round(seconds))}",
            "-r",
            str(rate),
            "-f",
            "raw",
            "-o",
            str(out),
            "--nonblocking",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        during()
    finally:
        _, err = spy.communicate(timeout=seconds + 30)
    if spy.returncode != 0 or not out.exists():
        raise RuntimeError(f"py-spy failed ({spy.returncode}): {err.decode(errors='replace')[-400:]}")


def _function(frame: str) -> str:
    m = _FRAME.match(frame)
    return f"{m['func']} ({m['file']})" if m else frame


def _package(frame: str) -> str:
    m = _FRAME.match(frame)
    path = m["file"] if m else frame
    for pkg in _PACKAGES:
        if path.startswith((pkg + "/", pkg + ".")) or f"/{pkg}/" in path:
            return pkg
    return path.split("/", 1)[0] if "/" in path else "other"


def summarise(raw: Path, top: int = 15) -> list[str]:
    """Lines: busy samples, self time by function, inclusive time of the heaviest functions, self time by package."""
    self_fn: Counter[str] = Counter()
    incl_fn: Counter[str] = Counter()
    by_pkg: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        total += n
        self_fn[_function(frames[-1])] += n
        by_pkg[_package(frames[-1])] += n
        below = next(
            (i for i in range(len(frames) - 1, -1, -1) if any(loop in frames[i] for loop in _LOOP_FRAMES)), -1
        )
        for fn in {_function(f) for f in frames[below + 1 :]}:
            incl_fn[fn] += n
    if not total:
        return ["  (no samples)"]
    pct = 100.0 / total
    out = [f"  {total} busy samples", "  self time, top functions:"]
    out += [f"    {n * pct:5.1f}%  {fn}" for fn, n in self_fn.most_common(top)]
    out.append("  self time by package:")
    out += [f"    {n * pct:5.1f}%  {pkg}" for pkg, n in by_pkg.most_common(10)]
    out.append("  inclusive time (each loop callback's stack, the loop itself left out), top functions:")
    out += [f"    {n * pct:5.1f}%  {fn}" for fn, n in incl_fn.most_common(top)]
    return out
