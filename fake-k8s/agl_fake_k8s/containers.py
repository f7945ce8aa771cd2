"""One container run as a local subprocess in its own process group, with its output kept as the container log.

It owns the process: start (a failure to exec is a StartError, exit code 128), exit codes as a container runtime
reports them (128 + signal), SIGTERM then SIGKILL of the whole group, and the termination message (the file, or
the log's tail for FallbackToLogsOnError). When the main process ends, whatever it left in its group is killed,
as a container's processes die with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from agl_fake_k8s.tasks import TaskSet

__all__ = ["ContainerProcess", "Exit", "StartError", "alive"]

_MESSAGE_LIMIT = 4096  # bytes of a termination message file the kubelet reads
_FALLBACK_BYTES, _FALLBACK_LINES = 2048, 80  # FallbackToLogsOnError takes at most this much of the log's end


class StartError(Exception):
    """The process could not be started (no such executable, not executable, bad working directory)."""


@dataclass(frozen=True, slots=True)
class Exit:
    code: int
    reason: str
    message: str


class ContainerProcess:
    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: Path,
        log_path: Path,
        termination_path: Path,
        fallback_to_logs: bool,
        tasks: TaskSet,
        on_output: Callable[[], None] = lambda: None,
    ) -> None:
        self._argv = list(argv)
        self._env = dict(env)
        self._cwd = cwd
        self._log_path = log_path
        self._termination_path = termination_path
        self._fallback = fallback_to_logs
        self._tasks = tasks
        self._on_output = on_output
        self._process: asyncio.subprocess.Process | None = None
        self._tail = bytearray()
        self._pump: asyncio.Task[None] | None = None
        self.output = asyncio.Event()
        """Set on new output and at exit (log followers wait on it, then clear it)."""
        self.exited = False

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    async def start(self) -> None:
        if not self._argv:
            raise StartError("no command specified")
        self._termination_path.parent.mkdir(parents=True, exist_ok=True)
        self._termination_path.touch()
        try:
            self._process = await asyncio.create_subprocess_exec(
                *self._argv,
                env=self._env,
                cwd=self._cwd,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            what = exc.strerror or type(exc).__name__
            raise StartError(
                f'failed to create containerd task: exec: "{self._argv[0]}": {what}: unknown'
            ) from None
        self._pump = self._tasks.spawn(self._copy_output(), name=f"fake-k8s-log-{self._process.pid}")

    async def _copy_output(self) -> None:
        assert self._process is not None
        assert self._process.stdout is not None
        with self._log_path.open("ab") as log:
            while chunk := await self._process.stdout.read(65536):
                log.write(chunk)
                log.flush()
                self._tail += chunk
                del self._tail[: max(len(self._tail) - _FALLBACK_BYTES * 2, 0)]
                self.output.set()
                self._on_output()

    async def wait(self) -> Exit:
        """Wait for the process to exit; then kill what it left behind and read its termination message."""
        assert self._process is not None
        returncode = await self._process.wait()
        self._signal(signal.SIGKILL)
        if self._pump is not None:
            await self._pump
        self.exited = True
        self.output.set()
        code = returncode if returncode >= 0 else 128 - returncode
        return Exit(code, "Completed" if code == 0 else "Error", self._message(code))

    def _message(self, code: int) -> str:
        try:
            with self._termination_path.open("rb") as handle:
                message = handle.read(_MESSAGE_LIMIT)
        except OSError:
            message = b""
        if not message.strip() and self._fallback and code != 0:
            message = b"".join(bytes(self._tail).splitlines(keepends=True)[-_FALLBACK_LINES:])[
                -_FALLBACK_BYTES:
            ]
        return message.decode("utf-8", "replace")

    def _signal(self, sig: signal.Signals) -> None:
        if self._process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._process.pid, sig)

    async def stop(self, grace_s: float) -> None:
        """SIGTERM to the process group, SIGKILL after `grace_s` seconds if it is still there."""
        if self._process is None or self._process.returncode is not None:
            return
        self._signal(signal.SIGTERM if grace_s > 0 else signal.SIGKILL)
        if grace_s > 0:
            try:
                await asyncio.wait_for(asyncio.shield(self._process.wait()), grace_s)
            except TimeoutError:
                self._signal(signal.SIGKILL)

    def kill_now(self) -> None:
        self._signal(signal.SIGKILL)

    async def reaped(self) -> None:
        """Wait until the process has exited and been reaped."""
        if self._process is not None:
            await self._process.wait()


def alive(pid: int) -> bool:
    """Whether `pid` is a live process (a reaped or zombie one is not): what a test asks of a container's process
    after its pod was deleted, killed or garbage-collected."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")
