"""Records serialise by hand (faster than dataclasses.asdict): these tests keep them equal to asdict."""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any

import pytest

from agl_lite.store import codec
from agl_lite.store.records import Attempt, AttemptStatus, Event, Rollout, RolloutConfig, RolloutStatus

RECORDS: list[Any] = [
    Rollout(
        id="r",
        input={"q": [1, 2]},
        mode="val",
        status=RolloutStatus.RUNNING,
        metadata={"answer": 3},
        config=RolloutConfig(
            max_attempts=3, timeout_s=9.5, token_budget=100, runner={"cmd": ["x"]}, grader={"cmd": ["g"]}
        ),
        group_id="g",
        reward=1.0,
        completion_seq=4,
    ),
    Attempt(
        id="a", rollout_id="r", seq=2, status=AttemptStatus.FAILED, exit_code=3, message="m", deadline=5.0
    ),
    Event("r", 7, "reward", {"value": 1.0}, "a", "grader", 12.5),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_to_json_equals_asdict_field_for_field(record: Any) -> None:
    assert record.to_json() == asdict(record)
    assert set(record.to_json()) == {f.name for f in fields(record)}


def test_rollout_without_metadata_for_agents() -> None:
    assert "metadata" not in RECORDS[0].to_json(with_metadata=False)


def test_records_round_trip_through_the_codec() -> None:
    rollout, attempt, event = RECORDS
    assert codec.rollout_from_json(rollout.to_json()) == rollout
    assert codec.attempt_from_json(attempt.to_json()) == attempt
    assert codec.event_from_json(event.to_json()) == event
