"""Fault injection under load (issue #9, point 1): the engine behind tests/reliability/test_faults.py (the CI
variant) and bench/soak.py (`make soak`, the long one).

A gateway process (default chain, SQLite store) sits in front of the mock vLLM served here, whose request counters
and open TCP connections are read directly. Each cycle enqueues one rollout per worker, starts an attempt on each,
and sends calls with the attempts' agent keys at the given concurrency. A seeded plan gives every call its fate:
a mid-stream upstream error frame, a connection reset, a stall (the gateway's read timeout ends it), a client that
disconnects after the first chunk, or nothing. After each cycle:

- the gateway drained (no LLM call in flight) and so did the mock (no request, stream or stall left open);
- every call has exactly one record, with the outcome its fate implies, and the client saw what it should;
- the gateway's log holds no traceback, no exception and no error-level event;
- it still answers (`/healthz` and a plain call); its RSS and the mock's open connections are noted.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from agl_lite.addons import DEFAULT_CHAIN
from agl_lite.testing import MockVLLM
from agl_lite.testing.gateway import write_config
from agl_lite.testing.mock_vllm import create_app
from agl_lite.testing.mock_vllm.scenario import Scenario, last_user_text

from .gateway_process import GatewayProcess, log_problems, start_gateway

MODEL = "smollm2"
FAULTS = ("error_frame", "reset", "stall", "disconnect")
SCENARIOS = {
    "error_frame": Scenario(error_frame_after=2),
    "reset": Scenario(reset_after=2),
    "stall": Scenario(stall_after=2),
    # A slow stream, so that the client's disconnect lands while the upstream is still sending.
    "disconnect": Scenario(content="slowly " * 80, chunk_delay_s=0.05),
}
EXPECTED_OUTCOME = {
    "ok": "ok",
    "error_frame": "upstream_error",
    "reset": "upstream_error",
    "stall": "upstream_error",
    "disconnect": "client_disconnected",
}
PLAIN_STATUS = {"ok": 200, "error_frame": 500, "reset": 502, "stall": 504}
"""What a client of a non-streamed call gets for each fate (a stream always starts 200 and reports in-band)."""
READ_TIMEOUT_S = 1.5
"""The gateway's upstream read timeout here: what ends a stall."""


@dataclass(frozen=True, slots=True)
class FaultMix:
    error_frame: float = 0.01
    reset: float = 0.01
    stall: float = 0.01
    disconnect: float = 0.10
    stream_share: float = 0.7
    """Calls that stream; a disconnect is always a stream."""


@dataclass(frozen=True, slots=True)
class Call:
    tag: str
    fate: str
    stream: bool


@dataclass
class Cycle:
    index: int
    calls: int
    seconds: float
    rss_bytes: int
    mock_connections: int
    """TCP connections open at the mock once the cycle drained (the gateway's idle keep-alive pool)."""
    mock_connections_peak: int
    mock_connections_made: int
    """Upstream connections the gateway opened during the cycle (each fault but an error frame closes one)."""
    fates: Counter[str]
    problems: list[str]


@dataclass
class FaultReport:
    seed: int
    concurrency: int
    cycles: list[Cycle] = field(default_factory=list)
    connections_after_idle: int | None = None
    """Open at the mock once the gateway's keep-alive timeout passed with no traffic: 0 when all were released."""

    @property
    def calls(self) -> int:
        return sum(c.calls for c in self.cycles)

    @property
    def problems(self) -> list[str]:
        return [f"cycle {c.index}: {p}" for c in self.cycles for p in c.problems]

    def rss_growth(self, cycles: int | None = None) -> float:
        """RSS after cycle `cycles` (default: the last) relative to after the first (0.05 = 5 % more)."""
        upto = self.cycles[: cycles or len(self.cycles)]
        return upto[-1].rss_bytes / upto[0].rss_bytes - 1.0


