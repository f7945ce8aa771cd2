"""What tests observe of the fake without sleeping: request counters and log, and a change signal to wait on.

Every client request and every committed write pulses `Changes`, so `wait_for(predicate)` re-checks exactly when
something happened and never polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["Changes", "RequestCounters", "RequestRecord"]

T = TypeVar("T")


class Changes:
    """A pulse: every `notify()` wakes whoever waits in `wait_for`."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait_for(self, predicate: Callable[[], T | None], timeout: float) -> T:
        """The first truthy value of `predicate()`, re-checked after each change; TimeoutError after `timeout` s."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not (value := predicate()):
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"condition not met within {timeout} s")
            event = self._event
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), remaining)
        return value


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One client request as the API server saw it."""

    at: float
    """time.monotonic() when it arrived."""
    verb: str
    """get, list, watch, create, update, patch, delete, deletecollection (as Kubernetes RBAC names them)."""
    resource: str
    """jobs, pods, pods/status, pods/binding, pods/log, secrets; "" for discovery and unknown paths."""
    namespace: str
    name: str
    status: int


class RequestCounters:
    """Counts of client requests by verb, by (verb, resource) and by status, and a bounded request log."""

    def __init__(self, changes: Changes, *, log_limit: int = 100_000) -> None:
        self._changes = changes
        self.by_verb: Counter[str] = Counter()
        self.by_resource: Counter[tuple[str, str]] = Counter()
        self.by_status: Counter[int] = Counter()
        self.log: deque[RequestRecord] = deque(maxlen=log_limit)
        self.watches_opened = 0
        self.open_watches = 0

    def arrived(self, verb: str, resource: str) -> float:
        """Count a request when it arrives (a watch counts while it is still open); returns its arrival time."""
        self.by_verb[verb] += 1
        self.by_resource[(verb, resource)] += 1
        self._changes.notify()
        return time.monotonic()

    def answered(self, at: float, verb: str, resource: str, namespace: str, name: str, status: int) -> None:
        """Log a request with its status once it is answered (a watch: once its stream ends)."""
        self.by_status[status] += 1
        self.log.append(RequestRecord(at, verb, resource, namespace, name, status))
        self._changes.notify()

    def watch_opened(self) -> None:
        self.watches_opened += 1
        self.open_watches += 1
        self._changes.notify()

    def watch_closed(self) -> None:
        self.open_watches -= 1
        self._changes.notify()
