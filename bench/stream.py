"""Stream bench (DESIGN.md §8): per-chunk relay delay and memory per idle stream, direct vs bare relay vs agl-lite.

- Per-chunk delay: the upstream (`stream_upstream.py`) writes a text delta every 10 ms holding the moment of its
  write; the client notes when each delta reaches it. Measured at 1 and 32 concurrent streams, in interleaved
  rounds; the figure that matters is what a server adds to direct's p99 (budget: ≤ 1 ms, checked at c=1). At
  c=32 the streams tick together, as one vLLM batch step emits a token for every running sequence: each burst of
  32 deltas queues on the server's one event loop, so there agl-lite is compared with the bare relay.
- Memory per idle stream: `--idle` streams held open (the upstream sent the first event and waits), then as many
  again; the server's RSS between the two, per stream (budget: ≤ 50 KB). The slope leaves out one-time growth
  and memory the allocator kept from earlier streams.

Run: `.venv/bin/python bench/stream.py [--markdown]` (no `hey` needed: the client is this process).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import resource
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httptools
from procs import BenchError, Children, Placement, free_port, process_frame
from report import machine
from servers import PY, Target, start_agl_lite, start_relay
from stream_upstream import TICK_EVENTS, TICK_INTERVAL_S

FULL_CHAIN = ("store", "auth", "store_api", "control", "metrics", "route", "capture", "tokens", "sink")
CONCURRENCY = (1, 32)
SERIAL_STREAMS = 2
"""Streams one after the other per round at c=1 (with the rounds: 800 deltas per target to read a p99 from)."""
CHUNK_BUDGET_MS = 1.0
IDLE_BUDGET_KB = 50.0
_SENT = re.compile(rb'"content":"(\d{6,})"')


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def request_bytes(target: Target, user: str) -> bytes:
    url = urlsplit(target.url)
    body = (
        b'{"model":"bench","messages":[{"role":"user","content":"Count."}],"stream":true,"user":"%s"}'
        % user.encode()
    )
    headers = "".join(f"{k}: {v}\r\n" for k, v in target.headers.items())
    return (
        f"POST {url.path} HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Type: application/json\r\n{headers}"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


class StreamClient(asyncio.Protocol):
    """One streamed request: the delay of each text delta (ns), and when the first event came."""

    def __init__(self, request: bytes) -> None:
        self.request = request
        self.parser = httptools.HttpResponseParser(self)
        self.delays: list[int] = []
        self.status = 0
        self.first_event: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None
        self.closing = False
        self._body = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.closing:
            return
        for fut in (self.first_event, self.done):
            if not fut.done():
                fut.set_exception(
                    BenchError(f"the stream ended early (status {self.status}, {exc or 'EOF'})")
                )

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        now = time.monotonic_ns()
        buf = self._body + body
        cut = buf.rfind(b"\n\n") + 2
        if cut < 2:
            self._body = buf
            return
        self.delays.extend(now - int(sent) for sent in _SENT.findall(buf, 0, cut))
        self._body = buf[cut:]
        if not self.first_event.done():
            self.first_event.set_result(None)

    def on_message_complete(self) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def close(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.close()


async def open_stream(target: Target, user: str) -> StreamClient:
    url = urlsplit(target.url)
    loop = asyncio.get_running_loop()
    _, client = await loop.create_connection(
        lambda: StreamClient(request_bytes(target, user)), url.hostname or "127.0.0.1", url.port or 80
    )
    return client


async def tick_round(target: Target, concurrency: int) -> list[int]:
    """`concurrency` ticking streams at once; every text delta's delay, in ns."""
    clients = await asyncio.gather(*(open_stream(target, "tick") for _ in range(concurrency)))
    try:
        await asyncio.wait_for(asyncio.gather(*(c.done for c in clients)), TICK_EVENTS * TICK_INTERVAL_S + 30)
    finally:
        for c in clients:
            c.close()
    delays = [d for c in clients for d in c.delays]
    bad = [c.status for c in clients if c.status != 200 or len(c.delays) != TICK_EVENTS]
    if bad:
        raise BenchError(f"{target.name}: {len(bad)} tick stream(s) failed (statuses {sorted(set(bad))})")
    return delays


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise BenchError(f"no VmRSS for pid {pid}")


async def hold(target: Target, n: int) -> list[StreamClient]:
    """`n` idle streams, each past its first event (opened 64 at a time, as clients arriving)."""
    clients: list[StreamClient] = []
    for start in range(0, n, 64):
        batch = await asyncio.gather(*(open_stream(target, "hold") for _ in range(min(64, n - start))))
        await asyncio.wait_for(asyncio.gather(*(c.first_event for c in batch)), 30)
        clients += batch
    return clients