def plan_cycle(rng: random.Random, cycle: int, n: int, mix: FaultMix) -> list[Call]:
    """Exactly round(share × n) calls of each fault (at least one), at seeded random places."""
    fates: list[str] = []
    for fault in FAULTS:
        fates += [fault] * max(1, round(getattr(mix, fault) * n))
    fates += ["ok"] * (n - len(fates))
    rng.shuffle(fates)
    return [
        Call(f"call {cycle}-{i}", fate, fate == "disconnect" or rng.random() < mix.stream_share)
        for i, fate in enumerate(fates)
    ]


# --- the mock ----------------------------------------------------------------------------------------------------


class ConnectionCount:
    """TCP connections open at an aiohttp server, counted as the server is told of them (connection made, lost),
    with an event per change so a test can wait for a count instead of polling."""

    def __init__(self, server: web.Server) -> None:
        self.open = 0
        self.made = 0
        """Connections opened since the start: with keep-alive reuse, far fewer than requests."""
        self._changed = asyncio.Event()
        made, lost = server.connection_made, server.connection_lost

        def on_made(handler: Any, transport: Any) -> None:
            made(handler, transport)
            self._count(+1)

        def on_lost(handler: Any, exc: BaseException | None = None) -> None:
            lost(handler, exc)
            self._count(-1)

        server.connection_made = on_made  # type: ignore[method-assign]
        server.connection_lost = on_lost  # type: ignore[method-assign]

    def _count(self, delta: int) -> None:
        self.open += delta
        self.made += delta > 0
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait_until(self, predicate: Callable[[int], bool], timeout: float) -> None:
        async with asyncio.timeout(timeout):
            while not predicate(self.open):
                await self._changed.wait()


@dataclass
class ServedMock:
    mock: MockVLLM
    url: str
    connections: ConnectionCount


@asynccontextmanager
async def serve_mock(plan: dict[str, Scenario]) -> AsyncIterator[ServedMock]:
    """The mock vLLM on a free port; each request's scenario is looked up by its tag in `plan`."""
    mock = MockVLLM((MODEL,), hook=lambda body: plan.get(last_user_text(body)))
    runner = web.AppRunner(create_app(mock), handler_cancellation=True, shutdown_timeout=2.0, access_log=None)
    await runner.setup()
    try:
        assert runner.server is not None
        count = ConnectionCount(runner.server)
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        yield ServedMock(mock, f"http://127.0.0.1:{runner.addresses[0][1]}/v1", count)
    finally:
        await runner.cleanup()


# --- one call, as an agent makes it --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Agent:
    rollout_id: str
    attempt_id: str
    base_url: str
    key: str


async def make_call(http: aiohttp.ClientSession, agent: Agent, call: Call) -> str | None:
    """Send one call; None when the client saw what its fate implies, else what was wrong."""
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": call.tag}],
        "max_tokens": 100,
        "stream": call.stream,
    }
    headers = {"Authorization": f"Bearer {agent.key}"}
    async with http.post(f"{agent.base_url}/chat/completions", json=body, headers=headers) as resp:
        if call.fate == "disconnect":
            first = await resp.content.readany()
            resp.close()  # the agent goes away mid-stream
            return None if resp.status == 200 and first else f"disconnect: {resp.status} {first[:100]!r}"
        raw = await resp.read()
    if call.stream:
        error_event = b'data: {"error"' in raw
        done = raw.rstrip().endswith(b"data: [DONE]")
        if resp.status != 200 or error_event != (call.fate != "ok") or (call.fate == "ok" and not done):
            return (
                f"{call.fate} stream: {resp.status}, error event {error_event}, [DONE] {done}: {raw[-200:]!r}"
            )
        return None
    want = PLAIN_STATUS[call.fate]
    if resp.status != want:
        return f"{call.fate} plain: {resp.status}, want {want}: {raw[:200]!r}"
    obj = orjson.loads(raw)
    if not (obj.get("choices") if call.fate == "ok" else "error" in obj):
        return f"{call.fate} plain: unexpected body {raw[:200]!r}"
    return None


# --- the admin side ---------------------------------------------------------------------------------------------


