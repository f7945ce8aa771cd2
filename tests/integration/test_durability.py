"""Acceptance of the store (DESIGN.md §4, issue #9 point 2): no acknowledged write is lost when the gateway process
dies, no rollout is left in an impossible state, and the runner takes back what the kills left running.

Concurrent workers drive the gateway (`python -m agl_lite run`, SQLite store, capture chain, the mock vLLM) with
mixed ingest — enqueue, claim, attempts, admin events and rewards, agents' events and LLM calls with their agent
keys, graders' rewards, attempt outcomes, verdicts, cancels — and log every 2xx (an LLM call: its whole response).
The server is SIGKILLed after a seeded random number of acknowledged writes, with others in flight, and restarted
on the same file; everything logged must be there. The engine: bench/harness/crash_load.py. This is the CI
variant (3 trials); `bench/crash.py` runs 20 and prints the figures. Set AGL_SEED to replay a run.
"""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path

import aiohttp
import pytest

from agl_lite.testing import MockVLLM, running_mock
from agl_lite.testing.gateway import write_config
from bench.harness.crash_load import Ledger, recover, run_trials
from bench.harness.gateway_process import gateway_processes, start_gateway
from tests.conftest import ADMIN_KEY

pytestmark = pytest.mark.slow

TRIALS = 3


@pytest.fixture
def seed() -> int:
    value = int(os.environ.get("AGL_SEED") or random.SystemRandom().randrange(2**32))
    print(f"AGL_SEED={value}")
    return value


async def test_sigkilled_gateway_loses_no_acknowledged_write_and_the_runner_recovers(
    tmp_path: Path, seed: int
) -> None:
    ledger = Ledger()
    async with running_mock(MockVLLM(("smollm2",))) as mock_url, gateway_processes() as started:
        figures = await run_trials(
            tmp_path, mock_url, admin_key=ADMIN_KEY, seed=seed, trials=TRIALS, ledger=ledger, started=started
        )
        for f in figures:
            assert not f.check.missing, (
                f"seed {seed}, trial {f.index}: acknowledged writes lost: {f.check.missing[:20]}"
            )
            assert not f.check.bad, f"seed {seed}, trial {f.index}: impossible states: {f.check.bad[:20]}"
        assert len(figures) == TRIALS
        # every kind of write was acknowledged at least once
        assert ledger.calls
        assert ledger.claimed
        assert ledger.finished
        recovery = await recover(tmp_path, mock_url, admin_key=ADMIN_KEY, started=started)
    assert recovery.problems == [], f"seed {seed}: {recovery.problems[:20]}"
    assert recovery.taken_back > 0, f"seed {seed}: no kill left a rollout running: nothing was recovered"
    assert (tmp_path / "store.db").exists()


PG_TRIALS = 20


async def test_a_sigkilled_replica_on_postgresql_loses_no_acknowledged_write(
    tmp_path: Path, seed: int, postgres_db: str
) -> None:
    """The same ingest and kills, the store on PostgreSQL (#21: 20 trials, every acknowledgement counted by the
    client). A gateway on PostgreSQL keeps nothing of its own: what it acknowledged, the server committed."""
    ledger = Ledger()
    async with running_mock(MockVLLM(("smollm2",))) as mock_url, gateway_processes() as started:
        figures = await run_trials(
            tmp_path,
            mock_url,
            admin_key=ADMIN_KEY,
            seed=seed,
            trials=PG_TRIALS,
            ledger=ledger,
            started=started,
            dsn=postgres_db,
        )
    for f in figures:
        assert not f.check.missing, (
            f"seed {seed}, trial {f.index}: acknowledged writes lost: {f.check.missing[:20]}"
        )
        assert not f.check.bad, f"seed {seed}, trial {f.index}: impossible states: {f.check.bad[:20]}"
    assert len(figures) == PG_TRIALS
    assert ledger.calls
    assert ledger.claimed
    assert ledger.finished
    assert not (tmp_path / "store.db").exists()  # (nothing went to SQLite)


REPLICA_TRIALS = 20


async def test_killing_one_of_two_replicas_under_ingest_loses_nothing_either_acknowledged(
    tmp_path: Path, seed: int, postgres_db: str
) -> None:
    """Two gateways on one PostgreSQL database take events for the same rollouts (each rollout's events queue for
    its lock across them). In each of 20 trials one of them is SIGKILLed at a random moment, perhaps holding that
    lock, and started again. Every event either acknowledged, counted by the client, is in the store once."""
    rng = random.Random(seed)
    config = write_config(
        tmp_path, {}, chain=("store", "auth", "store_api"), addons={"store": {"dsn": postgres_db}},
        extra={"log": {"format": "json"}},
    )  # fmt: skip
    env = {"AGL_KEY": ADMIN_KEY}
    acked: dict[str, set[str]] = {f"r{i}": set() for i in range(8)}
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    async with gateway_processes() as started, aiohttp.ClientSession(headers=headers) as http:
        replicas = [await start_gateway(Path(config.source), env=env) for _ in range(2)]
        started += replicas
        async with http.post(
            f"{replicas[0].url}/api/rollouts",
            json={"rollouts": [{"rollout_id": r, "input": {}} for r in acked]},
        ) as resp:
            assert resp.status == 201
        async with http.post(
            f"{replicas[1].url}/api/runner/claim", json={"runner_id": "t", "limit": 8}
        ) as resp:
            assert len((await resp.json())["rollouts"]) == 8
        for trial in range(REPLICA_TRIALS):
            victim = rng.randrange(2)
            kill_after = rng.randint(20, 120)
            count = 0

            async def worker(
                w: int, trial: int = trial, victim: int = victim, kill_after: int = kill_after
            ) -> None:
                nonlocal count
                for k in range(10_000):  # bounded: the kill ends it long before
                    replica = replicas[(w + k) % 2]
                    rollout, token = f"r{rng.randrange(8)}", f"t{trial}-w{w}-{k}"
                    try:
                        async with http.post(
                            f"{replica.url}/api/rollouts/{rollout}/events",
                            json={"events": [{"kind": "note", "data": token}]},
                        ) as resp:
                            if not 200 <= resp.status < 300:
                                continue
                            await resp.read()
                    except (aiohttp.ClientError, TimeoutError):
                        if replica is replicas[victim] and replica.proc.returncode is not None:
                            return  # the victim is gone: this worker's trial is over
                        continue
                    acked[rollout].add(token)
                    count += 1
                    if count == kill_after:
                        replicas[victim].kill()

            await asyncio.wait_for(asyncio.gather(*(worker(w) for w in range(8))), 120)
            assert count >= kill_after, f"seed {seed}, trial {trial}: the kill never came"
            await replicas[victim].wait()
            replicas[victim] = await start_gateway(Path(config.source), env=env)
            started.append(replicas[victim])
        for rollout, tokens in acked.items():
            stored: list[str] = []
            after = 0
            while True:  # every page (bounded: the events acknowledged, and any stored unacknowledged)
                url = f"{replicas[0].url}/api/rollouts/{rollout}/events?limit=10000&after_seq={after}"
                async with http.get(url) as resp:
                    page = (await resp.json())["events"]
                if not page:
                    break
                stored += [e["data"] for e in page]
                after = page[-1]["seq"]
            assert len(stored) == len(set(stored)), f"seed {seed}: {rollout} holds an event twice"
            missing = tokens - set(stored)
            assert not missing, f"seed {seed}: acknowledged events lost in {rollout}: {sorted(missing)[:10]}"
    assert sum(map(len, acked.values())) > REPLICA_TRIALS * 20
