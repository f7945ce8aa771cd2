"""One command as a local process in its own session (so its whole process group can be signalled), with a
wall-clock limit (SIGTERM, then SIGKILL after a grace period) and the tail of its output kept. No store, no env
building: `local.py` decides what to run and what an exit means.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

__all__ = ["Exit", "GroupProcess", "OutputTail"]

DRAIN_S = 2.0
"""How long to wait for the last output once the process group is gone (a detached grandchild may hold the
pipe open; its output is then left unread)."""


class OutputTail:
    """Keeps the last `limit` bytes of a stream in memory, however long the stream."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.total = 0
        """Bytes seen in all."""
        self._buf = bytearray()

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        self._buf += data
        if len(self._buf) > 2 * self.limit:  # trim now and then, not on every read
            del self._buf[: len(self._buf) - self.limit]

    def text(self) -> str:
        kept = self._buf[len(self._buf) - self.limit :] if self.limit else b""
        return bytes(kept).decode("utf-8", "replace")


@dataclass(frozen=True, slots=True)
class Exit:
    returncode: int
    """The exit status; a death by signal N reads 128 + N, as a shell (and Kubernetes) reports it."""
    signal: int | None
    """The signal that ended it, if one did."""
    timed_out: bool
    stopped: bool
    """`stop()` ended it (a cancel, the runner stopping)."""
    output: str
    """The last bytes of its stdout and stderr, interleaved as written."""
    output_bytes: int


class Waitable(Protocol):
    @property
    def pid(self) -> int: ...
    @property
    def returncode(self) -> int | None: ...
    async def wait(self) -> int: ...


class GroupProcess:
    """`await GroupProcess.start(argv, env=..., cwd=...)`, then `await proc.wait(timeout_s, grace_s)`; `stop()` may
    be called from another task meanwhile. Cancelling `wait` kills the process group at once."""

    def __init__(self, proc: Waitable, tail: OutputTail, stdout: asyncio.StreamReader | None = None) -> None:
        """`proc`: a subprocess, or what stands for one (the fork server's child); `stdout`: where its output is
        read (the subprocess's own pipe when None)."""
        self._proc = proc
        self._tail = tail
        self._stopped = False
        self._stopping: asyncio.Task[None] | None = None
        stream = stdout if stdout is not None else getattr(proc, "stdout", None)
        assert stream is not None
        self._reader = asyncio.ensure_future(self._read(stream))

    @classmethod
    async def start(
        cls, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, tail_bytes: int
    ) -> GroupProcess:
        """Start `argv` with exactly `env`; OSError when it cannot be started (no such file, not executable)."""
        proc = await asyncio.create_subprocess_exec(
            *argv,
            env=dict(env),
            cwd=cwd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        return cls(proc, OutputTail(tail_bytes))

    @property
    def pid(self) -> int:
        """Also the process group id (the process leads its own session)."""
        return self._proc.pid

    async def _read(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(65536):
            self._tail.feed(chunk)

    def _signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, sig)

    async def wait(self, timeout_s: float | None, grace_s: float) -> Exit:
        """Until the process ends, or `timeout_s` passed and it was stopped; then whatever it left running in its
        group is killed and the last output collected."""
        timed_out = False
        try:
            try:
                await asyncio.wait_for(self._proc.wait(), timeout_s)
            except TimeoutError:
                timed_out = True
                await self._stop_once(grace_s)
            self._signal_group(signal.SIGKILL)  # stragglers the command left behind in its group
            try:
                await asyncio.wait_for(asyncio.shield(self._reader), DRAIN_S)
            except TimeoutError:
                self._reader.cancel()
        except asyncio.CancelledError:
            self._signal_group(signal.SIGKILL)
            self._reader.cancel()
            raise
        code = self._proc.returncode
        assert code is not None
        sig = -code if code < 0 else None
        return Exit(
            returncode=128 + sig if sig else code,
            signal=sig,
            timed_out=timed_out,
            stopped=self._stopped,
            output=self._tail.text(),
            output_bytes=self._tail.total,
        )

    async def stop(self, grace_s: float) -> None:
        """SIGTERM to the process group, SIGKILL after `grace_s` if the process is still there. Idempotent."""
        self._stopped = True
        await self._stop_once(grace_s)

    async def _stop_once(self, grace_s: float) -> None:
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._terminate(grace_s))
        await asyncio.shield(self._stopping)

    async def _terminate(self, grace_s: float) -> None:
        if self._proc.returncode is not None:
            return
        self._signal_group(signal.SIGTERM)
        try:
            await asyncio.wait_for(self._proc.wait(), grace_s)
        except TimeoutError:
            self._signal_group(signal.SIGKILL)
            await self._proc.wait()
