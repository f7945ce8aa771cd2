"""Crash durability (DESIGN.md §4, issue #9 point 2): the engine behind tests/integration/test_durability.py (the
CI variant) and bench/crash.py (20 trials, with figures).

Workers drive a gateway process (SQLite store, capture chain, the mock vLLM upstream served here) with mixed
ingest and log every write the server acknowledged (a 2xx; for an LLM call, the whole response: `[DONE]` or the
full body): enqueue, claim, attempts, admin events and rewards, agents' events, calls and (trusted) rewards with
their agent keys, graders' rewards with the grader key, attempt outcomes, verdicts and cancels. The server is
SIGKILLed after a seeded random number of acknowledged writes, while other writes are in flight, and restarted on
the same file. Then every logged write must be there and no rollout may be in an impossible state. The trials
accumulate on one file, so each restart also reopens what earlier kills left behind.

Finally `recover` restarts the gateway with the local runner (the runner id the workers claimed with) and checks
that it takes back every rollout the kills left running: their running attempts become `lost`, a fresh attempt
runs where the cap allows (its agent's call captured), and every rollout ends.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from agl_lite.core.contract import KeyRole, derive_key
from agl_lite.testing.gateway import write_config

from .gateway_process import GatewayProcess, start_gateway

MODEL = "smollm2"
RUNNER_ID = "crash"
WORKERS = 6
ACKS = (60, 300)
"""Range of the number of acknowledged writes (this trial's) after which the server is killed."""
TERMINAL = {"succeeded", "failed", "cancelled"}
CHAIN: tuple[str, ...] = ("store", "auth", "store_api", "control", "route", "capture", "tokens", "sink")

RECOVERY_AGENT = """
set -eu
curl -sf -H "Authorization: Bearer $OPENAI_API_KEY" -H "Content-Type: application/json" \\
  "$OPENAI_BASE_URL/chat/completions" \\
  -d '{"model": "smollm2", "messages": [{"role": "user", "content": "recovered"}], "max_tokens": 4}' >/dev/null
"""


def write_crash_config(directory: Path, mock_url: str, *, runner: bool = False, dsn: str = "") -> Path:
    """The gateway under test; with `runner`, the same store with the local runner added to the chain. The store:
    SQLite in `directory`, or PostgreSQL at `dsn`."""
    store = {"dsn": dsn} if dsn else {"backend": "sqlite", "path": str(directory / "store.db")}
    addons: dict[str, Any] = {"store": store}
    chain = CHAIN
    if runner:
        agent = directory / "agent.sh"
        agent.write_text(RECOVERY_AGENT)
        chain += ("runner",)
        addons["runner"] = {
            "runner_id": RUNNER_ID,
            "command": ["/bin/sh", str(agent)],
            "concurrency": 8,
            "grace_s": 0.5,
        }
    sub = directory / ("with-runner" if runner else "gateway")
    sub.mkdir(parents=True, exist_ok=True)
    write_config(sub, {MODEL: [mock_url]}, chain=chain, addons=addons, extra={"log": {"format": "json"}})
    return sub / "agl-lite.toml"


# --- the client and its log of acknowledged writes ---------------------------------------------------------------


class Killed(Exception):
    """The server is gone: this worker stops."""


@dataclass
class Ledger:
    """What the server acknowledged, across all trials."""

    rollouts: set[str] = field(default_factory=set)
    events: dict[str, list[Any]] = field(default_factory=dict)
    """rollout id -> the data of its acknowledged events (admin's, agents' and graders')."""
    rewarded: set[str] = field(default_factory=set)
    claimed: set[str] = field(default_factory=set)
    attempts: dict[tuple[str, str], str] = field(default_factory=dict)
    """(rollout id, attempt id) -> its acknowledged status ("running" once started)."""
    finished: dict[str, str] = field(default_factory=dict)
    calls: dict[str, set[str]] = field(default_factory=dict)
    """rollout id -> the tags of its LLM calls whose whole response reached the client."""

    def count(self) -> int:
        return (
            len(self.rollouts)
            + sum(len(v) for v in self.events.values())
            + len(self.claimed)
            + len(self.attempts)
            + len(self.finished)
            + sum(len(v) for v in self.calls.values())
        )


@dataclass
class Trial:
    server: GatewayProcess
    session: aiohttp.ClientSession
    ledger: Ledger
    admin_key: str
    kill_after: int
    acks: int = 0
    killed: bool = False
    in_flight: int = 0
    in_flight_at_kill: int = 0

    async def call(self, method: str, path: str, body: Any = None, key: str | None = None) -> Any:
        """One write; a 2xx counts as acknowledged (and may trigger the kill). A failure before the kill fails."""
        raw = await self._send(method, path, body, key)
        return orjson.loads(raw)

    async def llm(self, path: str, body: dict[str, Any], key: str) -> None:
        """An agent's LLM call, acknowledged once its whole response arrived (a stream: up to `[DONE]`)."""
        raw = await self._send("POST", path, body, key)
        whole = raw.rstrip().endswith(b"data: [DONE]") if body.get("stream") else b'"choices"' in raw
        assert whole, f"POST {path}: an incomplete response before the kill: {raw[-300:]!r}"

    async def _send(self, method: str, path: str, body: Any, key: str | None) -> bytes:
        if self.killed:
            raise Killed
        headers = {"Authorization": f"Bearer {key or self.admin_key}"}
        self.in_flight += 1
        try:
            async with self.session.request(method, self.server.url + path, json=body, headers=headers) as r:
                payload = await r.read()
        except (aiohttp.ClientError, OSError) as exc:
            if self.killed:
                raise Killed from exc
            raise AssertionError(
                f"{method} {path} failed before the kill: {exc!r}\n{self.server.log_tail()}"
            ) from exc
        finally:
            self.in_flight -= 1
        if self.killed:  # answered, but the kill is out: what the client logs now no longer counts
            raise Killed
        assert 200 <= r.status < 300, f"{method} {path}: {r.status} {payload[:300]!r}"
        return payload

    def acked(self) -> None:
        self.acks += 1
        if self.acks == self.kill_after and not self.killed:
            self.killed = True
            self.in_flight_at_kill = self.in_flight
            self.server.kill()  # SIGKILL while the other workers' writes are in flight


async def worker(trial: Trial, rng: random.Random, name: str) -> None:
    ledger, n = trial.ledger, 0
    try:
        while True:
            specs: list[dict[str, Any]] = []
            for _ in range(rng.randint(1, 3)):
                n += 1
                rid = f"{name}-{n}"
                trusted = rng.random() < 0.5
                specs.append(
                    {
                        "rollout_id": rid,
                        "input": {"task": rid},
                        "metadata": {"answer": rid},
                        "config": {"max_attempts": 2, "trust_agent_rewards": trusted},
                    }
                )
            await trial.call("POST", "/api/rollouts", {"rollouts": specs})
            ledger.rollouts.update(s["rollout_id"] for s in specs)
            trial.acked()
            got = await trial.call(
                "POST", "/api/runner/claim", {"runner_id": RUNNER_ID, "limit": rng.randint(1, 3)}
            )
            claimed = [(r["id"], r["config"]["trust_agent_rewards"]) for r in got["rollouts"]]
            ledger.claimed.update(rid for rid, _ in claimed)
            if claimed:
                trial.acked()
            for rid, trusted in claimed:
                await drive(trial, rng, rid, trusted, f"{name}-{n}")
    except Killed:
        return


async def drive(trial: Trial, rng: random.Random, rid: str, trusted: bool, tag: str) -> None:
    """A claimed rollout's life, cut short at random: attempts with their agents' traffic, then a verdict."""
    ledger = trial.ledger
    aid = None
    for _ in range(rng.randint(0, 2)):
        got = await trial.call("POST", f"/api/rollouts/{rid}/attempts", {})
        aid = got["attempt"]["id"]
        ledger.attempts[(rid, aid)] = "running"
        trial.acked()
        await agent_traffic(trial, rng, rid, aid, trusted, tag, got["env"]["OPENAI_API_KEY"])
        if rng.random() < 0.7:
            status = rng.choice(["succeeded", "failed", "timeout"])
            await trial.call(
                "PATCH", f"/api/rollouts/{rid}/attempts/{aid}", {"status": status, "exit_code": 0}
            )
            ledger.attempts[(rid, aid)] = status
            trial.acked()
        else:
            break  # an attempt left running: the verdict turns it `lost`, or a kill leaves it to the runner
    roll = rng.random()
    if roll < 0.7:
        status = rng.choice(["succeeded", "failed"])
        await trial.call("POST", f"/api/rollouts/{rid}/finish", {"status": status})
    elif roll < 0.8:
        status = "cancelled"
        await trial.call("POST", f"/api/rollouts/{rid}/cancel", {"message": "crash test"})
    else:
        return  # left running
    ledger.finished[rid] = status
    if aid is not None and ledger.attempts[(rid, aid)] == "running":
        ledger.attempts[(rid, aid)] = "lost" if status != "cancelled" else "cancelled"
    trial.acked()


async def agent_traffic(
    trial: Trial, rng: random.Random, rid: str, aid: str, trusted: bool, tag: str, agent_key: str
) -> None:
    """What an attempt's agent, its grader and the trainer send while it runs, in a random order."""
    ledger = trial.ledger
    base = f"/r/{rid}/a/{aid}"
    steps = ["admin"] * rng.randint(0, 3) + ["agent"] * rng.randint(0, 2) + ["llm"] * rng.randint(0, 3)
    steps += ["grader"] if rng.random() < 0.3 else []
    steps += ["agent_reward"] if trusted and rng.random() < 0.3 else []
    rng.shuffle(steps)
    for i, step in enumerate(steps):
        if step == "admin":
            events: list[dict[str, Any]] = [
                {
                    "kind": "step",
                    "data": {"tag": tag, "rollout": rid, "i": i, "j": j, "pad": "x" * rng.randint(0, 900)},
                }
                for j in range(rng.randint(1, 5))
            ]
            if rng.random() < 0.3:
                events.append({"kind": "reward", "data": {"value": rng.random()}, "attempt_id": aid})
            await trial.call("POST", f"/api/rollouts/{rid}/events", {"events": events})
            ledger.events.setdefault(rid, []).extend(e["data"] for e in events)
            if any(e["kind"] == "reward" for e in events):
                ledger.rewarded.add(rid)
        elif step == "agent":
            data = {"tag": tag, "agent": aid, "i": i}
            await trial.call("POST", f"{base}/events", {"kind": "note", "data": data}, key=agent_key)
            ledger.events.setdefault(rid, []).append(data)
        elif step in ("agent_reward", "grader"):
            data = {"by": step, "i": i}
            key = agent_key if step == "agent_reward" else derive_key(trial.admin_key, rid, KeyRole.GRADER)
            path = f"{base}/events" if step == "agent_reward" else f"{base}/grade"
            await trial.call("POST", path, {"kind": "reward", "value": rng.random(), "data": data}, key=key)
            ledger.events.setdefault(rid, []).append({**data, "value": None})
            ledger.rewarded.add(rid)
        else:
            call_tag = f"{tag} {rid} {aid} {i}"
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": call_tag}],
                "max_tokens": rng.randint(2, 24),
                "stream": rng.random() < 0.5,
            }
            await trial.llm(f"{base}/v1/chat/completions", body, agent_key)
            ledger.calls.setdefault(rid, set()).add(call_tag)
        trial.acked()


