"""A gateway in its own process (`python -m agl_lite run`), for the checks that are about a process: SIGKILL, RSS,
what it writes to stderr. Shared by the reliability tests and the long variants in bench/ (soak, crash).

The config must set `log.format = "json"`: readiness is the `gateway listening` line, and the log checks read
one JSON object a line.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sys
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

READY_TIMEOUT_S = 30.0
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


class GatewayFailed(AssertionError):
    """The gateway did not start, or died on its own."""


@dataclass
class GatewayProcess:
    proc: asyncio.subprocess.Process
    url: str = ""
    stderr: list[str] = field(default_factory=list)
    drain: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self, n: int = 20) -> str:
        return "\n".join(self.stderr[-n:])

    def rss_bytes(self) -> int:
        """Resident set size now (from /proc: the same figure `ps` and the OOM killer see)."""
        fields = Path(f"/proc/{self.pid}/statm").read_text().split()
        return int(fields[1]) * PAGE_SIZE

    def kill(self) -> None:
        """SIGKILL now (no clean-up in the gateway: that is the point); `await wait()` to reap it."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()

    async def wait(self) -> None:
        await self.proc.wait()
        if self.drain is not None:
            await self.drain

    async def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then the graceful shutdown; its exit status."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.terminate()
        await asyncio.wait_for(self.wait(), timeout)
        assert self.proc.returncode is not None
        return self.proc.returncode


async def _drain(stream: asyncio.StreamReader, lines: list[str]) -> None:
    while line := await stream.readline():
        lines.append(line.decode(errors="replace").rstrip())


async def start_gateway(
    config: Path,
    *,
    env: Mapping[str, str],
    ready_timeout: float = READY_TIMEOUT_S,
    prefix: Sequence[str] = (),
    replace_env: bool = False,
) -> GatewayProcess:
    """Start the gateway (behind `prefix`, e.g. `setpriv` to run it as another user; with exactly `env` when
    `replace_env`, else the test's env updated with it) and wait (bounded) for its `gateway listening` line; stderr
    is kept in `.stderr`."""
    proc = await asyncio.create_subprocess_exec(
        *prefix,
        sys.executable,
        "-m",
        "agl_lite",
        "run",
        "--config",
        str(config),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env=dict(env) if replace_env else {**os.environ, **env},
        start_new_session=True,
    )
    assert proc.stderr is not None
    gw = GatewayProcess(proc)
    try:
        async with asyncio.timeout(ready_timeout):
            while line := await proc.stderr.readline():
                text = line.decode(errors="replace").rstrip()
                gw.stderr.append(text)
                if "gateway listening" in text:
                    gw.url = orjson.loads(text)["url"]
                    break
    except TimeoutError:
        gw.kill()
        await proc.wait()
        raise GatewayFailed(
            f"the gateway did not listen within {ready_timeout:g} s:\n{gw.log_tail()}"
        ) from None
    if not gw.url:
        await proc.wait()
        raise GatewayFailed(f"the gateway exited ({proc.returncode}) before listening:\n{gw.log_tail()}")
    gw.drain = asyncio.create_task(_drain(proc.stderr, gw.stderr))
    return gw


@asynccontextmanager
async def gateway_processes() -> AsyncIterator[list[GatewayProcess]]:
    """Collects the gateways a block starts; any still running is killed at the end, whatever happened."""
    started: list[GatewayProcess] = []
    try:
        yield started
    finally:
        for gw in started:
            gw.kill()
            await gw.wait()


# --- what a log may not hold -------------------------------------------------------------------------------------

_TRACEBACK = re.compile(r"Traceback \(most recent call last\)|^\s+File \"")


def log_records(lines: Iterable[str]) -> list[dict[str, Any]]:
    """The JSON log lines as objects; a line that is not JSON (a raw traceback, a print) as `{"raw": line}`."""
    out: list[dict[str, Any]] = []
    for line in lines:
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            obj = None
        out.append(obj if isinstance(obj, dict) else {"raw": line})
    return out


def log_problems(lines: Iterable[str]) -> list[str]:
    """Tracebacks, exceptions and error-level events in a JSON log: none is expected from faults the gateway is
    built to contain (warnings are)."""
    problems = []
    for rec in log_records(lines):
        raw = rec.get("raw")
        if raw is not None:
            if raw.strip():
                problems.append(f"not a JSON log line: {raw[:300]}")
        elif "exception" in rec or "exc_info" in rec or _TRACEBACK.search(str(rec)):
            problems.append(f"traceback logged: {str(rec)[:500]}")
        elif rec.get("level") in ("error", "critical"):
            problems.append(f"error logged: {str(rec)[:500]}")
    return problems


def secrets_in(text: str, secrets: Iterable[str]) -> list[str]:
    """Which of `secrets` occur in `text` — whole, or the signature part of a derived key — named by a prefix."""
    found = []
    for secret in secrets:
        probes = {secret}
        if secret.startswith("agl-"):
            probes.add(secret.rpartition(".")[2])  # the HMAC alone is as good as the key
        if any(p and p in text for p in probes):
            found.append(secret[:12] + "...")
    return found