async def idle_kb_per_stream(target: Target, n: int) -> tuple[float, int, int]:
    """(KB per idle stream, RSS with `n` idle streams open, RSS with `2n`): the slope between `n` and `2n` held at
    once, so that neither one-time growth (the first streams) nor memory the allocator kept from earlier streams
    and hands out again (below the high-water mark) is counted."""
    assert target.pid is not None
    held = await hold(target, n)
    await settle(target.pid)
    at_n = rss_kb(target.pid)
    held += await hold(target, n)
    await settle(target.pid)
    at_2n = rss_kb(target.pid)
    for c in held:
        c.close()
    await settle(target.pid)
    return (at_2n - at_n) / n, at_n, at_2n


async def settle(pid: int) -> None:
    """Wait until the server's RSS stops moving (it handles the opens or closes it was sent), at most 5 s."""
    last, still = rss_kb(pid), 0
    deadline = time.monotonic() + 5
    while still < 3 and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        now = rss_kb(pid)
        still = still + 1 if now == last else 0
        last = now


@dataclass
class Row:
    target: str
    concurrency: int
    delays_ns: list[int] = field(default_factory=list)

    def pct(self, p: float) -> float:
        xs = sorted(self.delays_ns)
        return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] / 1e6


def start_stream_upstream(children: Children, cpus: frozenset[int] | None) -> Target:
    port = free_port()
    argv = [PY, str(Path(__file__).resolve().parent / "stream_upstream.py"), "--port", str(port)]
    children.spawn("upstream", argv, cpus=cpus)
    children.wait_ready("upstream", f"http://127.0.0.1:{port}/v1/models", 15)
    return Target("direct", f"http://127.0.0.1:{port}/v1/chat/completions", pid=children.pid("upstream"))


def raise_open_files(idle: int) -> None:
    """2 x `idle` streams are held at once, each a socket here and two in the server: lift the soft limit on open
    files to what that needs (the servers started after inherit it), or say why it cannot be."""
    needed = 4 * idle + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            raise BenchError(
                f"--idle {idle} needs {needed} open files; the hard limit is {hard} (ulimit -Hn)"
            )
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def run(args: argparse.Namespace, tmp: Path) -> int:
    raise_open_files(args.idle)
    cpus = Placement.choose(pin=not args.no_pin)
    chain = tuple(name.strip() for name in args.chain.split(",") if name.strip())
    info = machine()
    with Children(tmp) as children:
        log(f"starting the ticking upstream, the bare relay and agl-lite ({cpus.describe()}) ...")
        direct = start_stream_upstream(children, cpus.load)
        base = direct.url.removesuffix("/v1/chat/completions")
        targets = [
            direct,
            start_relay(children, base, cpus.server),
            start_agl_lite(children, base, tmp, cpus.server, chain),
        ]
        rows = {(t.name, c): Row(t.name, c) for c in CONCURRENCY for t in targets}
        idle: dict[str, tuple[float, int, int]] = {}

        async def measure() -> None:
            for t in targets:  # warm-up, and a check that each answers the ticking stream whole
                await tick_round(t, 4)
            log(
                f"per-chunk delay: {TICK_EVENTS} deltas {TICK_INTERVAL_S * 1000:g} ms apart per stream, "
                f"{args.rounds} interleaved round(s) at concurrency {', '.join(map(str, CONCURRENCY))} ..."
            )
            for _ in range(args.rounds):
                for c in CONCURRENCY:
                    for t in targets:
                        for _ in range(SERIAL_STREAMS if c == 1 else 1):
                            rows[(t.name, c)].delays_ns += await tick_round(t, c)
            log(f"memory: {args.idle}, then {2 * args.idle} idle streams held per server ...")
            for t in targets[1:]:
                idle[t.name] = await idle_kb_per_stream(t, args.idle)

        asyncio.run(measure())
    lines, ok = report(rows, idle, args.idle)
    setup = (
        f"{TICK_EVENTS} text deltas {TICK_INTERVAL_S * 1000:g} ms apart per stream, {args.rounds} round(s); "
        f"{args.idle} idle streams; {cpus.describe()}; agl-lite chain {', '.join(chain)}"
    )
    print(
        f"\nstream bench  {info['date']}  {info['nproc']} CPUs {info['cpu']}  Python {info['python']}\n{setup}"
    )
    print("\n".join(lines))
    if args.markdown:
        print(
            f"\n**{info['date']}** — `nproc` {info['nproc']}, {info['cpu']}, Python {info['python']}; {setup}.\n"
        )
        print("\n".join(markdown(rows, idle)))
        print("\n```\n" + "\n".join(lines) + "\n```")
    return 0 if ok else 4


