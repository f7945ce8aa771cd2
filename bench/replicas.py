"""Replicas bench (#21): 1 vs 2 gateway processes, SQLite and PostgreSQL, side by side in one run.

Three gateways, each with the full capture chain and the mock vLLM upstream: SQLite with one process (two are
refused: SQLite belongs to one process), PostgreSQL with one, and PostgreSQL with two workers (`agl-lite run
--workers 2`, one port). The PostgreSQL server is started here (bench/harness/postgres.py: a fresh server in a
temp dir, `fsync=off`, which a production server would not run with). The cells, in interleaved rounds:
  single     single-event POSTs (hey, c=32)
  llm        plain chat completions through the gateway (hey, c=32)
  rollouts   simulated rollouts (bench/store_load.py: claim, attempt, 6 LLM calls, reward, verdict; 32 runners)
Nothing is pinned: on a 2-CPU box the gateways, PostgreSQL and the load share both CPUs, and the busy columns say
who had them. Then, with `--flat`, the claim and the completion cursor's latency on a store of 1,000 calls and
on one of `--calls` (default 1,000,000), on both engines: their cost must not grow with the store.
Run: `.venv/bin/python bench/replicas.py [--quick] [--flat] [--markdown]` (needs `hey` and PostgreSQL).
"""

from __future__ import annotations

import argparse
import json
import math
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path

