"""Acceptance of the store (DESIGN.md §4): no acknowledged write is lost when the gateway process dies.

A client drives the HTTP API with a mixed load (enqueue, claim, start attempt, events, attempt outcome, finish)
from several concurrent workers and logs every 2xx it gets. The server (`python -m agl_lite run` with the SQLite
store) is SIGKILLed after a seeded random number of acknowledged writes, while other writes are in flight, and
restarted on the same file. Afterwards every logged write is there (rollouts by id, events by their data,
transitions by status) and no rollout is in an impossible state. The trials accumulate on one file, so each
restart also reopens what earlier kills left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from agl_lite.testing.gateway import write_config
from tests.conftest import ADMIN_KEY

pytestmark = pytest.mark.slow

SEED = 20261130
TRIALS = 3
WORKERS = 6
ACKS = (60, 300)
"""Range of the number of acknowledged writes (this trial's) after which the server is killed."""
READY_TIMEOUT_S = 20.0
TERMINAL = {"succeeded", "failed", "cancelled"}
AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}


# --- the server process ----------------------------------------------------------------------------------------


@dataclass
class Server:
    proc: asyncio.subprocess.Process
    url: str
    stderr: list[str]
    drain: asyncio.Task[None] | None = None

    def log_tail(self, n: int = 20) -> str:
        return "\n".join(self.stderr[-n:])


async def _drain(stream: asyncio.StreamReader, lines: list[str]) -> None:
    while line := await stream.readline():
        lines.append(line.decode(errors="replace").rstrip())


