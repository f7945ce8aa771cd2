"""A client-side token bucket for Kubernetes API requests (client-go's `qps`/`burst`), with injectable time.

Each request reserves a token at once and sleeps until its token is due, so concurrent callers are served in
order without a lock and a burst of launches never exceeds the configured rate. It must not do any I/O itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

__all__ = ["TokenBucket"]


class TokenBucket:
    def __init__(
        self,
        qps: float,
        burst: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError("qps must be positive and burst at least 1")
        self.qps = qps
        self.burst = burst
        self._clock = clock
        self._sleep = sleep
        self._tokens = float(burst)
        self._last = clock()
        self.waited_s = 0.0
        """Total time callers were held back (a metric: a high figure says qps is the bottleneck)."""

    def reserve(self) -> float:
        """Take the next token; returns how long the caller must wait before using it (0 when one was left)."""
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.qps)
        self._last = now
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.qps

    async def acquire(self) -> None:
        delay = self.reserve()
        if delay > 0:
            self.waited_s += delay
            await self._sleep(delay)