# --- what must hold after a restart ------------------------------------------------------------------------------


async def get(session: aiohttp.ClientSession, url: str, admin_key: str) -> Any:
    async with session.get(url, headers={"Authorization": f"Bearer {admin_key}"}) as resp:
        body = await resp.read()
        assert resp.status == 200, f"GET {url}: {resp.status} {body[:300]!r}"
        return orjson.loads(body)


@dataclass
class State:
    rollout: dict[str, Any]
    events: list[dict[str, Any]]
    calls: list[dict[str, Any]]


async def snapshot(session: aiohttp.ClientSession, url: str, admin_key: str) -> dict[str, State]:
    """Every rollout (with its attempts), its events and its captured calls, as the server reports them."""
    ids: list[str] = []
    after = 0
    while True:
        page = await get(session, f"{url}/api/rollouts?limit=1000&after={after}", admin_key)
        ids += [r["id"] for r in page["rollouts"]]
        if page["next"] is None:
            break
        after = page["next"]

    async def one(rid: str) -> State:
        rollout = await get(session, f"{url}/api/rollouts/{rid}", admin_key)
        events = (await get(session, f"{url}/api/rollouts/{rid}/events?limit=10000", admin_key))["events"]
        calls = (await get(session, f"{url}/api/rollouts/{rid}/calls?limit=1000", admin_key))["calls"]
        return State(rollout, events, calls)

    states = await asyncio.gather(*(one(rid) for rid in ids))
    return dict(zip(ids, states, strict=True))


