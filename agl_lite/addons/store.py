"""Store: opens the rollout store (SQLite by default, or memory) and provides it to the other addons.

Put it first in the chain: `auth`, `sink`, `store_api` and the runner look the store up when they are configured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agl_lite.core.config import GatewayConfig, option
from agl_lite.core.services import LoadContext
from agl_lite.errors import ConfigError
from agl_lite.store.memory import MemoryStore
from agl_lite.store.rules import STORE, Store
from agl_lite.store.sqlite import SQLiteStore

__all__ = ["Storage"]


class Storage:
    short_name = "store"
    """Its name in a chain, and what other addons' `after` call it."""
    provides = (STORE,)
    """Configured before every other addon, so that any of them finds the store in its own `configure`."""

    @dataclass(frozen=True, slots=True)
    class Options:
        backend: Literal["sqlite", "memory"] = option(
            "sqlite", "`sqlite` (durable) or `memory` (tests, throwaway)."
        )
        path: str = option("agl-lite.db", "SQLite file, relative to the config file.")
        synchronous: Literal["NORMAL", "FULL"] = option(
            "NORMAL", "`NORMAL` survives a crash of the process; `FULL` also a power loss (slower commits)."
        )
        batch: int = option(256, "Most writes committed in one SQLite transaction (group commit).")
        queue_size: int = option(
            10_000, "Writes waiting for the writer; past it, writes get 503 + Retry-After."
        )
        max_rollout_bytes: int = option(
            1024**3,
            "Bytes one rollout's events and captured calls may take; past it its agent can neither post events "
            "nor start LLM calls (507 `quota_exceeded`; calls in flight are still recorded). 0: no quota.",
        )
        max_event_bytes: int = option(4 * 1024**2, "Largest event `data` (encoded); larger is a 413.")

    store: Store | None = None

    def load(self, ctx: LoadContext) -> None:
        self._ctx = ctx

    async def configure(self, config: GatewayConfig, options: Storage.Options | None) -> None:
        options = options or Storage.Options()
        if options.backend == "memory":
            self.store = MemoryStore()
        else:
            path = (config.base_dir / options.path).resolve()
            self._ctx.private_paths.add(path)  # with its -wal and -shm beside it
            self.store = await SQLiteStore.open(
                path,
                synchronous=options.synchronous,
                batch=options.batch,
                queue_size=options.queue_size,
            )
        if options.max_rollout_bytes < 0 or options.max_event_bytes < 1:
            raise ConfigError(
                f"{config.source}: addons.store.max_rollout_bytes must be >= 0 and max_event_bytes >= 1"
            )
        self.store.max_rollout_bytes = options.max_rollout_bytes or None
        self.store.max_event_bytes = options.max_event_bytes
        self._ctx.services.provide(STORE, self.store, by="store")
        self._ctx.tasks.spawn(self._release_on_stop(self.store), name="store.release_on_stop")

    async def _release_on_stop(self, store: Store) -> None:
        await self._ctx.stopping.wait()
        store.release_waiters()

    async def shutdown(self) -> None:
        if self.store is not None:
            await self.store.close()
