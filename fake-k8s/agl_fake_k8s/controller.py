"""A level-triggered controller loop: storage events map to keys, each key is reconciled by reading storage.

Keys wait in a de-duplicating queue (a key queued twice is reconciled once) and can be queued after a delay
(backoffs, deadlines). A reconcile that raises is logged and the loop goes on; stopping a controller loses only
its memory (timers), never state, which lives in storage.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import Generic, TypeVar

import structlog

from agl_fake_k8s.storage import Event, Storage

__all__ = ["Controller"]

log = structlog.get_logger("agl_fake_k8s")

K = TypeVar("K", bound=Hashable)


class Controller(Generic[K]):
    """Subclasses implement `keys_for(event)`, `initial_keys()` and `reconcile(key)`."""

    name = "controller"

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self._pending: dict[K, None] = {}
        self._wakeup = asyncio.Event()
        self._timers: dict[K, asyncio.TimerHandle] = {}

    def keys_for(self, event: Event) -> list[K]:
        raise NotImplementedError

    def initial_keys(self) -> list[K]:
        raise NotImplementedError

    def reconcile(self, key: K) -> None:
        raise NotImplementedError

    def enqueue(self, key: K) -> None:
        self._pending[key] = None
        self._wakeup.set()

    def enqueue_after(self, key: K, delay_s: float) -> None:
        """Reconcile `key` again in `delay_s` seconds (an earlier pending timer for it wins)."""
        if delay_s <= 0:
            self.enqueue(key)
            return
        loop = asyncio.get_running_loop()
        when = loop.time() + delay_s
        timer = self._timers.get(key)
        if timer is not None and not timer.cancelled() and timer.when() <= when:
            return
        if timer is not None:
            timer.cancel()
        self._timers[key] = loop.call_at(when, self._fire, key)

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.enqueue(key)

    def _on_event(self, event: Event) -> None:
        for key in self.keys_for(event):
            self.enqueue(key)

    async def run(self) -> None:
        unsubscribe = self.storage.subscribe(self._on_event)
        try:
            for key in self.initial_keys():
                self.enqueue(key)
            while True:
                while not self._pending:
                    self._wakeup.clear()
                    await self._wakeup.wait()
                key = next(iter(self._pending))
                del self._pending[key]
                try:
                    self.reconcile(key)
                except Exception as exc:  # one bad object must not stop the controller
                    log.error(
                        "fake k8s reconcile failed",
                        controller=self.name,
                        key=repr(key),
                        error=repr(exc),
                        exc_info=exc,
                    )
                await asyncio.sleep(0)  # a cooperative yield between keys, so clients are served meanwhile
        finally:
            unsubscribe()
            for timer in self._timers.values():
                timer.cancel()
            self._timers.clear()
