"""When and how long the client waits before trying an idempotent request again: bounded exponential backoff with
jitter, honouring the server's Retry-After. Timing is injectable (`sleep`, `random`) so tests take no time.
"""

from __future__ import annotations

import asyncio
import random as _random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

__all__ = ["RetryPolicy"]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Retries of idempotent requests on connection errors, timeouts, 5xx and 429. Non-idempotent requests are
    never retried."""

    attempts: int = 5
    """Tries in all, the first included (1: never retry)."""
    base_s: float = 0.25
    """Backoff before the first retry, in seconds; doubled (`factor`) for each next one."""
    factor: float = 2.0
    max_s: float = 10.0
    """Longest backoff, in seconds."""
    jitter: float = 0.5
    """Fraction of each backoff that is random (0: none; 1: anywhere between 0 and the backoff)."""
    max_retry_after_s: float = 60.0
    """Longest a server's Retry-After is honoured for, in seconds."""
    sleep: Callable[[float], Awaitable[None]] = field(default=asyncio.sleep, compare=False)
    """How to wait; tests inject one that returns at once (or that restarts a server)."""
    random: Callable[[], float] = field(default=_random.random, compare=False)

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.base_s < 0 or self.factor < 1 or self.max_s < 0:
            raise ValueError("RetryPolicy: attempts >= 1, base_s >= 0, factor >= 1, max_s >= 0")
        if not 0 <= self.jitter <= 1:
            raise ValueError("RetryPolicy: jitter must be between 0 and 1")

    def delay(self, retry: int, retry_after: float | None = None) -> float:
        """Seconds to wait before retry number `retry` (0 for the first); Retry-After, when given, wins."""
        if retry_after is not None:
            return min(retry_after, self.max_retry_after_s)
        backoff = min(self.max_s, self.base_s * self.factor**retry)
        return backoff * (1 - self.jitter * self.random())
