"""Store bench (DESIGN.md §8): the store's write paths over HTTP, SQLite and memory backends side by side.

Each backend runs in its own agl-lite process (the full capture chain, default durability), pinned to one CPU; the
load runs in other processes on the other CPUs: `hey` for the single-request cells, `store_load.py` (aiohttp) for
the runner cycles, and the mock vLLM (`agl-lite mock-llm`) as the upstream of the simulated rollouts. The cells are
measured in interleaved rounds (sqlite, memory, sqlite, ...). Then, unless `--skip-gateway`, the gateway bench
(bench/gateway.py) runs again with the full capture chain and the SQLite store.
Run: `.venv/bin/python bench/store.py [--quick] [--markdown] [--profile]` (needs `hey`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import secrets
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import gateway
from loadgen import HEY_MISSING, cpu_seconds, hey_path
from procs import BenchError, Children, Placement, bench_main, free_port, pinned
from report import machine
from servers import agl_lite_argv
from spy import py_spy_path, record, summarise
from store_spy import components

__all__ = ["main"]

HERE = Path(__file__).resolve().parent
PY = sys.executable
CHAIN = ("store", "auth", "store_api", "control", "metrics", "route", "capture", "tokens", "sink")
BACKENDS = ("sqlite", "memory")
MODEL = "smollm2"
SINGLE_C, BATCH_C, RUNNERS = 32, 8, 32
BATCH = 500
CALLS = 6


@dataclass(frozen=True)
class Measure:
    key: str
    label: str
    unit: str
    reference: float
    """DESIGN.md §8, indicative for this box."""
    latency: str
    """What one latency sample is."""


MEASURES = (
    Measure("single", f"single-event POSTs (c={SINGLE_C})", "POSTs/s", 4000, "per POST"),
    Measure("batched", f"batched ingest ({BATCH} events/POST, c={BATCH_C})", "events/s", 30000, "per POST"),
    Measure("transitions", f"state transitions ({RUNNERS} runners)", "transitions/s", 2000, "per transition"),
    Measure(
        "rollouts",
        f"simulated rollouts ({RUNNERS} runners, {CALLS} LLM calls)",
        "rollouts/s",
        300,
        "per rollout",
    ),
)


@dataclass
class Server:
    backend: str
    url: str
    key: str
    pid: int


@dataclass
class Result:
    """One (measure, backend) cell, pooled over its rounds."""

    units: float = 0.0
    seconds: float = 0.0
    requests: int = 0
    failed: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    server_cpu_s: float = 0.0
    load_cpu_s: float = 0.0
    load_seconds: float = 0.0
    rounds: list[float] = field(default_factory=list)
    llm_ms: list[float] = field(default_factory=list)
    """rollouts: the latency of each LLM call through the gateway."""
    empty_claims: int = 0
    errors: Counter[str] = field(default_factory=Counter)

    def add(self, other: Result) -> None:
        self.units += other.units
        self.seconds += other.seconds
        self.requests += other.requests
        self.failed += other.failed
        self.latencies_ms += other.latencies_ms
        self.server_cpu_s += other.server_cpu_s
        self.load_cpu_s += other.load_cpu_s
        self.load_seconds += other.load_seconds
        self.rounds.append(other.rate)
        self.llm_ms += other.llm_ms
        self.empty_claims += other.empty_claims
        self.errors += other.errors

    def notes(self) -> list[str]:
        out = []
        if self.llm_ms:
            lat = sorted(self.llm_ms)
            out.append(f"LLM call p50 {lat[len(lat) // 2]:.1f} ms, p99 {lat[int(len(lat) * 0.99)]:.1f} ms")
        if self.empty_claims:
            out.append(f"{self.empty_claims} empty claims (the feeder lagged)")
        if self.errors:
            out.append("errors: " + ", ".join(f"{k} x{v}" for k, v in sorted(self.errors.items())))
        return out

    @property
    def rate(self) -> float:
        return self.units / self.seconds if self.seconds > 0 else 0.0

    @property
    def server_busy(self) -> float:
        return self.server_cpu_s / self.seconds if self.seconds > 0 else math.nan

    @property
    def load_busy(self) -> float:
        return self.load_cpu_s / self.load_seconds if self.load_seconds > 0 else math.nan

    @property
    def cpu_us_per_unit(self) -> float:
        return self.server_cpu_s / self.units * 1e6 if self.units else math.nan

    def percentile(self, p: float) -> float:
        if not self.latencies_ms:
            return math.nan
        lat = sorted(self.latencies_ms)
        return lat[max(0, min(len(lat) - 1, round(p / 100 * len(lat) + 0.5) - 1))]


Results = dict[tuple[str, str], Result]


# --- servers ------------------------------------------------------------------------------------------------------


def start_mock(children: Children, cpus: frozenset[int] | None) -> tuple[str, int]:
    port = free_port()
    argv = [*agl_lite_argv(), "mock-llm", "--host", "127.0.0.1", "--port", str(port), "--model", MODEL]
    children.spawn("mock-llm", argv, cpus=cpus)
    children.wait_ready("mock-llm", f"http://127.0.0.1:{port}/v1/models", 30)
    return f"http://127.0.0.1:{port}/v1", children.pid("mock-llm")


def start_server(
    children: Children, backend: str, upstream: str, tmp: Path, cpus: frozenset[int] | None, key: str
) -> Server:
    port = free_port()
    home = tmp / backend
    home.mkdir()
    (home / "routes.toml").write_text(
        f'[models.{MODEL}]\nbackend = "vllm"\nupstreams = [{{ base_url = "{upstream}" }}]\n'
    )
    (home / "agl-lite.toml").write_text(
        f'routes = "routes.toml"\n\n[server]\nhost = "127.0.0.1"\nport = {port}\n\n[log]\nlevel = "info"\n\n'
        f"[addons]\nchain = {json.dumps(list(CHAIN))}\n\n"
        f'[addons.store]\nbackend = "{backend}"\npath = "store.db"\n'
    )
    name = f"agl-lite-{backend}"
    children.spawn(
        name,
        [*agl_lite_argv(), "run", "--config", str(home / "agl-lite.toml")],
        cpus=cpus,
        env={"AGL_KEY": key},
    )
    children.wait_ready(name, f"http://127.0.0.1:{port}/healthz", 30)
    return Server(backend, f"http://127.0.0.1:{port}", key, children.pid(name))


def admin_post(server: Server, path: str, body: object) -> object:
    req = urllib.request.Request(
        server.url + path,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {server.key}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())
    except OSError as exc:
        raise BenchError(f"{server.backend}: POST {path} failed: {exc}") from exc


# --- the cells ----------------------------------------------------------------------------------------------------


def event_bodies(tmp: Path) -> tuple[Path, Path]:
    """One event (a typical agent step) and a batch of BATCH of them, as request bodies in files for hey -D."""

    def event(i: int) -> dict[str, object]:
        return {
            "kind": "step",
            "data": {"step": i, "action": "search", "observation": "found 3 results " * 4},
        }

    single, batched = tmp / "event.json", tmp / "events.json"
    single.write_text(json.dumps({"events": [event(0)]}))
    batched.write_text(json.dumps({"events": [event(i) for i in range(BATCH)]}))
    return single, batched


def hey_cell(
    hey: str,
    server: Server,
    path: str,
    body: Path,
    *,
    concurrency: int,
    seconds: float,
    per_request: int,
    cpus: Placement,
) -> Result:
    """hey POSTing `body` to `path`; every 2xx is acknowledged work worth `per_request` units."""
    argv = [
        hey,
        "-z",
        f"{seconds:g}s",
        "-c",
        str(concurrency),
        "-cpus",
        "1",
        "-m",
        "POST",
        "-D",
        str(body),
        "-T",
        "application/json",
        "-H",
        f"Authorization: Bearer {server.key}",
        "-disable-compression",
        "-o",
        "csv",
        server.url + path,
    ]
    load0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu0, t0 = cpu_seconds(server.pid), time.perf_counter()
    done = subprocess.run(
        argv, capture_output=True, check=False, timeout=seconds + 60, preexec_fn=pinned(cpus.load)
    )
    wall, server_cpu = time.perf_counter() - t0, cpu_seconds(server.pid) - cpu0
    load1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise BenchError(f"hey failed ({done.returncode}): {done.stderr.decode(errors='replace')[-500:]}")
    result = Result(load_cpu_s=(load1.ru_utime + load1.ru_stime) - (load0.ru_utime + load0.ru_stime))
    result.load_seconds = wall
    first, last = math.inf, 0.0
    for line in done.stdout.decode().splitlines():
        parts = line.split(",")
        if len(parts) < 8 or not parts[0][:1].isdigit():
            continue
        rt, status, offset = float(parts[0]), parts[6], float(parts[7])
        first, last = min(first, offset), max(last, offset + rt)
        if status.startswith("2"):
            result.requests += 1
            result.latencies_ms.append(rt * 1000)
        else:
            result.failed += 1
    result.units = result.requests * per_request
    result.seconds = max(0.0, last - first)
    # hey runs for the whole of `wall`; the server's CPU is scaled to the span the requests covered
    result.server_cpu_s = server_cpu * (result.seconds / wall) if wall > 0 else math.nan
    return result


def python_cell(
    scenario: str,
    server: Server,
    upstream_pid: int | None,
    *,
    runners: int,
    seconds: float,
    warmup: float,
    cpus: Placement,
) -> Result:
    argv = [
        PY,
        str(HERE / "store_load.py"),
        scenario,
        "--url",
        server.url,
        "--key",
        server.key,
        "--concurrency",
        str(runners),
        "--seconds",
        f"{seconds:g}",
        "--warmup",
        f"{warmup:g}",
        "--calls",
        str(CALLS),
        "--model",
        MODEL,
        "--server-pid",
        str(server.pid),
    ]
    if upstream_pid is not None:
        argv += ["--upstream-pid", str(upstream_pid)]
    done = subprocess.run(
        argv, capture_output=True, check=False, timeout=seconds + warmup + 120, preexec_fn=pinned(cpus.load)
    )
    if done.returncode != 0:
        raise BenchError(
            f"store_load.py {scenario} failed ({done.returncode}): {done.stderr.decode()[-800:]}"
        )
    out = json.loads(done.stdout)
    result = Result(
        units=len(out["units"]),
        seconds=out["seconds"],
        requests=out["requests"],
        failed=sum(out["errors"].values()),
        latencies_ms=out["units"],
        server_cpu_s=out["server_cpu_s"],
        load_cpu_s=out["load_cpu_s"] + (out["upstream_cpu_s"] if upstream_pid is not None else 0.0),
        load_seconds=out["seconds"],
        llm_ms=out["llm_ms"],
        empty_claims=out["empty_claims"],
        errors=Counter(out["errors"]),
    )
    return result


@dataclass
class Bench:
    hey: str
    servers: dict[str, Server]
    upstream_pid: int
    cpus: Placement
    single: Path
    batched: Path
    runners: int

    def cell(self, key: str, backend: str, seconds: float, warmup: float = 0.5) -> Result:
        server = self.servers[backend]
        if key == "single":
            return hey_cell(
                self.hey,
                server,
                "/api/rollouts/bench-single/events",
                self.single,
                concurrency=SINGLE_C,
                seconds=seconds,
                per_request=1,
                cpus=self.cpus,
            )
        if key == "batched":
            return hey_cell(
                self.hey,
                server,
                "/api/rollouts/bench-batched/events",
                self.batched,
                concurrency=BATCH_C,
                seconds=seconds,
                per_request=BATCH,
                cpus=self.cpus,
            )
        upstream = self.upstream_pid if key == "rollouts" else None
        return python_cell(
            key, server, upstream, runners=self.runners, seconds=seconds, warmup=warmup, cpus=self.cpus
        )

    def load(self, key: str, backend: str, seconds: float) -> Callable[[], None]:
        def run() -> None:
            self.cell(key, backend, seconds, warmup=0.0)

        return run


# --- the report -----------------------------------------------------------------------------------------------------


def _f(x: float, fmt: str) -> str:
    return "—" if math.isnan(x) else format(x, fmt)


def measured(results: Results) -> list[Measure]:
    return [m for m in MEASURES if all((m.key, b) in results for b in BACKENDS)]


def summary_rows(results: Results) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for m in measured(results):
        sq, mem = results[(m.key, "sqlite")], results[(m.key, "memory")]
        verdict = "PASS" if sq.rate >= m.reference else f"MISS ({sq.rate / m.reference:.2f}x)"
        rows.append(
            (
                m.label,
                m.unit,
                f"{sq.rate:,.0f}",
                f"{mem.rate:,.0f}",
                f"≥ {m.reference:,.0f}",
                verdict,
            )
        )
    return rows


SUMMARY_HEADER = ("measure", "unit", "SQLite", "memory", "§8 reference", "SQLite vs reference")
DETAIL_HEADER = (
    "measure",
    "backend",
    "rate",
    "rounds",
    "p50 ms",
    "p99 ms",
    "latency of",
    "server CPU µs/unit",
    "server CPU busy",
    "load CPU busy",
    "req/s",
    "non-2xx",
)


def detail_rows(results: Results) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for m in measured(results):
        for backend in BACKENDS:
            r = results[(m.key, backend)]
            rows.append(
                (
                    m.key,
                    backend,
                    f"{r.rate:,.0f}",
                    "/".join(f"{x:,.0f}" for x in r.rounds),
                    _f(r.percentile(50), ".1f"),
                    _f(r.percentile(99), ".1f"),
                    m.latency,
                    _f(r.cpu_us_per_unit, ",.0f"),
                    _f(100 * r.server_busy, ".0f") + " %",
                    _f(100 * r.load_busy, ".0f") + " %",
                    f"{r.requests / r.seconds:,.0f}" if r.seconds else "—",
                    str(r.failed),
                )
            )
    return rows


def text_table(header: tuple[str, ...], rows: list[tuple[str, ...]], left: int) -> str:
    table = [header, *rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    return "\n".join(
        "  ".join(
            f"{v:<{w}}" if i < left else f"{v:>{w}}"
            for i, (v, w) in enumerate(zip(line, widths, strict=True))
        )
        for line in table
    )


def markdown_table(header: tuple[str, ...], rows: list[tuple[str, ...]], left: int) -> str:
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(["---"] * left + ["---:"] * (len(header) - left)) + "|",
    ]
    return "\n".join([*lines, *("| " + " | ".join(r) + " |" for r in rows)])


def reading(results: Results) -> list[str]:
    """Per measure: who was busy (server or load side), and anything odd the load reported."""
    lines = []
    for m in measured(results):
        for backend in BACKENDS:
            r = results[(m.key, backend)]
            bound = (
                "server CPU-bound"
                if r.server_busy >= 0.9
                else "load side CPU-bound"
                if r.load_busy >= 0.9
                else "neither CPU saturated (waiting: latency-bound)"
            )
            extra = "; ".join(r.notes())
            lines.append(
                f"{m.key:<11} {backend:<6}: server {_f(100 * r.server_busy, '.0f')} % busy, load side "
                f"{_f(100 * r.load_busy, '.0f')} % busy -> {bound}" + (f"; {extra}" if extra else "")
            )
    return lines


# --- the run --------------------------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="~1.5 s per cell, one round (a smoke run, noisy).")
    p.add_argument(
        "--markdown", action="store_true", help="Also print the tables as markdown, with the machine."
    )
    p.add_argument(
        "--seconds", type=float, help="Seconds per cell, all rounds together (default 6; quick 1.5)."
    )
    p.add_argument("--rounds", type=int, help="Interleaved rounds per cell (default 3; quick 1).")
    p.add_argument("--no-pin", action="store_true", help="Do not pin the servers and the load side to CPUs.")
    p.add_argument(
        "--profile", action="store_true", help="Afterwards, py-spy the SQLite gateway under each load."
    )
    p.add_argument(
        "--profile-backend",
        choices=BACKENDS,
        default="sqlite",
        help="The gateway --profile samples (default sqlite).",
    )
    p.add_argument(
        "--skip-gateway",
        action="store_true",
        help="Do not re-run the gateway bench with the full capture chain.",
    )
    p.add_argument(
        "--runners",
        type=int,
        default=RUNNERS,
        help=f"Concurrent runners of the transitions and rollouts cells (default {RUNNERS}).",
    )
    p.add_argument("--only", help="Comma-separated measures to run (single,batched,transitions,rollouts).")
    p.add_argument("--keep-logs", action="store_true", help="Keep the servers' logs, configs and stores.")
    return p.parse_args()


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run(args: argparse.Namespace, hey: str, tmp: Path) -> int:
    seconds = args.seconds or (1.5 if args.quick else 6.0)
    rounds = max(1, args.rounds or (1 if args.quick else 3))
    warmup = 0.5 if args.quick else 1.0
    measures = [m for m in MEASURES if not args.only or m.key in args.only.split(",")]
    cpus = Placement.choose(pin=not args.no_pin)
    info = machine()
    key = secrets.token_hex(32)
    results: Results = {}
    with Children(tmp) as children:
        log(f"starting the mock vLLM and agl-lite on {' and '.join(BACKENDS)} ({cpus.describe()}) ...")
        upstream, upstream_pid = start_mock(children, cpus.load)
        servers = {b: start_server(children, b, upstream, tmp, cpus.server, key) for b in BACKENDS}
        single, batched = event_bodies(tmp)
        for server in servers.values():
            admin_post(
                server,
                "/api/rollouts",
                {
                    "rollouts": [
                        {"rollout_id": "bench-single", "input": {}},
                        {"rollout_id": "bench-batched", "input": {}},
                    ]
                },
            )
            # running, so that the runners of the later cells never claim them
            admin_post(server, "/api/runner/claim", {"runner_id": "bench-events", "limit": 2})
        bench = Bench(hey, servers, upstream_pid, cpus, single, batched, args.runners)
        for m in measures:
            log(f"{m.key}: warm-up, then {seconds:g} s per backend in {rounds} interleaved round(s) ...")
            for backend in BACKENDS:
                bench.cell(m.key, backend, warmup, warmup=0.3)
            for _ in range(rounds):
                for backend in BACKENDS:
                    result = bench.cell(m.key, backend, seconds / rounds, warmup=warmup)
                    results.setdefault((m.key, backend), Result()).add(result)
        setup = (
            f"{seconds:g} s per cell in {rounds} interleaved round(s); {cpus.describe()} (each gateway, with its "
            f"SQLite writer thread, on that one CPU); chain {', '.join(CHAIN)}; SQLite synchronous=NORMAL (WAL); "
            f"upstream of the simulated rollouts: agl-lite mock-llm; hey -cpus 1 for single/batched, "
            f"store_load.py (aiohttp, one process) for transitions/rollouts"
        )
        print()
        print(
            f"store bench  {info['date']}  {info['nproc']} CPUs {info['cpu']}  Python {info['python']}  "
            f"aiohttp {info['aiohttp']}  agl-lite {info['agl-lite']}\n{setup}"
        )
        print(text_table(SUMMARY_HEADER, summary_rows(results), 2))
        print()
        print(text_table(DETAIL_HEADER, detail_rows(results), 2))
        print()
        print("\n".join(reading(results)))
        if args.markdown:
            print()
            print(
                f"**{info['date']}** — `nproc` {info['nproc']}, {info['cpu']}, {info['os']}, Python {info['python']}, "
                f"aiohttp {info['aiohttp']}, agl-lite {info['agl-lite']}; {setup}.\n"
            )
            print(markdown_table(SUMMARY_HEADER, summary_rows(results), 2))
            print()
            print(markdown_table(DETAIL_HEADER, detail_rows(results), 2))
            print()
            print("```\n" + "\n".join(reading(results)) + "\n```")
        if args.profile:
            profile(bench, args.profile_backend, measures, tmp, seconds)
        children.stop_all()
    if args.skip_gateway:
        return 0
    # The cells above wrote hundreds of MB; let the kernel write them back now rather than during the gateway's
    # cells, where its writeback competed with the server under test (a stream cell measured 0.59x instead of
    # ~0.8x right after them).
    log("syncing what the store cells wrote ...")
    os.sync()
    log("the gateway bench with the full capture chain and the SQLite store ...")
    print("\ngateway bench, full capture chain and default durability:")
    gw_args = ["--chain", ",".join(CHAIN)]
    gw_args += ["--quick"] if args.quick else []
    gw_args += ["--markdown"] if args.markdown else []
    gw_args += ["--no-pin"] if args.no_pin else []
    gw_args += ["--profile"] if args.profile else []
    gw_tmp = tmp / "gateway"
    gw_tmp.mkdir()
    return gateway.run(gateway.parse_args(gw_args), hey, gw_tmp)


def profile(bench: Bench, backend: str, measures: list[Measure], tmp: Path, seconds: float) -> None:
    spy = py_spy_path()
    if spy is None:
        print("\nprofile: py-spy not found (pip install py-spy)")
        return
    server = bench.servers[backend]
    for m in measures:
        out = tmp / f"profile-{backend}-{m.key}.txt"
        print(f"\nprofile of agl-lite on {backend} (pid {server.pid}), {m.key}, {seconds:g} s:")
        try:
            record(spy, server.pid, seconds, out, bench.load(m.key, backend, seconds + 1))
        except (RuntimeError, OSError, BenchError) as exc:
            print(f"  py-spy failed: {exc}")
            continue
        print("\n".join(components(out)))
        print("\n".join(summarise(out, top=12)))


def main() -> int:
    return bench_main("store bench", run, parse_args(), hey_path(), HEY_MISSING, "agl-bench-store-")


if __name__ == "__main__":
    sys.exit(main())
