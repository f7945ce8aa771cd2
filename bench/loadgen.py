"""The load generator: `hey` (Go) in its own process, per-request latencies from its CSV output.

hey prints seconds with 4 decimals, so single latencies have 0.1 ms resolution; req/s is requests / the span from
the first request's start to the last one's end. hey leaves transport errors out of its CSV, so a cell whose
count looks short should be rerun with hey's summary (drop `-o csv`) to see them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from procs import pinned

__all__ = ["HEY_MISSING", "Cell", "hey_path", "run_hey"]

HEY_MISSING = (
    "hey (the HTTP load generator) is not installed. Install it with `apt-get install -y hey` (Debian/Ubuntu), "
    "`brew install hey` (macOS) or `go install github.com/rakyll/hey@latest`, then rerun."
)


@dataclass
class Cell:
    """The requests of one (target, mode, concurrency) cell, possibly pooled over several interleaved rounds."""

    ok: int = 0
    failed: int = 0
    """Responses with a status other than 200."""
    seconds: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    rounds_rps: list[float] = field(default_factory=list)
    """req/s of each round added, in order (to pair rounds of different targets)."""
    server_cpu_s: float = 0.0
    """CPU seconds (user + system) the server under test spent during the cell; nan when unknown."""

    def add(self, other: Cell) -> None:
        self.ok += other.ok
        self.failed += other.failed
        self.seconds += other.seconds
        self.latencies_ms.extend(other.latencies_ms)
        self.rounds_rps.append(other.rps)
        self.server_cpu_s += other.server_cpu_s

    @property
    def cpu_us_per_request(self) -> float:
        return self.server_cpu_s / self.ok * 1e6 if self.ok else float("nan")

    @property
    def rps(self) -> float:
        return self.ok / self.seconds if self.seconds > 0 else 0.0

    def percentile(self, p: float) -> float:
        """Nearest-rank percentile in ms (nan when empty)."""
        if not self.latencies_ms:
            return float("nan")
        lat = sorted(self.latencies_ms)
        k = max(0, min(len(lat) - 1, round(p / 100 * len(lat) + 0.5) - 1))
        return lat[k]


def hey_path() -> str | None:
    return shutil.which("hey")


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of a process so far, from /proc (Linux); nan elsewhere."""
    if pid is None:
        return float("nan")
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_hey(
    hey: str,
    url: str,
    body: bytes,
    *,
    concurrency: int,
    seconds: float,
    headers: Mapping[str, str] | None = None,
    cpus: int = 1,
    affinity: frozenset[int] | None = None,
    server_pid: int | None = None,
) -> Cell:
    """Run hey for `seconds` with `concurrency` keep-alive workers POSTing `body`; parse its CSV.

    hey uses `cpus` OS threads (GOMAXPROCS), pinned to `affinity` when given; the CPU time `server_pid` spends
    meanwhile is recorded."""
    argv = [
        hey,
        "-z",
        f"{seconds:g}s",
        "-c",
        str(concurrency),
        "-cpus",
        str(cpus),
        "-m",
        "POST",
        "-T",
        "application/json",
        "-d",
        body.decode(),
        "-disable-compression",
        "-o",
        "csv",
    ]
    for name, value in (headers or {}).items():
        argv += ["-H", f"{name}: {value}"]
    argv.append(url)
    cpu_before = cpu_seconds(server_pid)
    done = subprocess.run(
        argv, capture_output=True, check=False, timeout=seconds + 60, preexec_fn=pinned(affinity)
    )
    if done.returncode != 0:
        raise RuntimeError(f"hey failed ({done.returncode}): {done.stderr.decode(errors='replace')[-500:]}")
    cell = parse_csv(done.stdout.decode().splitlines())
    cell.server_cpu_s = cpu_seconds(server_pid) - cpu_before
    return cell


def parse_csv(lines: Iterable[str]) -> Cell:
    """hey's CSV: response-time,DNS+dialup,DNS,Request-write,Response-delay,Response-read,status-code,offset."""
    cell = Cell()
    first_start, last_end = float("inf"), 0.0
    for line in lines:
        parts = line.split(",")
        if len(parts) < 8 or not parts[0][:1].isdigit():
            continue
        rt, status, offset = float(parts[0]), parts[6], float(parts[7])
        first_start = min(first_start, offset)
        last_end = max(last_end, offset + rt)
        if status == "200":
            cell.ok += 1
            cell.latencies_ms.append(rt * 1000)
        else:
            cell.failed += 1
    cell.seconds = max(0.0, last_end - first_start) if cell.ok + cell.failed else 0.0
    return cell