class Admin:
    def __init__(self, http: aiohttp.ClientSession, url: str, key: str) -> None:
        self.http, self.url = http, url
        self.headers = {"Authorization": f"Bearer {key}"}

    async def call(self, method: str, path: str, body: Any = None, ok: int = 200) -> Any:
        async with self.http.request(method, self.url + path, json=body, headers=self.headers) as resp:
            raw = await resp.read()
        assert resp.status == ok, f"{method} {path}: {resp.status} {raw[:300]!r}"
        return orjson.loads(raw)

    async def agents(self, n: int, tag: str) -> list[Agent]:
        """n running rollouts with one attempt each: what n agents of a runner would hold."""
        ids = [f"{tag}-{i}" for i in range(n)]
        await self.call(
            "POST", "/api/rollouts", {"rollouts": [{"rollout_id": r, "input": {}} for r in ids]}, 201
        )
        claimed = await self.call("POST", "/api/runner/claim", {"runner_id": tag, "limit": n})
        assert sorted(r["id"] for r in claimed["rollouts"]) == sorted(ids)
        started = await asyncio.gather(
            *(self.call("POST", f"/api/rollouts/{r}/attempts", {}, 201) for r in ids)
        )
        return [
            Agent(rid, got["attempt"]["id"], got["env"]["OPENAI_BASE_URL"], got["env"]["OPENAI_API_KEY"])
            for rid, got in zip(ids, started, strict=True)
        ]

    async def finish(self, agent: Agent) -> None:
        path = f"/api/rollouts/{agent.rollout_id}"
        await self.call(
            "PATCH", f"{path}/attempts/{agent.attempt_id}", {"status": "succeeded", "exit_code": 0}
        )
        await self.call("POST", f"{path}/finish", {"status": "succeeded"})

    async def calls(self, rollout_id: str, after: int = -1) -> list[dict[str, Any]]:
        """The rollout's captured calls with an ordering key past `after`, every page."""
        out: list[dict[str, Any]] = []
        while True:
            page = await self.call(
                "GET", f"/api/rollouts/{rollout_id}/calls?limit=1000&after_order_key={after}"
            )
            out += page["calls"]
            if len(page["calls"]) < 1000:
                return out
            after = page["calls"][-1]["order_key"]


def check_records(calls: list[Call], records: list[dict[str, Any]]) -> list[str]:
    """Exactly one record per call, with the outcome its fate implies."""
    by_tag: dict[str, list[str]] = {}
    for rec in records:
        messages = (rec.get("request") or {}).get("messages") or [{}]
        by_tag.setdefault(str(messages[-1].get("content")), []).append(rec["outcome"])
    problems = []
    for call in calls:
        got = by_tag.pop(call.tag, [])
        if got != [EXPECTED_OUTCOME[call.fate]]:
            problems.append(f"{call.tag} ({call.fate}, stream={call.stream}): records {got}")
    problems += [f"record of a call never made: {tag} {outcomes}" for tag, outcomes in by_tag.items()]
    return problems


# --- the run ------------------------------------------------------------------------------------------------------


def gateway_config(directory: Path, mock_url: str) -> Path:
    write_config(
        directory,
        {MODEL: [mock_url]},
        chain=DEFAULT_CHAIN,  # the whole chain a user runs, spelled out in the config
        addons={"store": {"backend": "sqlite", "path": "soak.db"}},
        extra={
            "log": {"format": "json", "level": "info"},
            "upstream": {"read_timeout": READ_TIMEOUT_S, "keepalive_timeout": 2.0},
        },
    )
    return directory / "agl-lite.toml"


