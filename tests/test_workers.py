"""`agl-lite run --workers N`: N gateway processes share the port (the kernel spreads the connections), one store
on PostgreSQL; SIGTERM stops them all; a store or chain one process must own is refused before any serves."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from pathlib import Path

from agl_lite.client import AglLiteClient
from agl_lite.testing.gateway import write_config
from tests.conftest import ADMIN_KEY

CHAIN = ("store", "auth", "store_api", "metrics")


def connections_by_pid(pids: list[str], port: int) -> dict[str, int]:
    """Established connections to `port` that each process holds (from /proc: its fds, the kernel's TCP table)."""
    established = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port and fields[3] == "01":
            established.add(f"socket:[{fields[9]}]")
    counts = {}
    for pid in pids:
        fds = Path(f"/proc/{pid}/fd")
        counts[pid] = sum(1 for fd in fds.iterdir() if os.readlink(fd) in established)
    return counts


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def start(config: Path, workers: int) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agl_lite", "run", "--config", str(config), "--workers", str(workers),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "AGL_KEY": ADMIN_KEY},
    )  # fmt: skip


async def test_two_workers_share_the_port_and_the_store_and_stop_together(
    tmp_path: Path, postgres_db: str
) -> None:
    port = free_port()
    config = write_config(
        tmp_path,
        {},
        chain=CHAIN,
        addons={"store": {"dsn": postgres_db}},
        extra={"server": {"port": port}},
    )
    proc = await start(Path(config.source), 2)
    assert proc.stdout is not None
    try:
        listening = 0
        async with asyncio.timeout(60):
            while listening < 2 and (line := await proc.stdout.readline()):
                listening += b"gateway listening" in line
        assert listening == 2
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()  # noqa: ASYNC240
        assert len(children) == 2
        url = f"http://127.0.0.1:{port}"
        async with AglLiteClient(url, ADMIN_KEY) as client:
            groups = await asyncio.gather(*(client.enqueue_group([{"q": i}]) for i in range(50)))
            # one store, whichever worker answered
            assert len(await client.list_rollouts()) == len(groups) == 50
        # Connections held open: the kernel hands each to one worker's accept queue, and each worker holds some.
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(32)]
        try:
            async with asyncio.timeout(10):
                # (until the workers accepted them all: /proc has no event to wait on; polled, bounded)
                while sum((per := connections_by_pid(children, port)).values()) < len(held):  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
            assert all(n > 0 for n in per.values()), per
        finally:
            for conn in held:
                conn.close()
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 0
        assert all(not Path(f"/proc/{pid}").exists() for pid in children)  # noqa: ASYNC240
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_workers_on_sqlite_are_refused_before_any_serves(tmp_path: Path) -> None:
    config = write_config(tmp_path, {}, chain=CHAIN, extra={"server": {"port": free_port()}})
    proc = await start(Path(config.source), 2)
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2
    assert b"needs the store on PostgreSQL" in out