async def start_server(config: Path, started: list[Server]) -> Server:
    """Start the gateway and wait (bounded) until its stderr says it listens; returns its URL."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agl_lite",
        "run",
        "--config",
        str(config),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "AGL_KEY": ADMIN_KEY},
        start_new_session=True,
    )
    assert proc.stderr is not None
    server = Server(proc, "", [])
    started.append(server)
    try:
        async with asyncio.timeout(READY_TIMEOUT_S):
            while line := await proc.stderr.readline():
                text = line.decode(errors="replace").rstrip()
                server.stderr.append(text)
                if "gateway listening" in text:
                    server.url = orjson.loads(text)["url"]
                    break
    except TimeoutError:
        pytest.fail(f"the gateway did not listen within {READY_TIMEOUT_S:g} s:\n{server.log_tail()}")
    if not server.url:
        await proc.wait()
        pytest.fail(f"the gateway exited ({proc.returncode}) before listening:\n{server.log_tail()}")
    server.drain = asyncio.create_task(_drain(proc.stderr, server.stderr))
    return server


async def kill(server: Server) -> None:
    if server.proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            server.proc.kill()  # SIGKILL
        await server.proc.wait()
    if server.drain is not None:
        await server.drain


@pytest.fixture
async def servers() -> AsyncIterator[list[Server]]:
    """Every server the test started; any still running is killed at the end, whatever happened."""
    started: list[Server] = []
    yield started
    for server in started:
        await kill(server)


# --- the client and its log of acknowledged writes ---------------------------------------------------------------


class Killed(Exception):
    """The server is gone: this worker stops."""


@dataclass
class Ledger:
    """What the server acknowledged (a 2xx came back), across all trials."""

    rollouts: set[str] = field(default_factory=set)
    events: dict[str, list[Any]] = field(default_factory=dict)
    rewarded: set[str] = field(default_factory=set)
    claimed: dict[str, str] = field(default_factory=dict)
    """rollout id -> the runner that claimed it."""
    attempts: dict[tuple[str, str], str] = field(default_factory=dict)
    """(rollout id, attempt id) -> its acknowledged status ("running" once started)."""
    finished: dict[str, str] = field(default_factory=dict)

    def count(self) -> int:
        return (
            len(self.rollouts)
            + sum(len(v) for v in self.events.values())
            + len(self.claimed)
            + len(self.attempts)
            + len(self.finished)
        )


@dataclass
class Trial:
    server: Server
    session: aiohttp.ClientSession
    ledger: Ledger
    kill_after: int
    acks: int = 0
    killed: bool = False
    extra_writes: list[str] = field(default_factory=list)

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        """One write; a 2xx counts as acknowledged (and may trigger the kill). A failure before the kill fails."""
        if self.killed:
            raise Killed
        try:
            async with self.session.request(method, self.server.url + path, json=body, headers=AUTH) as resp:
                payload = await resp.read()
        except (aiohttp.ClientError, OSError) as exc:
            if self.killed:
                raise Killed from exc
            raise AssertionError(
                f"{method} {path} failed before the kill: {exc!r}\n{self.server.log_tail()}"
            ) from exc
        assert 200 <= resp.status < 300, f"{method} {path}: {resp.status} {payload[:300]!r}"
        return orjson.loads(payload)

    def acked(self) -> None:
        self.acks += 1
        if self.acks == self.kill_after and not self.killed:
            self.killed = True
            self.server.proc.kill()  # SIGKILL while the other workers' writes are in flight


async def worker(trial: Trial, rng: random.Random, name: str) -> None:
    ledger, n = trial.ledger, 0
    try:
        while True:
            ids = []
            for _ in range(rng.randint(1, 3)):
                n += 1
                ids.append(f"{name}-{n}")
            await trial.call(
                "POST",
                "/api/rollouts",
                {
                    "rollouts": [
                        {"rollout_id": rid, "input": {"task": rid}, "config": {"max_attempts": 2}}
                        for rid in ids
                    ]
                },
            )
            ledger.rollouts.update(ids)
            trial.acked()
            got = await trial.call(
                "POST", "/api/runner/claim", {"runner_id": name, "limit": rng.randint(1, 3)}
            )
            claimed = [r["id"] for r in got["rollouts"]]
            for rid in claimed:
                ledger.claimed[rid] = name
            if claimed:
                trial.acked()
            for rid in claimed:
                await drive(trial, rng, rid, f"{name}-{n}")
    except Killed:
        return


async def drive(trial: Trial, rng: random.Random, rid: str, tag: str) -> None:
    """A claimed rollout's life, cut short at random: attempts, events, an attempt outcome, a verdict."""
    ledger = trial.ledger
    aid = None
    for _ in range(rng.randint(0, 2)):
        got = await trial.call("POST", f"/api/rollouts/{rid}/attempts", {})
        aid = got["attempt"]["id"]
        ledger.attempts[(rid, aid)] = "running"
        trial.acked()
        for b in range(rng.randint(0, 3)):
            events: list[dict[str, Any]] = [
                {
                    "kind": "step",
                    "data": {"tag": tag, "rollout": rid, "b": b, "i": i, "pad": "x" * rng.randint(0, 900)},
                }
                for i in range(rng.randint(1, 5))
            ]
            if rng.random() < 0.3:
                events.append({"kind": "reward", "data": {"value": rng.random()}, "attempt_id": aid})
            await trial.call("POST", f"/api/rollouts/{rid}/events", {"events": events})
            ledger.events.setdefault(rid, []).extend(e["data"] for e in events)
            if any(e["kind"] == "reward" for e in events):
                ledger.rewarded.add(rid)
            trial.acked()
        if rng.random() < 0.7:
            status = rng.choice(["succeeded", "failed", "timeout"])
            await trial.call(
                "PATCH", f"/api/rollouts/{rid}/attempts/{aid}", {"status": status, "exit_code": 0}
            )
            ledger.attempts[(rid, aid)] = status
            trial.acked()
        else:
            break  # an attempt left running: finish turns it `lost`
    if rng.random() < 0.8:
        status = rng.choice(["succeeded", "failed"])
        await trial.call("POST", f"/api/rollouts/{rid}/finish", {"status": status})
        ledger.finished[rid] = status
        if aid is not None and ledger.attempts[(rid, aid)] == "running":
            ledger.attempts[(rid, aid)] = "lost"
        trial.acked()


# --- what must hold after a restart ------------------------------------------------------------------------------


async def get(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url, headers=AUTH) as resp:
        body = await resp.read()
        assert resp.status == 200, f"GET {url}: {resp.status} {body[:300]!r}"
        return orjson.loads(body)


