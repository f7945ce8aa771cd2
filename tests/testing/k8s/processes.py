"""What the fake kubelet's tests ask of the local processes it runs."""

from __future__ import annotations

from pathlib import Path


def alive(pid: int) -> bool:
    """Whether `pid` is a live process (a reaped or zombie one is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")
