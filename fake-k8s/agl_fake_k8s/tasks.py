"""The fake cluster's background tasks: a reference is kept, failures are logged, shutdown cancels and awaits them.

Every loop of the fake (controllers, the kubelet's pod workers, container waits) is spawned here instead of with a
bare `asyncio.create_task`, whose task can be garbage-collected mid-flight.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import structlog

__all__ = ["TaskSet"]

log = structlog.get_logger("agl_fake_k8s.tasks")


class TaskSet:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any], *, name: str) -> asyncio.Task[Any]:
        """Run `coro` in the background; an exception it raises is logged with `name`, never lost."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("background task failed", task=task.get_name(), error=repr(exc), exc_info=exc)

    def __len__(self) -> int:
        return len(self._tasks)

    async def close(self, timeout: float = 5.0) -> None:
        """Cancel every task and wait (bounded) for them to finish."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)