async def run_cycle(
    gw: GatewayProcess,
    served: ServedMock,
    admin: Admin,
    http: aiohttp.ClientSession,
    plan: dict[str, Scenario],
    calls: list[Call],
    index: int,
    concurrency: int,
    agents: list[Agent] | None = None,
) -> Cycle:
    """One cycle; with `agents` (kept across cycles) no rollout is created or finished."""
    log_from, made_before = len(gw.stderr), served.connections.made
    order_key_before = (
        time.time_ns() - 1
    )  # ordering keys are nanoseconds since the epoch, taken at request start
    fresh = agents is None
    if agents is None:
        agents = await admin.agents(concurrency, f"c{index}")
    for call in calls:
        if call.fate in SCENARIOS:
            plan[call.tag] = SCENARIOS[call.fate]
    problems: list[str] = []
    peak = 0

    async def worker(w: int) -> None:
        nonlocal peak
        for call in calls[w::concurrency]:
            try:
                wrong = await make_call(http, agents[w], call)
            except (aiohttp.ClientError, TimeoutError) as exc:
                wrong = f"{call.tag} ({call.fate}): the client got {exc!r}"
            if wrong is not None:
                problems.append(wrong)
            peak = max(peak, served.connections.open)

    t0 = time.monotonic()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    seconds = time.monotonic() - t0
    state = await admin.call("GET", "/api/gateway/state?wait_drained=30")
    if state["in_flight"]:
        problems.append(f"gateway not drained: {state['in_flight']} LLM calls in flight")
    mock = served.mock
    try:
        await mock.wait_until(lambda m: m.in_flight == m.open_streams == m.stalled_streams == 0, timeout=10)
    except TimeoutError:
        problems.append(f"upstream requests left open at the mock: {mock.stats()}")
    # Only this cycle's records (kept rollouts hold the earlier ones too): ordering keys grow across cycles.
    pages = await asyncio.gather(*(admin.calls(a.rollout_id, after=order_key_before) for a in agents))
    problems += check_records(calls, [r for page in pages for r in page])
    if fresh:
        await asyncio.gather(*(admin.finish(a) for a in agents))
    for call in calls:
        plan.pop(call.tag, None)
    problems += log_problems(gw.stderr[log_from:])
    problems += await still_serving(http, admin)
    return Cycle(
        index,
        len(calls),
        seconds,
        gw.rss_bytes(),
        served.connections.open,
        peak,
        served.connections.made - made_before,
        Counter(c.fate for c in calls),
        problems,
    )


async def still_serving(http: aiohttp.ClientSession, admin: Admin) -> list[str]:
    async with http.get(admin.url + "/healthz") as resp:
        if resp.status != 200:
            return [f"/healthz answered {resp.status}"]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "still there?"}], "max_tokens": 4}
    async with http.post(admin.url + "/v1/chat/completions", json=body, headers=admin.headers) as resp:
        if resp.status != 200:
            return [f"a plain call after the cycle answered {resp.status}: {(await resp.read())[:200]!r}"]
    return []


async def run_faults(
    directory: Path,
    *,
    admin_key: str,
    seed: int,
    cycles: int,
    calls_per_cycle: int,
    concurrency: int = 64,
    mix: FaultMix = FaultMix(),
    on_cycle: Callable[[Cycle], None] | None = None,
    same_rollouts: bool = False,
) -> FaultReport:
    """Run the cycles against a fresh gateway process; the report holds every problem seen (none expected).

    By default every cycle runs on fresh rollouts (as training does); `same_rollouts` keeps one set for all cycles,
    which tells memory that grows per rollout or attempt from memory that grows per call.
    """
    rng = random.Random(seed)
    plan: dict[str, Scenario] = {}
    report = FaultReport(seed, concurrency)
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=60)
    async with (
        serve_mock(plan) as served,
        aiohttp.ClientSession(connector=connector, timeout=timeout) as http,
    ):
        gw = await start_gateway(gateway_config(directory, served.url), env={"AGL_KEY": admin_key})
        try:
            admin = Admin(http, gw.url, admin_key)
            kept = await admin.agents(concurrency, "kept") if same_rollouts else None
            for index in range(cycles):
                calls = plan_cycle(rng, index, calls_per_cycle, mix)
                cycle = await run_cycle(gw, served, admin, http, plan, calls, index, concurrency, kept)
                report.cycles.append(cycle)
                if on_cycle is not None:
                    on_cycle(cycle)
            await http.close()  # our own keep-alive connections to the gateway go too
            with contextlib.suppress(TimeoutError):  # the gateway's keep-alive timeout is 2 s
                await served.connections.wait_until(lambda n: n == 0, timeout=10)
            report.connections_after_idle = served.connections.open
        finally:
            gw.kill()
            await gw.wait()
    return report