def event_datas(events: list[dict[str, Any]]) -> list[Any]:
    """Event data as the ledger logs it: a reward posted on an agent's or grader's route is stored as
    `{"value": v, "data": {...}}`; the ledger knows it by its own data."""
    out = []
    for e in events:
        data = e["data"]
        if e["kind"] == "reward" and isinstance(data, dict) and isinstance(data.get("data"), dict):
            data = {**data["data"], "value": None}
        out.append(data)
    return out


def call_tag(call: dict[str, Any]) -> str:
    messages = (call.get("request") or {}).get("messages") or [{}]
    return str(messages[-1].get("content"))


def impossible_states(rid: str, s: State) -> list[str]:
    """What no sequence of legal transitions can produce."""
    bad = []
    r, events = s.rollout, s.events
    status, attempts = r["status"], r["attempts"]
    if status == "queuing":
        if attempts or r["attempt_count"] or r["started_at"] or r["runner_id"]:
            bad.append("queuing but claimed or attempted")
    elif status == "running":
        if r["started_at"] is None or r["runner_id"] is None:
            bad.append("running but never claimed")
    elif status not in TERMINAL:
        bad.append(f"unknown status {status!r}")
    if (status in TERMINAL) != (r["completion_seq"] is not None) or (status in TERMINAL) != bool(
        r["ended_at"]
    ):
        bad.append(f"{status} with completion_seq {r['completion_seq']} and ended_at {r['ended_at']}")
    if status in TERMINAL and any(a["status"] == "running" for a in attempts):
        bad.append(f"{status} with a running attempt")
    if [a["seq"] for a in attempts] != list(range(1, len(attempts) + 1)) or len(attempts) != r[
        "attempt_count"
    ]:
        bad.append(f"attempts {[a['seq'] for a in attempts]} vs attempt_count {r['attempt_count']}")
    if sum(a["status"] != "lost" for a in attempts) > r["config"]["max_attempts"]:
        bad.append("more attempts than max_attempts (lost ones do not count)")
    if any(a["status"] != "running" and a["ended_at"] is None for a in attempts):
        bad.append("an ended attempt without ended_at")
    if [e["seq"] for e in events] != list(range(1, len(events) + 1)):
        bad.append("event sequence has gaps")
    rewards = [e["data"]["value"] for e in events if e["kind"] == "reward"]
    if r["reward"] != (rewards[-1] if rewards else None):
        bad.append(f"reward {r['reward']} but reward events {rewards}")
    attempt_ids = {a["id"] for a in attempts}
    if any(c["attempt_id"] not in attempt_ids for c in s.calls):
        bad.append("a captured call of an attempt the rollout does not have")
    if sum(e["kind"] == "llm_call" for e in events) != len(s.calls):
        bad.append(
            f"{len(s.calls)} captured calls but {sum(e['kind'] == 'llm_call' for e in events)} llm_call events"
        )
    return [f"{rid}: {b}" for b in bad]


