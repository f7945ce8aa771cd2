"""The backoff: exponential, capped, jittered down by at most its fraction; Retry-After wins, within a bound."""

from __future__ import annotations

import pytest

from agl_lite.client import RetryPolicy


def test_backoff_doubles_up_to_the_cap() -> None:
    policy = RetryPolicy(base_s=0.5, max_s=3.0, jitter=0.0)
    assert [policy.delay(n) for n in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_jitter_shortens_a_backoff_by_at_most_its_fraction() -> None:
    assert RetryPolicy(base_s=1.0, jitter=0.5, random=lambda: 1.0).delay(0) == 0.5
    assert RetryPolicy(base_s=1.0, jitter=0.5, random=lambda: 0.0).delay(0) == 1.0


def test_retry_after_wins_and_is_bounded() -> None:
    policy = RetryPolicy(base_s=0.1, max_retry_after_s=30.0)
    assert policy.delay(0, retry_after=12.0) == 12.0
    assert policy.delay(0, retry_after=3600.0) == 30.0


@pytest.mark.parametrize("kwargs", [{"attempts": 0}, {"jitter": 2.0}, {"factor": 0.5}, {"base_s": -1.0}])
def test_nonsense_policy_is_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="RetryPolicy"):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]
