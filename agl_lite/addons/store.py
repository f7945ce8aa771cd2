"""Store: opens the rollout store (SQLite by default, PostgreSQL given a DSN, or memory) and provides it to the
other addons.

Put it first in the chain: `auth`, `sink`, `store_api` and the runner look the store up when they are configured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agl_lite.core.config import GatewayConfig, option
from agl_lite.core.key_source import key_file, read_key
from agl_lite.core.services import LoadContext
from agl_lite.errors import ConfigError
from agl_lite.store.memory import MemoryStore
from agl_lite.store.rules import STORE, Store
from agl_lite.store.sqlite import SQLiteStore

__all__ = ["DSN_ENV", "Storage"]

DSN_ENV = "AGL_STORE_DSN"


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
        dsn: str = option(
            "",
            "A PostgreSQL DSN (`postgresql://user:password@host:5432/db`): the store on that server, shared by "
            "every gateway given it (replicas). Empty: `AGL_STORE_DSN`, or the file `AGL_STORE_DSN_FILE` names "
            "(kept out of the config; read once, then wiped from the environment); neither: SQLite at `path`.",
        )
        synchronous: Literal["NORMAL", "FULL"] = option(
            "NORMAL", "`NORMAL` survives a crash of the process; `FULL` also a power loss (slower commits)."
        )
        batch: int = option(256, "Most writes committed in one transaction (group commit).")
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
        dsn = options.dsn or read_key(DSN_ENV)
        if dsn and options.backend == "memory":
            raise ConfigError(f"{config.source}: addons.store: a DSN is given, but backend is `memory`")
        if (path := key_file(DSN_ENV)) is not None:
            self._ctx.private_paths.add(path.resolve())
        if config.server.workers > 1 and not dsn:
            raise ConfigError(
                f"{config.source}: server.workers = {config.server.workers} needs the store on PostgreSQL "
                "(addons.store.dsn, or AGL_STORE_DSN): SQLite and memory belong to one process"
            )
        if options.backend == "memory":
            self.store = MemoryStore()
        elif dsn:
            try:  # (an extra: SQLite needs nothing of it)
                from agl_lite.store.postgres import PostgresStore
            except ImportError as exc:
                raise ConfigError(
                    f"{config.source}: addons.store: a PostgreSQL DSN needs psycopg: pip install 'agl-lite[postgres]'"
                ) from exc
            self.store = await PostgresStore.open(dsn, batch=options.batch, queue_size=options.queue_size)
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

    async def shutdown(self) -> None:
        if self.store is not None:
            await self.store.close()