def lost_writes(ledger: Ledger, state: dict[str, State]) -> list[str]:
    missing: list[str] = [f"rollout {rid}" for rid in sorted(ledger.rollouts - state.keys())]
    for rid, datas in ledger.events.items():
        present = event_datas(state[rid].events) if rid in state else []
        missing += [f"event {d} of {rid}" for d in datas if d not in present][:5]
    missing += [
        f"reward of {rid}" for rid in ledger.rewarded if rid in state and state[rid].rollout["reward"] is None
    ]
    for rid in ledger.claimed:
        r = state[rid].rollout if rid in state else None
        if r is None or r["status"] == "queuing" or r["runner_id"] != RUNNER_ID:
            missing.append(f"claim of {rid}: {r and (r['status'], r['runner_id'])}")
    for (rid, aid), status in ledger.attempts.items():
        attempts = {a["id"]: a["status"] for a in state[rid].rollout["attempts"]} if rid in state else {}
        if aid not in attempts:
            missing.append(f"attempt {aid} of {rid}")
        elif status != "running" and attempts[aid] != status:
            missing.append(f"attempt {aid} of {rid}: {attempts[aid]}, acknowledged {status}")
    for rid, status in ledger.finished.items():
        got = state[rid].rollout["status"] if rid in state else None
        if got != status:
            missing.append(f"verdict of {rid}: {got}, acknowledged {status}")
    for rid, tags in ledger.calls.items():
        stored = {call_tag(c) for c in state[rid].calls if c["outcome"] == "ok"} if rid in state else set()
        missing += [f"LLM call {t!r}" for t in sorted(tags - stored)][:5]
    return missing


