"""The reliability tests judge with small oracles (log checks, record checks, the crash checks, the store digest);
a long run that passes proves something only if these fail when they should. Each is fed a known-bad input here.
"""

from __future__ import annotations

import random
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

from bench.harness.crash_load import Ledger, State, impossible_states, lost_writes
from bench.harness.fault_load import Call, FaultMix, check_records, plan_cycle
from bench.harness.gateway_process import log_problems, secrets_in
from tests.reliability.sqlite_view import store_digest, stored_text


def test_log_problems_flags_tracebacks_errors_and_stray_lines_but_not_warnings() -> None:
    lines = [
        '{"event": "upstream attempt failed", "level": "warning"}',
        '{"event": "flow failed", "level": "error"}',
        '{"event": "x", "level": "info", "exception": "Traceback (most recent call last): ..."}',
        "Traceback (most recent call last):",
        "",
    ]
    problems = log_problems(lines)
    assert len(problems) == 3
    assert log_problems(lines[:1]) == []


def test_secrets_in_finds_a_key_whole_or_by_its_signature_alone() -> None:
    key = "agl-agent.ro-1.c2lnbmF0dXJlLW9mLWEta2V5"
    assert secrets_in(f"header was Bearer {key}", [key]) == [key[:12] + "..."]
    assert secrets_in("sig c2lnbmF0dXJlLW9mLWEta2V5 leaked", [key]) == [key[:12] + "..."]
    assert secrets_in("nothing here", [key, "admin-key-0123456789"]) == []


def test_check_records_wants_exactly_one_record_per_call_with_its_fates_outcome() -> None:
    calls = [
        Call("call 0-0", "ok", True),
        Call("call 0-1", "reset", True),
        Call("call 0-2", "disconnect", True),
    ]

    def rec(tag: str, outcome: str) -> dict[str, Any]:
        return {"outcome": outcome, "request": {"messages": [{"role": "user", "content": tag}]}}

    good = [rec("call 0-0", "ok"), rec("call 0-1", "upstream_error"), rec("call 0-2", "client_disconnected")]
    assert check_records(calls, good) == []
    assert len(check_records(calls, good[:2])) == 1  # a lost record
    assert len(check_records(calls, [*good, rec("call 0-0", "ok")])) == 1  # a duplicate
    assert len(check_records(calls, [rec("call 0-0", "ok"), rec("call 0-1", "ok"), good[2]])) == 1  # wrong
    assert len(check_records(calls, [*good, rec("call 9-9", "ok")])) == 1  # a record of no call


def test_plan_cycle_places_exactly_the_asked_share_of_each_fault() -> None:
    calls = plan_cycle(random.Random(1), 0, 1000, FaultMix())
    fates = Counter(c.fate for c in calls)
    assert (fates["error_frame"], fates["reset"], fates["stall"], fates["disconnect"]) == (10, 10, 10, 100)
    assert all(c.stream for c in calls if c.fate == "disconnect")
    assert len({c.tag for c in calls}) == 1000


def _state(**rollout: Any) -> State:
    base: dict[str, Any] = {
        "status": "running",
        "attempts": [],
        "attempt_count": 0,
        "started_at": 1.0,
        "ended_at": None,
        "runner_id": "crash",
        "completion_seq": None,
        "config": {"max_attempts": 2},
        "reward": None,
    }
    return State({**base, **rollout}, [], [])


def test_the_crash_checks_find_lost_writes_and_impossible_states() -> None:
    ledger = Ledger(rollouts={"r1", "r2"}, claimed={"r1"}, calls={"r1": {"t1"}})
    state = {"r1": _state()}
    missing = lost_writes(ledger, state)
    assert "rollout r2" in missing
    assert any("LLM call" in m for m in missing)
    assert impossible_states("r1", _state()) == []
    bad = _state(status="succeeded", attempts=[{"id": "a", "seq": 1, "status": "running", "ended_at": None}])
    assert len(impossible_states("r1", bad)) >= 2  # terminal without completion_seq, with a running attempt
    orphan = State(_state().rollout, [], [{"attempt_id": "nope", "outcome": "ok"}])
    assert any("attempt the rollout does not have" in p for p in impossible_states("r1", orphan))


def test_the_store_digest_changes_with_any_row_and_stored_text_reads_every_value(tmp_path: Path) -> None:
    db = tmp_path / "x.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE t (k TEXT, v BLOB)")
        conn.execute("INSERT INTO t VALUES ('a', x'00')")
    conn.close()
    before = store_digest(db)
    assert store_digest(db) == before
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE t SET v = x'01'")
    conn.close()
    assert store_digest(db) != before
    assert "a" in stored_text(db).split("\n")
