"""The addon manager: the ordered chain, per-hook dispatch lists computed once, contained failures.

Handlers may be sync or async. A failing handler is logged with its addon's name and the chain goes on, except in
`request_headers` and `request`, where an unexpected exception fails the flow closed (500) and an `HttpError`
becomes its JSON answer.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from agl_lite.core.api import Endpoints
from agl_lite.core.config import GatewayConfig, parse_dataclass
from agl_lite.core.flow import Flow, error_response
from agl_lite.core.hooks import all_hooks
from agl_lite.core.registry import resolve_addon
from agl_lite.core.routes import HttpRoute
from agl_lite.core.services import LoadContext
from agl_lite.errors import ConfigError, HttpError, InternalError

__all__ = ["AddonManager", "LoadedAddon", "check_order", "instance_entry", "load_chain", "parse_options"]

log = structlog.get_logger("agl_lite.addons")


@dataclass(slots=True)
class LoadedAddon:
    name: str
    """The chain entry (short name or import string)."""
    addon: Any
    options: Any = None


@dataclass(slots=True, frozen=True)
class _Handler:
    addon: str
    fn: Callable[..., Any]
    is_async: bool


def load_chain(config: GatewayConfig, builtins: Mapping[str, str]) -> list[LoadedAddon]:
    """Instantiate the chain's addons with their typed options (`[addons.NAME]` checked by their `Options`); short
    names are those of `builtins` (`agl_lite.addons.ADDONS`)."""
    loaded = []
    seen: set[str] = set()
    for spec in config.full_chain:
        if spec in seen:
            raise ConfigError(f"{config.source}: addon {spec!r} appears twice in addons.chain")
        seen.add(spec)
        cls = resolve_addon(spec, builtins)
        loaded.append(LoadedAddon(spec, cls(), parse_options(cls, config.addons.get(spec, {}), config, spec)))
    return loaded


def parse_options(cls: type, table: Mapping[str, Any], config: GatewayConfig, name: str) -> Any:
    """The addon class's `Options` from its `[addons.NAME]` table (defaults for what it leaves out); None for an
    addon that takes no options, which then must be given none."""
    options_cls = getattr(cls, "Options", None)
    if options_cls is None:
        if table:
            raise ConfigError(
                f"{config.source}: addon {name!r} takes no options, but [addons.{name}] sets some"
            )
        return None
    return parse_dataclass(options_cls, table, file=config.source, where=f"addons.{name}")


def instance_entry(addon: Any, config: GatewayConfig, table: Mapping[str, Any] | None = None) -> LoadedAddon:
    """An addon instance as a chain entry (tests, `running_gateway(extra_addons=...)`), named by its import string.
    Its options: `table`, else the config's `[addons."module:Class"]`, parsed as for a chain entry; without either,
    the `options` it was built with (an instance of its `Options`), else its defaults."""
    cls = type(addon)
    name = f"{cls.__module__}:{cls.__qualname__}"
    if table is None:
        table = config.addons.get(name)
    options_cls = getattr(cls, "Options", None)
    own = getattr(addon, "options", None)
    if table is None and options_cls is not None and isinstance(own, options_cls):
        return LoadedAddon(name, addon, own)
    return LoadedAddon(name, addon, parse_options(cls, table or {}, config, name))


def _config_files(config: GatewayConfig) -> set[Path]:
    """The config's own files: private to the gateway, like the store (`LoadContext.private_paths`)."""
    if config.source == "<defaults>":
        return set()
    return {Path(os.path.realpath(p)) for p in (config.source, config.routes_path)}


def _canonical(item: LoadedAddon) -> str:
    """The name `after` knows an addon by, however the chain named it (short name, import string, instance): its
    class's `short_name` (every built-in declares one), else its chain entry."""
    short = getattr(type(item.addon), "short_name", None)
    return short if isinstance(short, str) and short else item.name


def check_order(addons: Sequence[LoadedAddon]) -> None:
    """Each addon's `after` (short name → why) names addons that, when in the chain, must come before it: their
    hooks set what it reads. A chain that breaks one is a ConfigError naming both (it would start, and silently
    skip a check or store nothing)."""
    position = {_canonical(item): i for i, item in enumerate(addons)}
    for i, item in enumerate(addons):
        for earlier, why in getattr(item.addon, "after", {}).items():
            j = position.get(earlier)
            if j is not None and j > i:
                raise ConfigError(
                    f"addons.chain: {item.name!r} must come after {addons[j].name!r} ({why}); "
                    f"move {addons[j].name!r} before {item.name!r}"
                )


