"""`agl-lite run --workers N`: N gateway processes on one port, started and watched by this one.

Each worker is `agl-lite run` itself (the same config, `AGL_WORKER` set), binding the port with SO_REUSEPORT: the
kernel spreads new connections among them, and none of them depends on another. They share what must be shared
through the store on PostgreSQL (docs/store.md, "Several gateways on PostgreSQL"); SQLite and a runner belong to
one process, and a worker refuses them (exit 2).

This process serves nothing: it forwards SIGINT and SIGTERM to the workers and waits for them (each drains its own
flows, `server.shutdown_timeout`), and starts again a worker that died, at most once a second. A worker that fails
its start (a config error, a port taken) stops them all: the same would fail again.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

import structlog

__all__ = ["WORKER_ENV", "die_with_parent", "supervise"]

log = structlog.get_logger("agl_lite.workers")

WORKER_ENV = "AGL_WORKER"
"""Set in a worker's environment (its index): it serves rather than supervises."""
_PR_SET_PDEATHSIG = 1
SUPERVISOR_ENV = "AGL_WORKER_SUPERVISOR"
"""The supervisor's pid, in a worker's environment: if its parent is another by the time it asks, it died."""
START_S = 5.0
"""A worker that exits sooner than this after its start failed its start."""


def die_with_parent() -> None:
    """In a worker: SIGTERM when the process that started it dies, even by SIGKILL (no worker left serving alone
    with nobody to stop it). Linux only; elsewhere nothing."""
    if not sys.platform.startswith("linux"):
        return
    parent = int(os.environ.get(SUPERVISOR_ENV, "0"))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # it died before the prctl (then this process's parent is another)
        os.kill(os.getpid(), signal.SIGTERM)


def supervise(config: Path, workers: int, shutdown_timeout: float) -> int:
    """Run `workers` workers until SIGINT or SIGTERM; the exit code (0 after a clean stop)."""
    env = dict(
        os.environ
    )  # (the admin key with it: the workers read it, then wipe it from their own environment)
    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)

    def start(index: int) -> tuple[subprocess.Popen[bytes], float]:
        argv = [sys.executable, "-m", "agl_lite", "run", "--config", str(config), "--workers", str(workers)]
        proc = subprocess.Popen(argv, env={**env, WORKER_ENV: str(index), SUPERVISOR_ENV: str(os.getpid())})
        log.info("worker started", worker=index, pid=proc.pid)
        return proc, time.monotonic()

    procs = [start(i) for i in range(workers)]
    code = 0
    while not stopping:
        for i, (proc, since) in enumerate(procs):
            rc = proc.poll()
            if rc is None:
                continue
            if time.monotonic() - since < START_S:
                log.error("worker failed to start; stopping", worker=i, exit_code=rc)
                stopping, code = True, rc or 1
                break
            log.warning("worker died; starting it again", worker=i, exit_code=rc)
            procs[i] = start(i)
        if not stopping:
            time.sleep(0.2)  # (a bounded wait between two looks: the workers run on their own)
    for proc, _ in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + shutdown_timeout + 5
    for proc, _ in procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return code
