"""Helpers for tests that run real agent processes: a loopback HTTP probe agents report to (so a test waits on
an event, not a sleep) and a wait for a process to exit through a pidfd."""

from __future__ import annotations

import asyncio
import os
import secrets
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web

from agl_lite.testing.servers import serve_app


class Probe:
    """`GET {url}/started/{name}?pid=..&child=..` records the pids and wakes `wait_started(name)`; when `hold` is
    set, the request is answered only on `release()` (an agent waiting on it hangs until then)."""

    def __init__(self) -> None:
        self.url = ""
        self.marker = f"1000.{secrets.randbelow(10**9):09d}"
        """A `sleep` duration no other process uses: agents put it on their command lines for `marked_pids`."""
        self.pids: dict[str, list[int]] = {}
        self._started: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.hold = False
        self._released = asyncio.Event()
        self._any = asyncio.Event()  # replaced after each report: waiters hold the one they saw

    async def _handle(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        self.pids[name] = [int(v) for k, v in request.query.items() if k in ("pid", "child") and v]
        self._started[name].set()
        self._any.set()
        self._any = asyncio.Event()
        if self.hold:
            await self._released.wait()
        return web.Response(text="ok\n")

    async def wait_started(self, name: str, timeout: float = 60.0) -> list[int]:
        await asyncio.wait_for(self._started[name].wait(), timeout)
        return self.pids[name]

    async def wait_count(self, n: int, timeout: float = 60.0) -> dict[str, list[int]]:
        """Until `n` different names have reported; returns every report so far."""
        async with asyncio.timeout(timeout):
            while len(self.pids) < n:
                await self._any.wait()
        return dict(self.pids)

    def release(self) -> None:
        self._released.set()


@asynccontextmanager
async def running_probe() -> AsyncIterator[Probe]:
    probe = Probe()
    app = web.Application()
    app.router.add_get("/started/{name}", probe._handle)
    async with serve_app(app) as url:
        probe.url = url
        try:
            yield probe
        finally:
            probe.release()


def marked_pids(marker: str) -> list[int]:
    """The pids (ours, whatever namespace they run in) of every process with `marker` on its command line."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmdline = f.read()
            except OSError:
                continue
            if marker.encode() in cmdline and int(entry) != os.getpid():
                found.append(int(entry))
    return found


async def exited(pid: int, timeout: float = 30.0) -> None:
    """Until process `pid` has exited (a pidfd turns readable); at once if it is gone already."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    loop.add_reader(fd, lambda: done.done() or done.set_result(None))
    try:
        await asyncio.wait_for(done, timeout)
    finally:
        loop.remove_reader(fd)
        os.close(fd)