class AddonManager:
    def __init__(self, addons: Sequence[LoadedAddon], ctx: LoadContext | None = None) -> None:
        self.addons = list(addons)
        check_order(self.addons)
        self.ctx = ctx or LoadContext()
        self._handlers: dict[str, list[_Handler]] = {}
        for hook_name in all_hooks:
            handlers = []
            for item in self.addons:
                fn = getattr(item.addon, hook_name, None)
                if fn is None:
                    continue
                if not callable(fn):
                    raise ConfigError(
                        f"addon {item.name!r}: attribute {hook_name!r} is a hook name but not callable"
                    )
                handlers.append(_Handler(item.name, fn, inspect.iscoroutinefunction(fn)))
            self._handlers[hook_name] = handlers
        self._request_headers = self._handlers["request_headers"]
        self._request = self._handlers["request"]
        self._response_headers = self._handlers["response_headers"]
        self._response_end = self._handlers["response_end"]
        self._error = self._handlers["error"]
        self._flow_done = self._handlers["flow_done"]

    def routes(self) -> list[HttpRoute]:
        """Every route the chain's addons declare (their `routes` class attribute), in chain order."""
        out: list[HttpRoute] = []
        for item in self.addons:
            routes = tuple(getattr(item.addon, "routes", ()))
            tables = [
                v for c in type(item.addon).__mro__ for v in vars(c).values() if isinstance(v, Endpoints)
            ]
            missing = [r.name for t in tables for r in t.routes if r not in routes]
            if missing:
                # `routes = table.routes` written above an endpoint's declaration: that endpoint would be a 404
                raise ConfigError(
                    f"addon {item.name!r} declares endpoints {missing} that are not in its routes; set "
                    "`routes = table.routes` after its last endpoint"
                )
            out.extend(routes)
        return out

    # --- lifecycle ---------------------------------------------------------------------------------------------

    async def load(self) -> None:
        for h in self._handlers["load"]:
            await self._call_strict(h, self.ctx)

    async def configure(self, config: GatewayConfig) -> None:
        """`configure` in chain order, except that the addons providing services (`provides`) go first: an addon
        looks a service up in its own `configure`, wherever the provider stands in the chain."""
        options = {item.name: item.options for item in self.addons}
        providers = {item.name for item in self.addons if getattr(item.addon, "provides", ())}
        self.ctx.private_paths.update(_config_files(config))
        handlers = self._handlers["configure"]
        for h in [h for h in handlers if h.addon in providers] + [
            h for h in handlers if h.addon not in providers
        ]:
            await self._call_strict(h, config, options[h.addon])

    async def running(self) -> None:
        for h in self._handlers["running"]:
            await self._call_strict(h)

    async def shutdown(self) -> None:
        await self._run(reversed(self._handlers["shutdown"]), None, "shutdown")
        await self.ctx.tasks.close()

    async def _call_strict(self, h: _Handler, *args: Any) -> None:
        """Lifecycle hooks: a ConfigError stops start-up as it is; anything else is wrapped with the addon's name."""
        try:
            result = h.fn(*args)
            if h.is_async:
                await result
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(f"addon {h.addon!r} failed to start: {exc!r}") from exc

    # --- per flow ----------------------------------------------------------------------------------------------

    async def request_headers(self, flow: Flow) -> None:
        """The `request_headers` hook: stops at the first addon that answers or fails, as `request` does."""
        await self._answering(self._request_headers, flow, "request_headers")

    async def request(self, flow: Flow) -> None:
        """The `request` hook: stops at the first addon that answers (sets `flow.response`) or fails."""
        await self._answering(self._request, flow, "request")

    async def _answering(self, handlers: list[_Handler], flow: Flow, hook: str) -> None:
        for h in handlers:
            try:
                result = h.fn(flow)
                if h.is_async:
                    await result
            except HttpError as exc:
                flow.response = error_response(exc)
            except Exception as exc:
                log.error(
                    f"addon failed in {hook}; failing the flow closed",
                    addon=h.addon,
                    error=repr(exc),
                    exc_info=exc,
                )
                flow.response = error_response(InternalError(f"internal error in addon {h.addon!r}"))
            if flow.response is not None:
                return

    async def response_headers(self, flow: Flow) -> None:
        await self._run(self._response_headers, flow, "response_headers")

    async def response_end(self, flow: Flow) -> None:
        flow.ended = True
        await self._run(self._response_end, flow, "response_end")

    async def error(self, flow: Flow) -> None:
        flow.ended = True
        await self._run(self._error, flow, "error")

    async def flow_done(self, flow: Flow) -> None:
        await self._run(self._flow_done, flow, "flow_done")

    async def _run(self, handlers: Iterable[_Handler], flow: Flow | None, hook: str) -> None:
        """Every handler (of a flow, or none: `shutdown`); failures are logged and contained."""
        for h in handlers:
            try:
                result = h.fn() if flow is None else h.fn(flow)
                if h.is_async:
                    await result
            except Exception as exc:
                log.error("addon failed", addon=h.addon, hook=hook, error=repr(exc), exc_info=exc)
