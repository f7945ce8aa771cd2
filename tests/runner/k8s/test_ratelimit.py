"""The token bucket: a burst goes at once, then one request per 1/qps seconds, on a fake clock (0 s of real time)."""

from __future__ import annotations

import asyncio

import pytest

from agl_lite.runner.k8s.ratelimit import TokenBucket


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)


def test_the_burst_is_free_then_requests_are_spaced_by_one_over_qps() -> None:
    t = FakeTime()
    bucket = TokenBucket(qps=20, burst=5, clock=t.clock)
    delays = [bucket.reserve() for _ in range(8)]
    assert delays[:5] == [0.0] * 5
    assert delays[5:] == pytest.approx([0.05, 0.10, 0.15])


def test_tokens_refill_with_time_but_never_above_the_burst() -> None:
    t = FakeTime()
    bucket = TokenBucket(qps=10, burst=3, clock=t.clock)
    for _ in range(3):
        bucket.reserve()
    t.now = 100.0
    delays = [bucket.reserve() for _ in range(4)]
    assert delays == pytest.approx([0.0, 0.0, 0.0, 0.1])


async def test_two_hundred_requests_at_twenty_per_second_take_nine_seconds_after_a_burst_of_twenty() -> None:
    t = FakeTime()
    bucket = TokenBucket(qps=20, burst=20, clock=t.clock, sleep=t.sleep)
    await asyncio.gather(*(bucket.acquire() for _ in range(200)))
    assert len(t.sleeps) == 180
    assert max(t.sleeps) == pytest.approx(9.0)
    assert bucket.waited_s == pytest.approx(sum(t.sleeps))


@pytest.mark.parametrize(("qps", "burst"), [(0, 1), (1, 0), (-1, 5)])
def test_nonsense_limits_are_refused(qps: float, burst: int) -> None:
    with pytest.raises(ValueError, match="qps"):
        TokenBucket(qps, burst)