def added_p99(rows: dict[tuple[str, int], Row]) -> dict[tuple[str, int], float]:
    """What each cell's p99 adds to direct's at the same concurrency, in ms."""
    return {(name, c): row.pct(99) - rows[("direct", c)].pct(99) for (name, c), row in rows.items()}


def report(
    rows: dict[tuple[str, int], Row], idle: dict[str, tuple[float, int, int]], n: int
) -> tuple[list[str], bool]:
    """The table and the verdict: the budget at c=1; at c=32, agl-lite against the bare relay (see the module doc)."""
    lines = [
        f"{'target':12} {'c':>3} {'deltas':>7} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'added p99':>9}"
    ]
    added = added_p99(rows)
    for (name, c), row in rows.items():
        lines.append(
            f"{name:12} {c:>3} {len(row.delays_ns):>7} {row.pct(50):>7.2f} {row.pct(99):>7.2f} "
            f"{max(row.delays_ns) / 1e6:>7.2f} {'—' if name == 'direct' else f'{added[(name, c)]:+.2f}':>9}"
        )
    ok = added[("agl-lite", 1)] <= CHUNK_BUDGET_MS
    lines.append(
        f"budget   per-chunk c=1 : agl-lite adds p99 {added[('agl-lite', 1)]:+.2f} ms (<= {CHUNK_BUDGET_MS:g}) "
        f"{'PASS' if ok else 'MISS'}  [bare relay: {added[('bare relay', 1)]:+.2f}]"
    )
    c = CONCURRENCY[-1]
    lines.append(
        f"         per-chunk c={c}: agl-lite adds p99 {added[('agl-lite', c)]:+.2f} ms, the bare relay "
        f"{added[('bare relay', c)]:+.2f} (the burst of {c} deltas queues on one event loop)"
    )
    for name, (kb, at_n, at_2n) in idle.items():
        line = (
            f"memory   {name:10}: {kb:.1f} KB per idle stream (RSS {at_n / 1024:.1f} MiB with {n} idle, "
            f"{at_2n / 1024:.1f} with {2 * n})"
        )
        if name == "agl-lite":
            passed = kb <= IDLE_BUDGET_KB
            ok &= passed
            line += f" (<= {IDLE_BUDGET_KB:g} KB) {'PASS' if passed else 'MISS'}"
        lines.append(line)
    gap = statistics.median(rows[("direct", 1)].delays_ns) / 1e6
    lines.append(f"note: direct's median delay at c=1 ({gap:.2f} ms) is the client's and the upstream's own.")
    return lines, ok


def markdown(rows: dict[tuple[str, int], Row], idle: dict[str, tuple[float, int, int]]) -> list[str]:
    out = [
        "| target | c | text deltas | p50 ms | p99 ms | max ms | added p99 ms | KB per idle stream |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    added = added_p99(rows)
    for (name, c), row in rows.items():
        kb = f"{idle[name][0]:.1f}" if name in idle and c == CONCURRENCY[-1] else "—"
        out.append(
            f"| {name} | {c} | {len(row.delays_ns):,} | {row.pct(50):.2f} | {row.pct(99):.2f} | "
            f"{max(row.delays_ns) / 1e6:.2f} | {'—' if name == 'direct' else f'{added[(name, c)]:+.2f}'} | {kb} |"
        )
    return out


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--markdown", action="store_true", help="Also print the table as markdown, with the machine."
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=10,
        help="Interleaved rounds per cell (default 10: short rounds spread this VM's hiccups over the targets).",
    )
    p.add_argument("--idle", type=int, default=512, help="Idle streams held open per server (default 512).")
    p.add_argument("--no-pin", action="store_true", help="Do not pin the servers and the load side to CPUs.")
    p.add_argument(
        "--keep-logs", action="store_true", help="Keep the servers' logs and configs; print where."
    )
    p.add_argument(
        "--chain",
        default=",".join(FULL_CHAIN),
        help="agl-lite's addon chain, comma-separated (default: the full capture chain, SQLite store).",
    )
    return p.parse_args(argv)


def main() -> int:
    return process_frame("stream bench", run, parse_args(), "agl-stream-bench-")


if __name__ == "__main__":
    sys.exit(main())
