"""Fast start for Python agents: one fork server (`zygote.py`) per interpreter, started once, forks each attempt
step instead of starting a fresh interpreter that imports the agent's SDK again (docs/runners.md).

A step started here behaves as one started as a process (`GroupProcess`): its own session, the same sandbox, its
output's tail, SIGTERM then SIGKILL to its group, and its exit status (from the fork server, which is its parent).
Which commands qualify: `PYTHON SCRIPT.py ARGS...` (no interpreter options), PYTHON an interpreter's path.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import json
import os
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agl_lite.runner.process import GroupProcess, OutputTail

__all__ = ["ForkServer", "ForkServerError", "fork_eligible"]

ZYGOTE = Path(__file__).with_name("zygote.py")
START_TIMEOUT_S = 120.0
"""The fork server's preloads may take a while on a cold machine (an SDK's first import compiles it)."""


class _Output(asyncio.StreamReaderProtocol):
    """A step's output: at its end the transport closes its socket (a stream protocol's default keeps it open)."""

    def eof_received(self) -> bool:
        super().eof_received()
        return False


class ForkServerError(Exception):
    """The fork server could not be started or is gone; the step can be started as a fresh process instead."""


def fork_eligible(argv: Sequence[str]) -> bool:
    """`PYTHON SCRIPT.py ...`: an interpreter (by name) and a script, no options between them."""
    if len(argv) < 2:
        return False
    name = os.path.basename(argv[0])
    return name.startswith("python") and argv[1].endswith(".py") and not argv[1].startswith("-")


class _Child:
    """What `GroupProcess` needs of a process: its pid, `wait()` and `returncode`, told by the fork server."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._done = asyncio.get_running_loop().create_future()

    def ended(self, status: int) -> None:
        if self.returncode is None:
            self.returncode = os.waitstatus_to_exitcode(status)
            self._done.set_result(None)

    async def wait(self) -> int:
        await asyncio.shield(self._done)
        assert self.returncode is not None
        return self.returncode


class ForkServer:
    def __init__(self, python: str, preload: Sequence[str], *, env: Mapping[str, str], cwd: Path) -> None:
        self.python = python
        self.preload = tuple(preload)
        self._env = dict(env)
        self._cwd = cwd
        self._proc: asyncio.subprocess.Process | None = None
        self._ctl: socket.socket | None = None
        self._next = 0
        self._pending: dict[int, asyncio.Future[int]] = {}
        self._children: dict[int, _Child] = {}
        self._early: dict[int, int] = {}
        """Statuses of steps that ended before their `spawn` registered them."""
        self._ready: asyncio.Future[dict[str, Any]] | None = None
        self._buf = b""
        self.preload_failed: dict[str, str] = {}
        self._lock = asyncio.Lock()

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.returncode is None and self._ctl is not None

    async def ensure_started(self) -> None:
        async with self._lock:
            if self.alive:
                return
            await self._start()

    async def _start(self) -> None:
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        settings = json.dumps(
            {
                "preload": list(self.preload),
                "runner_pid": os.getpid(),
                "fd": theirs.fileno(),
                "lc_ctype_given": "LC_CTYPE" in self._env,
            }
        )
        try:
            self._proc = await asyncio.create_subprocess_exec(
                self.python,
                "-P",
                str(ZYGOTE),
                settings,
                env=self._env,
                cwd=self._cwd,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=None,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
            )
        except OSError as exc:
            ours.close()
            raise ForkServerError(f"cannot start the fork server with {self.python}: {exc}") from exc
        finally:
            theirs.close()
        ours.setblocking(False)
        self._ctl = ours
        self._buf = b""
        self._ready = loop.create_future()
        loop.add_reader(ours.fileno(), self._on_readable)
        try:
            hello = await asyncio.wait_for(asyncio.shield(self._ready), START_TIMEOUT_S)
        except (TimeoutError, ForkServerError) as exc:
            await self.close()
            raise ForkServerError(f"the fork server ({self.python}) did not start: {exc}") from None
        self.preload_failed = hello.get("preload_failed", {})

    def _on_readable(self) -> None:
        ctl = self._ctl
        assert ctl is not None
        try:
            data = ctl.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._lost()
            return
        self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        for line in lines:
            message = json.loads(line)
            if "ready" in message:
                if self._ready is not None and not self._ready.done():
                    self._ready.set_result(message)
            elif "pid" in message:
                fut = self._pending.pop(message["id"], None)
                if fut is not None and not fut.done():
                    fut.set_result(message["pid"])
            elif "status" in message:
                child = self._children.pop(message["id"], None)
                if child is not None:
                    child.ended(message["status"])
                else:  # it ended before `spawn` resumed from its pid (both lines came in one read)
                    self._early[message["id"]] = message["status"]

    def _lost(self) -> None:
        """The fork server ended: its steps ended with it (they die with their parent)."""
        ctl, self._ctl = self._ctl, None
        if ctl is not None:
            asyncio.get_running_loop().remove_reader(ctl.fileno())
            ctl.close()
        err = ForkServerError("the fork server exited")
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(err)
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(err)
        self._pending.clear()
        for child in self._children.values():
            child.ended(9)  # as killed by SIGKILL: the step did not end by itself
        self._children.clear()
        self._early.clear()

    async def spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: Path,
        sandbox: Mapping[str, Any] | None,
        tail_bytes: int,
    ) -> GroupProcess:
        """Start one step; `sandbox` is `sandbox.py`'s spec (None: unconfined)."""
        await self.ensure_started()
        ctl = self._ctl
        assert ctl is not None
        loop = asyncio.get_running_loop()
        # The step's output comes over a socket, not a pipe: uvloop's read-pipe transport closes its fd itself and
        # the pipe's file object closes it again when collected, by then maybe another file's number (a later
        # step's "Bad file descriptor"). A socket is closed once by either loop's transport.
        out_r, out_w = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        out_r.shutdown(socket.SHUT_WR)  # the step's stdout is for writing: a read of it sees the end at once
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._next += 1
        step_id = self._next
        fut: asyncio.Future[int] = loop.create_future()
        self._pending[step_id] = fut
        try:
            fds = array.array("i", [theirs.fileno(), out_w.fileno()])
            ctl.sendmsg([json.dumps({"id": step_id}).encode()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        except OSError as exc:
            self._pending.pop(step_id, None)
            out_r.close()
            mine.close()
            raise ForkServerError(f"the fork server is gone: {exc}") from exc
        finally:
            theirs.close()
            out_w.close()
        # The request goes to the step's own socket, read by the child after the fork (never by the server).
        request = json.dumps({"argv": list(argv), "env": dict(env), "cwd": str(cwd), "sandbox": sandbox})
        try:
            await loop.sock_sendall(mine, request.encode())
            mine.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the child is gone already: its status says so
        finally:
            mine.close()
        try:
            pid = await fut
        except BaseException:
            out_r.close()
            raise
        child = _Child(pid)
        early = self._early.pop(step_id, None)
        if early is not None:
            child.ended(early)
        else:
            self._children[step_id] = child
        reader = asyncio.StreamReader()
        await loop.connect_accepted_socket(lambda: _Output(reader), out_r)
        return GroupProcess(child, OutputTail(tail_bytes), reader)

    async def close(self) -> None:
        ctl = self._ctl
        if ctl is not None:
            self._lost()
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
            await self._proc.wait()
            self._proc = None
