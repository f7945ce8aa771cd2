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

import os
import random
from pathlib import Path

import pytest

from agl_lite.testing import MockVLLM, running_mock
from bench.harness.crash_load import Ledger, recover, run_trials
from bench.harness.gateway_process import gateway_processes
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