import psycopg
from loadgen import HEY_MISSING, hey_path
from procs import BenchError, Children, Placement, bench_main, free_port
from report import machine
from servers import agl_lite_argv
from spy import py_spy_path, record, summarise
from store import (
    CALLS,
    CHAIN,
    MODEL,
    Result,
    Server,
    admin_post,
    event_bodies,
    hey_cell,
    python_cell,
    start_mock,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the harness: bench/harness/
from bench.harness.postgres import PG_BIN, postgres_server

__all__ = ["main"]

GATEWAYS = (("sqlite", 1), ("postgres", 1), ("postgres", 2))
CELLS = ("single", "llm", "rollouts")
UNITS = {"single": "POSTs/s", "llm": "calls/s", "rollouts": "rollouts/s"}
REFERENCE_ROLLOUTS = 300


def label(backend: str, workers: int) -> str:
    return f"{backend} x{workers}"


def tree_cpu(pid: int) -> float:
    """CPU seconds of a process and all its descendants (the workers of `--workers`, PostgreSQL's backends)."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / 100.0
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, IndexError, ValueError):
            continue
    return total


def start_gateway(
    children: Children, backend: str, workers: int, upstream: str, tmp: Path, key: str, dsn: str
) -> Server:
    port = free_port()
    home = tmp / f"{backend}-{workers}"
    home.mkdir()
    (home / "routes.toml").write_text(
        f'[models.{MODEL}]\nbackend = "vllm"\nupstreams = [{{ base_url = "{upstream}" }}]\n'
    )
    store = f'dsn = "{dsn}"' if backend == "postgres" else 'backend = "sqlite"\npath = "store.db"'
    (home / "agl-lite.toml").write_text(
        f'routes = "routes.toml"\n\n[server]\nhost = "127.0.0.1"\nport = {port}\nworkers = {workers}\n\n'
        f'[log]\nlevel = "warning"\n\n[addons]\nchain = {json.dumps(list(CHAIN))}\n\n[addons.store]\n{store}\n'
    )
    name = f"agl-lite-{backend}-{workers}"
    children.spawn(
        name, [*agl_lite_argv(), "run", "--config", str(home / "agl-lite.toml")], env={"AGL_KEY": key}
    )
    children.wait_ready(name, f"http://127.0.0.1:{port}/healthz", 60)
    return Server(label(backend, workers), f"http://127.0.0.1:{port}", key, children.pid(name))


@dataclass
class Cell:
    result: Result
    gateway_cpu_s: float
    postgres_cpu_s: float


def run_cell(
    kind: str,
    server: Server,
    hey: str,
    bodies: tuple[Path, Path],
    upstream_pid: int,
    seconds: float,
    pg_pid: int,
) -> Cell:
    g0, p0 = tree_cpu(server.pid), tree_cpu(pg_pid)
    unpinned = Placement()
    if kind == "single":
        result = hey_cell(
            hey, server, "/api/rollouts/bench-single/events", bodies[0],
            concurrency=32, seconds=seconds, per_request=1, cpus=unpinned,
        )  # fmt: skip
    elif kind == "llm":
        body = bodies[0].with_name("chat.json")
        body.write_text(
            json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})
        )
        result = hey_cell(
            hey,
            server,
            "/v1/chat/completions",
            body,
            concurrency=32,
            seconds=seconds,
            per_request=1,
            cpus=unpinned,
        )
    else:
        result = python_cell(
            "rollouts", server, upstream_pid, runners=32, seconds=seconds, warmup=1.0, cpus=unpinned
        )
    return Cell(result, tree_cpu(server.pid) - g0, tree_cpu(pg_pid) - p0)


def flat_cost(dsn: str, tmp: Path, calls: int) -> list[tuple[str, str, float, float]]:
    """(engine, store size, claim ms, cursor ms) medians of 200 each, on a store of 1,000 calls and of `calls`."""
    from flat import measure_flat

    return measure_flat(dsn, tmp, calls)


def run(args: argparse.Namespace, hey: str, tmp: Path) -> int:
    if PG_BIN is None:
        raise BenchError("PostgreSQL is not installed (apt-get install postgresql)")
    seconds = args.seconds or (2.0 if args.quick else 8.0)
    rounds = max(1, args.rounds or (1 if args.quick else 2))
    key = secrets.token_hex(32)
    info = machine()
    cells: dict[tuple[str, str], list[Cell]] = {}
    with postgres_server() as admin_dsn, Children(tmp) as children:
        pg_pid = _postmaster(admin_dsn)
        upstream, upstream_pid = start_mock(children, None)
        servers = {}
        for backend, workers in GATEWAYS:
            dsn = ""
            if backend == "postgres":
                name = f"bench_{workers}"
                with psycopg.connect(admin_dsn, autocommit=True) as conn:
                    conn.execute(f"CREATE DATABASE {name}".encode())
                dsn = admin_dsn.rsplit("/", 1)[0] + "/" + name
            server = start_gateway(children, backend, workers, upstream, tmp, key, dsn)
            servers[server.backend] = server
            admin_post(server, "/api/rollouts", {"rollouts": [{"rollout_id": "bench-single", "input": {}}]})
            admin_post(server, "/api/runner/claim", {"runner_id": "bench-events", "limit": 1})
        bodies = event_bodies(tmp)
        for kind in CELLS:
            print(f"{kind}: {seconds:g} s per gateway in {rounds} round(s) ...", file=sys.stderr, flush=True)
            for _ in range(rounds):
                for name, server in servers.items():
                    cell = run_cell(kind, server, hey, bodies, upstream_pid, seconds / rounds, pg_pid)
                    cells.setdefault((kind, name), []).append(cell)
        flat = flat_cost(admin_dsn, tmp, args.calls) if args.flat else []
        if args.profile:
            profile(servers[label("postgres", 1)], hey, bodies, upstream_pid, seconds, pg_pid, tmp)
        children.stop_all()
    print(f"\nreplicas bench  {info['date']}  {info['nproc']} CPUs {info['cpu']}  Python {info['python']}")
    print(
        f"{seconds:g} s per cell in {rounds} round(s), unpinned; chain {', '.join(CHAIN)}; {CALLS} calls a rollout"
    )
    header = (
        "cell",
        "gateway",
        "rate",
        "vs sqlite x1",
        "p50 ms",
        "p99 ms",
        "gateway CPU busy",
        "postgres CPU busy",
        "non-2xx",
    )
    rows = []
    pooled_by: dict[tuple[str, str], Result] = {}
    for key, runs in cells.items():
        pooled_by[key] = Result()
        for c in runs:
            pooled_by[key].add(c.result)
    for (kind, name), runs in cells.items():
        pooled = pooled_by[(kind, name)]
        base = pooled_by[(kind, label("sqlite", 1))].rate
        seconds_total = sum(c.result.seconds for c in runs) or math.nan
        rows.append(
            (
                kind,
                name,
                f"{pooled.rate:,.0f} {UNITS[kind]}",
                f"{pooled.rate / base:.2f}x" if base else "—",
                f"{pooled.percentile(50):.1f}",
                f"{pooled.percentile(99):.1f}",
                f"{100 * sum(c.gateway_cpu_s for c in runs) / seconds_total:.0f} %",
                f"{100 * sum(c.postgres_cpu_s for c in runs) / seconds_total:.0f} %",
                str(pooled.failed),
            )
        )
    print(_table(header, rows, args.markdown))
    for (kind, name), runs in cells.items():
        notes = [note for c in runs for note in c.result.notes() if c.result.failed]
        if notes:
            print(f"{kind} on {name}: " + "; ".join(notes))
    best = max((float(r[2].split()[0].replace(",", "")) for r in rows if r[0] == "rollouts"), default=0.0)
    verdict = "reached" if best >= REFERENCE_ROLLOUTS else "missed (docs/performance.md shows what stops it)"
    print(f"\nsimulated rollouts: best {best:,.0f}/s against the {REFERENCE_ROLLOUTS}/s reference: {verdict}")
    if flat:
        print("\nclaim and completion cursor, median of 200 each:")
        print(_table(("engine", "calls stored", "claim ms", "cursor ms"), [
            (e, s, f"{c:.2f}", f"{k:.2f}") for e, s, c, k in flat
        ], args.markdown))  # fmt: skip
    return 0


def profile(
    server: Server,
    hey: str,
    bodies: tuple[Path, Path],
    upstream_pid: int,
    seconds: float,
    pg_pid: int,
    tmp: Path,
) -> None:
    """py-spy of the PostgreSQL gateway (one process) under the simulated rollouts: where its CPU goes."""
    spy = py_spy_path()
    if spy is None:
        print("\nprofile: py-spy not found (pip install py-spy)")
        return
    out = tmp / "profile-postgres-rollouts.txt"

    def load() -> None:
        run_cell("rollouts", server, hey, bodies, upstream_pid, seconds + 1, pg_pid)

    record(spy, server.pid, seconds, out, load)
    print(
        f"\nprofile of the {server.backend} gateway (pid {server.pid}) under simulated rollouts, {seconds:g} s:"
    )
    print("\n".join(summarise(out, top=15)))


def _postmaster(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        data = conn.execute("SHOW data_directory").fetchone()
    assert data is not None
    return int((Path(data[0]) / "postmaster.pid").read_text().split()[0])


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        return "\n".join([*lines, *("| " + " | ".join(r) + " |" for r in rows)])
    widths = [max(len(line[i]) for line in (header, *rows)) for i in range(len(header))]
    return "\n".join(
        "  ".join(f"{v:<{w}}" for v, w in zip(line, widths, strict=True)) for line in (header, *rows)
    )


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="2 s per cell, one round (a smoke run, noisy).")
    p.add_argument("--seconds", type=float, help="Seconds per cell, all rounds together (default 8).")
    p.add_argument("--rounds", type=int, help="Interleaved rounds per cell (default 2).")
    p.add_argument(
        "--flat", action="store_true", help="Also the claim/cursor latency at 1k vs --calls calls."
    )
    p.add_argument(
        "--calls", type=int, default=1_000_000, help="The large store of --flat (default 1,000,000)."
    )
    p.add_argument("--markdown", action="store_true", help="Print the tables as markdown.")
    p.add_argument(
        "--profile", action="store_true", help="Also py-spy the PostgreSQL gateway under rollouts."
    )
    p.add_argument("--keep-logs", action="store_true", help="Keep the servers' logs and configs.")
    return p.parse_args()


def main() -> int:
    return bench_main("replicas bench", run, parse_args(), hey_path(), HEY_MISSING, "agl-replicas-bench-")


if __name__ == "__main__":
    sys.exit(main())