async def snapshot(
    session: aiohttp.ClientSession, url: str
) -> dict[str, tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Every rollout (with its attempts) and its events, as the restarted server reports them."""
    ids: list[str] = []
    after = 0
    while True:
        page = await get(session, f"{url}/api/rollouts?limit=1000&after={after}")
        ids += [r["id"] for r in page["rollouts"]]
        if page["next"] is None:
            break
        after = page["next"]
    out = {}
    for rid in ids:
        rollout = await get(session, f"{url}/api/rollouts/{rid}")
        events = (await get(session, f"{url}/api/rollouts/{rid}/events?limit=10000"))["events"]
        out[rid] = (rollout, events)
    return out


def impossible_states(rid: str, r: dict[str, Any], events: list[dict[str, Any]]) -> list[str]:
    """What no sequence of legal transitions can produce."""
    bad = []
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
    if len(attempts) > r["config"]["max_attempts"]:
        bad.append("more attempts than max_attempts")
    if any(a["status"] != "running" and a["ended_at"] is None for a in attempts):
        bad.append("an ended attempt without ended_at")
    if [e["seq"] for e in events] != list(range(1, len(events) + 1)):
        bad.append("event sequence has gaps")
    rewards = [e["data"]["value"] for e in events if e["kind"] == "reward"]
    if r["reward"] != (rewards[-1] if rewards else None):
        bad.append(f"reward {r['reward']} but reward events {rewards}")
    return [f"{rid}: {b}" for b in bad]


async def check(session: aiohttp.ClientSession, url: str, ledger: Ledger, seed: int) -> None:
    state = await snapshot(session, url)
    missing: list[str] = []
    missing += [f"rollout {rid}" for rid in sorted(ledger.rollouts - state.keys())]
    for rid, datas in ledger.events.items():
        present = [e["data"] for e in state.get(rid, ({}, []))[1]]
        missing += [f"event {d} of {rid}" for d in datas if d not in present][:5]
    for rid in ledger.rewarded:
        if rid in state and state[rid][0]["reward"] is None:
            missing.append(f"reward of {rid}")
    for rid, runner in ledger.claimed.items():
        r = state[rid][0] if rid in state else None
        if r is None or r["status"] == "queuing" or r["runner_id"] != runner:
            missing.append(f"claim of {rid} by {runner}: {r and (r['status'], r['runner_id'])}")
    for (rid, aid), status in ledger.attempts.items():
        attempts = {a["id"]: a["status"] for a in state[rid][0]["attempts"]} if rid in state else {}
        if aid not in attempts:
            missing.append(f"attempt {aid} of {rid}")
        elif status != "running" and attempts[aid] != status:
            missing.append(f"attempt {aid} of {rid}: {attempts[aid]}, acknowledged {status}")
    for rid, status in ledger.finished.items():
        got = state[rid][0]["status"] if rid in state else None
        if got != status:
            missing.append(f"finish of {rid}: {got}, acknowledged {status}")
    bad = [msg for rid, (r, events) in state.items() for msg in impossible_states(rid, r, events)]
    seqs = [r["completion_seq"] for r, _ in state.values() if r["completion_seq"] is not None]
    if len(seqs) != len(set(seqs)):
        bad.append("two rollouts share a completion_seq")
    completed = await get(session, f"{url}/api/rollouts/completed?after=0&limit=1000")
    if sorted(r["id"] for r in completed["rollouts"]) != sorted(
        rid for rid, (r, _) in state.items() if r["status"] in TERMINAL
    ):
        bad.append("the completion cursor does not list exactly the terminal rollouts")
    assert not missing, f"seed {seed}: acknowledged writes lost after SIGKILL: {missing[:20]}"
    assert not bad, f"seed {seed}: impossible states after SIGKILL: {bad[:20]}"


# --- the test ----------------------------------------------------------------------------------------------------


async def test_sigkilled_gateway_loses_no_acknowledged_write(tmp_path: Path, servers: list[Server]) -> None:
    config = tmp_path / "agl-lite.toml"
    write_config(
        tmp_path,
        {},
        chain=("store", "auth", "store_api"),
        addons={"store": {"backend": "sqlite", "path": "store.db"}},
        extra={"log": {"format": "json"}},
    )
    ledger = Ledger()
    rng = random.Random(SEED)
    async with aiohttp.ClientSession() as session:
        for t in range(TRIALS):
            server = await start_server(config, servers)
            await check(session, server.url, ledger, SEED)  # what the previous kills left is all there
            trial = Trial(server, session, ledger, kill_after=rng.randint(*ACKS))
            before = ledger.count()
            workers = [worker(trial, random.Random(rng.getrandbits(32)), f"t{t}w{w}") for w in range(WORKERS)]
            await asyncio.gather(*workers)
            await kill(server)
            assert trial.killed, f"the workers stopped before {trial.kill_after} acknowledgements"
            assert ledger.count() > before
        server = await start_server(config, servers)
        await check(session, server.url, ledger, SEED)
        await kill(server)
    assert (tmp_path / "store.db").exists()
