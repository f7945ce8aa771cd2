"""Waiting for rollouts on the store's completion cursor (`GET /api/rollouts/completed?after=&wait=&limit=`).

Both `wait` and the `completions` iterator make one request per page of terminal rollouts or per long-poll
timeout — never one per pending rollout, however many are awaited.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Iterable

from agl_lite.client.results import WaitResult
from agl_lite.store.records import Rollout

__all__ = ["MAX_POLL_S", "Completions", "Progress", "wait_for"]

CompletedFn = Callable[[int, int, float], Awaitable[tuple[list[Rollout], int]]]
"""`completed(after, limit, wait)`: one page of the cursor and the next cursor."""
Progress = Callable[[int, int], None]
"""`progress(done, total)`, called after each page."""

MAX_POLL_S = 60.0
"""The longest long-poll the server accepts."""


class Completions:
    """`async for rollout in client.completions(after=0)`: every rollout that turns terminal, in completion
    order, forever. `cursor` is where to resume: the position of the last rollout yielded."""

    def __init__(
        self, completed: CompletedFn, after: int = 0, page_size: int = 100, poll_s: float = 30.0
    ) -> None:
        self.completed = completed
        self.cursor = after
        self.page_size = page_size
        self.poll_s = poll_s
        self._buffer: deque[Rollout] = deque()
        self._fetched = after

    def __aiter__(self) -> Completions:
        return self

    async def __anext__(self) -> Rollout:
        while not self._buffer:
            rows, self._fetched = await self.completed(
                self._fetched, self.page_size, min(self.poll_s, MAX_POLL_S)
            )
            self._buffer.extend(rows)
        rollout = self._buffer.popleft()
        self.cursor = rollout.completion_seq or self.cursor
        return rollout


async def wait_for(
    completed: CompletedFn,
    ids: Iterable[str],
    timeout: float | None,
    *,
    after: int = 0,
    page_size: int = 100,
    poll_s: float = 30.0,
    progress: Progress | None = None,
) -> WaitResult:
    """Follow the cursor from `after` until every id is terminal or `timeout` seconds passed (None: no limit)."""
    order = list(dict.fromkeys(ids))
    pending = set(order)
    done: dict[str, Rollout] = {}
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    cursor = after
    while pending:
        remaining = None if deadline is None else deadline - loop.time()
        if remaining is not None and remaining <= 0:
            break
        wait = min(poll_s, MAX_POLL_S) if remaining is None else min(poll_s, MAX_POLL_S, remaining)
        rows, cursor = await completed(cursor, page_size, max(wait, 0.0))
        for rollout in rows:
            if rollout.id in pending:
                pending.discard(rollout.id)
                done[rollout.id] = rollout
        if progress is not None:
            progress(len(done), len(order))
    return WaitResult([done[i] for i in order if i in done], [i for i in order if i in pending], cursor)
