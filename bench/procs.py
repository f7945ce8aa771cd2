"""Child processes of the bench: spawn each server in its own session, wait for readiness, always clean up.

Readiness is polled (bounded), never slept for. `Children.stop_all()` terminates only what it spawned, by pid.
`Placement` pins the server under test to one CPU and the load side (hey, the upstream) to the others.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

__all__ = [
    "BenchError",
    "Children",
    "Placement",
    "bench_main",
    "free_port",
    "http_get",
    "pinned",
    "process_frame",
]


class BenchError(RuntimeError):
    """A server did not start or answer as expected; the message says which and shows its log tail."""


@dataclass(frozen=True)
class Placement:
    """CPUs for the server under test and for the load side (hey and the upstream); None means unpinned.

    A Python gateway uses one core; pinning it apart from the load generator keeps the scheduler from moving
    work between the three busy processes, which on a 2-CPU box otherwise swings req/s by +-30 % run to run.
    """

    server: frozenset[int] | None = None
    load: frozenset[int] | None = None

    @classmethod
    def choose(cls, pin: bool) -> Placement:
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        if not pin or len(cpus) < 2:
            return cls()
        return cls(frozenset(cpus[:1]), frozenset(cpus[1:]))

    def describe(self) -> str:
        if self.server is None or self.load is None:
            return "unpinned"
        return f"server under test on CPU {_cpus(self.server)}, hey + upstream on CPU {_cpus(self.load)}"


def _cpus(cpus: frozenset[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def pinned(cpus: frozenset[int] | None) -> Callable[[], None] | None:
    """A preexec_fn pinning the child to `cpus` before it execs, so that every thread it starts inherits them."""
    if not cpus:
        return None

    def pin() -> None:
        os.sched_setaffinity(0, cpus)

    return pin


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def http_get(url: str, headers: Mapping[str, str] | None = None, timeout: float = 2.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join("    " + line for line in text[-lines:]) or "    (empty log)"


class Children:
    """The servers this bench started; a context manager that stops them all on exit, errors and Ctrl-C included."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def __enter__(self) -> Children:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()

    def log(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def spawn(
        self,
        name: str,
        argv: Sequence[str],
        *,
        cpus: frozenset[int] | None = None,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        with self.log(name).open("wb") as out:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                cwd=cwd,
                start_new_session=True,
                preexec_fn=pinned(cpus),  # safe: the bench starts no threads
            )
        self.procs[name] = proc
        return proc

    def wait_ready(
        self, name: str, url: str, timeout_s: float, headers: Mapping[str, str] | None = None
    ) -> None:
        """Poll `url` until it answers 200; fail early if the process exits, or after `timeout_s`."""
        proc = self.procs[name]
        deadline = time.monotonic() + timeout_s
        delay = 0.02
        last = "no answer"
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise BenchError(
                    f"{name} exited with status {proc.returncode} before it was ready; its log:\n"
                    f"{log_tail(self.log(name))}"
                )
            try:
                status, _ = http_get(url, headers, timeout=1.0)
                if status == 200:
                    return
                last = f"HTTP {status}"
            except OSError as exc:
                last = type(exc).__name__
            time.sleep(delay)
            delay = min(delay * 1.5, 0.25)
        raise BenchError(
            f"{name} was not ready at {url} after {timeout_s:.0f} s ({last}); its log:\n"
            f"{log_tail(self.log(name))}"
        )

    def pid(self, name: str) -> int:
        return self.procs[name].pid

    def stop_all(self, grace_s: float = 5.0) -> None:
        """SIGTERM each child's own process group (it was started in a new session), then SIGKILL stragglers."""
        for proc in self.procs.values():
            if proc.poll() is None:
                _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
            _signal_group(proc, signal.SIGKILL)  # workers a server forked and left behind in its group
        self.procs.clear()


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)  # the group id is the child's pid: start_new_session=True


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def bench_main(
    name: str,
    run: Callable[[argparse.Namespace, str, Path], int],
    args: argparse.Namespace,
    hey: str | None,
    missing: str,
    tmp_prefix: str,
) -> int:
    """A bench's process frame: hey present, every child stopped on any exit (Ctrl-C, SIGTERM, SIGHUP, errors),
    the temp dir removed unless --keep-logs; returns the exit status."""
    if hey is None:
        print(f"{name}: {missing}", file=sys.stderr)
        return 2
    return process_frame(name, lambda a, tmp: run(a, hey, tmp), args, tmp_prefix)


def process_frame(
    name: str, run: Callable[[argparse.Namespace, Path], int], args: argparse.Namespace, tmp_prefix: str
) -> int:
    """Run `run(args, tmp)` with every child stopped on any exit (Ctrl-C, SIGTERM, SIGHUP, errors) and the temp
    dir removed unless --keep-logs; returns the exit status."""
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started with SIGINT ignored
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGHUP, _terminate)
    tmp = Path(tempfile.mkdtemp(prefix=tmp_prefix))
    try:
        return run(args, tmp)
    except BenchError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{name}: interrupted; servers stopped", file=sys.stderr)
        return 130
    finally:
        if args.keep_logs:
            print(f"{name}: logs and configs kept in {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