@dataclass
class CheckResult:
    rollouts: int
    missing: list[str]
    bad: list[str]
    seconds: float


async def check(session: aiohttp.ClientSession, url: str, admin_key: str, ledger: Ledger) -> CheckResult:
    t0 = time.monotonic()
    state = await snapshot(session, url, admin_key)
    bad = [msg for rid, s in state.items() for msg in impossible_states(rid, s)]
    seqs = [s.rollout["completion_seq"] for s in state.values() if s.rollout["completion_seq"] is not None]
    if len(seqs) != len(set(seqs)):
        bad.append("two rollouts share a completion_seq")
    completed = await get(session, f"{url}/api/rollouts/completed?after=0&limit=1000", admin_key)
    terminal = sorted(rid for rid, s in state.items() if s.rollout["status"] in TERMINAL)
    if sorted(r["id"] for r in completed["rollouts"]) != terminal:
        bad.append("the completion cursor does not list exactly the terminal rollouts")
    return CheckResult(len(state), lost_writes(ledger, state), bad, time.monotonic() - t0)


# --- trials --------------------------------------------------------------------------------------------------------


@dataclass
class TrialFigures:
    index: int
    kill_after: int
    writes_in_flight_at_kill: int
    restart_s: float
    """From the new process's start to its `gateway listening` line (schema check and WAL recovery included)."""
    check: CheckResult


async def run_trials(
    directory: Path,
    mock_url: str,
    *,
    admin_key: str,
    seed: int,
    trials: int,
    ledger: Ledger,
    started: list[GatewayProcess],
    on_trial: Callable[[TrialFigures], None] | None = None,
    dsn: str = "",
) -> list[TrialFigures]:
    """`trials` kills and restarts; returns each restart's figures (their checks hold what was lost: nothing)."""
    config = write_crash_config(directory, mock_url, dsn=dsn)
    env = {"AGL_KEY": admin_key}
    rng = random.Random(seed)
    figures: list[TrialFigures] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        server = await start_gateway(config, env=env)
        started.append(server)
        for t in range(trials):
            trial = Trial(server, session, ledger, admin_key, kill_after=rng.randint(*ACKS))
            before = ledger.count()
            workers = [worker(trial, random.Random(rng.getrandbits(32)), f"t{t}w{w}") for w in range(WORKERS)]
            await asyncio.gather(*workers)
            await server.wait()
            assert trial.killed, (
                f"seed {seed}: the workers stopped before {trial.kill_after} acknowledgements"
            )
            assert ledger.count() > before
            t0 = time.monotonic()
            server = await start_gateway(config, env=env)
            started.append(server)
            restart_s = time.monotonic() - t0
            result = await check(session, server.url, admin_key, ledger)
            figures.append(TrialFigures(t, trial.kill_after, trial.in_flight_at_kill, restart_s, result))
            if on_trial is not None:
                on_trial(figures[-1])
            if result.missing or result.bad:
                break  # the caller reports it; more trials would only bury it
        server.kill()
        await server.wait()
    return figures


