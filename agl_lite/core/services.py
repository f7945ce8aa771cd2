"""Shared services addons provide to and look up from each other without importing each other.

Keys are typed (`ServiceKey[T]`), like aiohttp's `AppKey`: a store addon provides `STORE`, a runner requires it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from agl_lite.core.routes import HttpRoute
from agl_lite.core.tasks import TaskSet
from agl_lite.errors import ConfigError

__all__ = ["ADMIN_KEY", "METRICS_REGISTRY", "LoadContext", "ServiceKey", "Services"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ServiceKey(Generic[T]):
    name: str


if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

METRICS_REGISTRY: ServiceKey[CollectorRegistry] = ServiceKey("metrics")
"""The registry `/metrics` exposes (provided by the `metrics` addon): other addons add their gauges to it."""
ADMIN_KEY: ServiceKey[Callable[[], str]] = ServiceKey("admin_key")
"""The admin key `auth` checks keys against (its `key_env`), provided by the `auth` addon: a function, since the
key is read when `auth` is configured."""


class Services:
    def __init__(self) -> None:
        self._items: dict[str, tuple[str, Any]] = {}

    def provide(self, key: ServiceKey[T], value: T, *, by: str) -> None:
        if key.name in self._items:
            raise ConfigError(
                f"service {key.name!r} is provided twice (by {self._items[key.name][0]!r} and {by!r})"
            )
        self._items[key.name] = (by, value)

    def get(self, key: ServiceKey[T]) -> T | None:
        item = self._items.get(key.name)
        return None if item is None else cast(T, item[1])

    def require(self, key: ServiceKey[T], *, by: str) -> T:
        value = self.get(key)
        if value is None:
            raise ConfigError(
                f"addon {by!r} needs the service {key.name!r}; add an addon that provides it to the chain"
            )
        return value


@dataclass(slots=True)
class LoadContext:
    """What `load` hands each addon: shared services, the task owner for background loops, the route table."""

    services: Services = field(default_factory=Services)
    tasks: TaskSet = field(default_factory=TaskSet)
    routes: tuple[HttpRoute, ...] = ()
    """Every HTTP route of the chain (set before `load`), e.g. for an OpenAPI document."""
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the gateway begins to stop: long waits (the long polls) end then, not at the shutdown's deadline."""
    private_paths: set[Path] = field(default_factory=set)
    """Files no agent may read: the store's, key files, the config. Addons add theirs while they are configured;
    the local runner masks them from the agents it starts."""