@dataclass
class Recovery:
    taken_back: int
    """Rollouts the kills left running, which the restarted runner had to take back."""
    queued: int
    seconds: float
    """From the gateway with the runner starting to every rollout being terminal."""
    problems: list[str]


async def recover(
    directory: Path, mock_url: str, *, admin_key: str, started: list[GatewayProcess], timeout: float = 120.0
) -> Recovery:
    """Restart with the local runner on the same store; every rollout the kills left running or queued must end,
    each running attempt of the taken-back ones `lost`, a fresh attempt wherever the cap allows."""
    env = {"AGL_KEY": admin_key}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=90)) as session:
        plain = await start_gateway(write_crash_config(directory, mock_url), env=env)
        started.append(plain)
        before = await snapshot(session, plain.url, admin_key)
        plain.kill()
        await plain.wait()
        t0 = time.monotonic()
        gw = await start_gateway(write_crash_config(directory, mock_url, runner=True), env=env)
        started.append(gw)
        await until_all_terminal(session, gw.url, admin_key, timeout)
        seconds = time.monotonic() - t0
        after = await snapshot(session, gw.url, admin_key)
        await gw.stop()
    problems = [msg for rid, s in after.items() for msg in impossible_states(rid, s)]
    running = {rid: s for rid, s in before.items() if s.rollout["status"] == "running"}
    for rid, s in running.items():
        problems += taken_back_problems(rid, s, after[rid])
    for rid, s in before.items():
        if s.rollout["status"] == "queuing" and after[rid].rollout["status"] != "succeeded":
            problems.append(f"{rid}: queued, then {after[rid].rollout['status']}")
    queued = sum(s.rollout["status"] == "queuing" for s in before.values())
    return Recovery(len(running), queued, seconds, problems)


def taken_back_problems(rid: str, before: State, after: State) -> list[str]:
    problems = []
    was = {a["id"]: a for a in before.rollout["attempts"]}
    now = {a["id"]: a for a in after.rollout["attempts"]}
    for aid, a in was.items():
        if a["status"] == "running" and now[aid]["status"] != "lost":
            problems.append(
                f"{rid}: attempt {aid} left running by the kill is {now[aid]['status']}, not lost"
            )
    fresh = [a for aid, a in now.items() if aid not in was]
    # A lost attempt (the kill took it) does not use one up: the room is what the others left.
    used = sum(now[aid]["status"] != "lost" for aid in was)
    room = before.rollout["config"]["max_attempts"] - used
    status = after.rollout["status"]
    if room > 0:
        calls = {c["attempt_id"] for c in after.calls if c["outcome"] == "ok"}
        if (
            status != "succeeded"
            or [a["status"] for a in fresh] != ["succeeded"]
            or fresh[0]["id"] not in calls
        ):
            problems.append(
                f"{rid}: taken back with {room} attempt(s) left: {status}, fresh attempts {fresh}"
            )
    elif status != "failed" or fresh:
        problems.append(f"{rid}: taken back with no attempt left: {status}, fresh attempts {fresh}")
    return problems


async def until_all_terminal(
    session: aiohttp.ClientSession, url: str, admin_key: str, timeout: float
) -> None:
    """Long-polls the completion cursor (no sleeps) until no rollout is queued or running."""
    cursor = 0
    async with asyncio.timeout(timeout):
        while True:
            pending = 0
            for status in ("queuing", "running"):
                page = await get(session, f"{url}/api/rollouts?status={status}&limit=1", admin_key)
                pending += len(page["rollouts"])
            if not pending:
                return
            got = await get(
                session, f"{url}/api/rollouts/completed?after={cursor}&wait=5&limit=1000", admin_key
            )
            cursor = got["cursor"]
