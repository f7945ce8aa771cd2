"""Control: pause and resume LLM calls around a weight sync, cap and report in-flight calls (DESIGN.md §6).

A paused gateway holds new LLM calls until resume (bounded, then 503) or rejects them (429); the API is never
paused. Held calls are not in flight, so a drain (`GET /api/gateway/state?wait_drained=S`) cannot deadlock.
Past `max_in_flight` LLM calls, a new one gets 503 + Retry-After at once (never queued). Sets `control.held_s`
on calls it held and `control.rejected` ("paused" | "hold_timeout" | "hold_full" | "busy") on calls it refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from prometheus_client import Counter
from pydantic import BaseModel, ConfigDict, Field

from agl_lite.core.api import Call, Endpoints, Param
from agl_lite.core.config import GatewayConfig, option
from agl_lite.core.flow import Flow
from agl_lite.core.prom import gauges
from agl_lite.core.routes import RouteKind, Scope
from agl_lite.core.services import METRICS_REGISTRY, LoadContext, Services
from agl_lite.core.tasks import TaskSet
from agl_lite.errors import ConfigError, ServiceUnavailable, TooManyRequests
from agl_lite.store.rules import STORE, Store

__all__ = ["MAX_HOLD_S", "Control", "PauseIn", "PauseMode"]

MAX_HOLD_S = 3600
"""Longest hold a pause may ask for, in seconds (the bound the OpenAPI document states for `hold_timeout_s`)."""


DRAIN_POLL_S = 0.1
"""How often a drain under a shared pause reads the other gateways' answers."""


class PauseMode(StrEnum):
    HOLD = "hold"
    """New LLM calls wait for resume, at most the pause's hold timeout, then get 503."""
    REJECT = "reject"
    """New LLM calls get 429 at once."""


class PauseIn(BaseModel):
    """The body of `POST /api/gateway/pause` (none: the defaults)."""

    model_config = ConfigDict(extra="forbid")
    mode: PauseMode = PauseMode.HOLD
    hold_timeout_s: float | None = Field(
        None, ge=0, le=MAX_HOLD_S, strict=True, description="The hold's bound; the addon's default if absent."
    )


class Control:
    short_name = "control"
    """Its name in a chain, and what other addons' `after` call it."""
    table = Endpoints()

    @dataclass(frozen=True, slots=True)
    class Options:
        hold_timeout_s: float = option(
            60.0, "Longest a held LLM call waits for resume, in seconds, unless the pause sets its own."
        )
        retry_after_s: int = option(10, "Retry-After, in seconds, sent with the 429 (reject) and 503 (hold).")
        max_wait_s: float = option(600.0, "Upper bound on `?wait_drained=S`, in seconds.")
        max_in_flight: int = option(
            2048,
            "Most LLM calls in flight at once, all keys together (as many as `upstream.max_connections`, so none "
            "waits for a connection); past it a call gets 503 + Retry-After at once (never queued). 0: no cap.",
        )
        max_held: int = option(
            4096, "Most LLM calls held by a pause at once; past it a call gets 503 + Retry-After at once."
        )
        busy_retry_after_s: int = option(
            1, "Retry-After, in seconds, sent with the 503 of a call over the cap."
        )

    def __init__(self, options: Control.Options | None = None) -> None:
        self.options = options or Control.Options()
        self.paused = False
        self.mode: PauseMode | None = None
        self.hold_timeout_s: float | None = None
        self.paused_since: float | None = None
        self.held = 0
        self.refused_busy = 0
        """LLM calls refused because `max_in_flight` were in flight."""
        self._admitted: set[int] = set()
        self._resumed = asyncio.Event()
        self._tick: asyncio.Event | None = None
        self._services: Services | None = None
        self._busy_counter: Counter | None = None
        self._store: Store | None = None
        """The store, when other gateways share it: a pause is shared with every gateway on it (docs/store.md)."""
        self.pause_id: str | None = None
        """The pause in force, as the gateways on the store know it."""
        self.others_drained = False
        """Under a shared pause: every other live gateway on the store said it holds it with nothing in flight."""
        self._reporting = False
        self._tasks: TaskSet | None = None
        self._version = 0
        """The version of the shared pause state applied here (`_apply_shared`)."""

    @property
    def in_flight(self) -> int:
        """LLM calls that passed the gate and have not reached `flow_done` (held calls are not counted)."""
        return len(self._admitted)

    def state(self) -> dict[str, Any]:
        return {
            "paused": self.paused,
            "mode": self.mode,
            "hold_timeout_s": self.hold_timeout_s,
            "in_flight": self.in_flight,
            "max_in_flight": self.options.max_in_flight or None,
            "refused_busy": self.refused_busy,
            "held": self.held,
            "paused_since": self.paused_since,
            "others_drained": self.others_drained if self._store is not None and self.pause_id else None,
        }

    async def wait_until(self, predicate: Callable[[Control], bool], timeout: float) -> None:
        """Return once `predicate(self)` holds (re-checked on every change); TimeoutError after `timeout` s."""
        async with asyncio.timeout(timeout):
            while not predicate(self):
                if self._tick is None:
                    self._tick = asyncio.Event()
                await self._tick.wait()

    # --- hooks -----------------------------------------------------------------------------------------------

    def load(self, ctx: LoadContext) -> None:
        self._services = ctx.services
        self._tasks = ctx.tasks

    def configure(self, config: GatewayConfig, options: Control.Options | None) -> None:
        if options is not None:  # None when added as an instance (tests): keep the constructor's
            self.options = options
        o = self.options
        if not all(getattr(o, f.name) >= 0 for f in dataclasses.fields(o)):  # (a NaN fails too)
            raise ConfigError(
                f"{config.source}: addons.control: hold_timeout_s, retry_after_s, max_wait_s, max_in_flight, "
                "max_held and busy_retry_after_s must be >= 0"
            )
        # Looked up here, not in load: the metrics addon may come later in the chain.
        registry = self._services.get(METRICS_REGISTRY) if self._services is not None else None
        store = self._services.get(STORE) if self._services is not None else None
        self._store = store if store is not None and store.shared else None  # (one process: nothing to share)
        if registry is not None:
            gauges(
                registry,
                agl_gateway_paused=("1 while LLM calls are paused.", lambda: float(self.paused)),
                agl_gateway_held_requests=(
                    "LLM calls held by a pause, waiting for resume.",
                    lambda: float(self.held),
                ),
                agl_gateway_in_flight_requests=(
                    "LLM calls admitted by control and not done (what max_in_flight caps).",
                    lambda: float(self.in_flight),
                ),
            )
            self._busy_counter = Counter(
                "agl_gateway_busy_refusals",
                "LLM calls refused with 503 because max_in_flight calls were in flight.",
                registry=registry,
            )

    async def running(self) -> None:
        """Join the pause in force on the store's gateways (one starting during a weight sync starts paused), and
        follow the pauses the others share from now on."""
        if self._store is None:
            return
        self._store.on_pause(self._apply_shared)
        if (state := await self._store.shared_pause()) is not None:
            self._apply_shared(state)

    async def request(self, flow: Flow) -> None:
        if flow.route.kind is RouteKind.LLM:
            if self.paused:
                await self._gate(flow)
            cap = self.options.max_in_flight
            if cap and len(self._admitted) >= cap:
                self._refuse_busy(flow, cap)
            self._admitted.add(flow.id)
            self._changed()
        else:
            await self.table.dispatch(self, flow)

    def flow_done(self, flow: Flow) -> None:
        if flow.id in self._admitted:
            self._admitted.discard(flow.id)
            self._changed()

    # --- its endpoints -------------------------------------------------------------------------------------

    @table.endpoint("POST", "/api/gateway/pause", Scope.ADMIN, body=PauseIn, empty_body={})
    async def gateway_pause(self, call: Call) -> Any:
        """Pause LLM calls: body {"mode": "hold"|"reject", "hold_timeout_s"?: number}."""
        mode, timeout = call.body.mode, call.body.hold_timeout_s
        if timeout is None:
            timeout = self.options.hold_timeout_s
        await self._change(
            {"pause_id": uuid.uuid4().hex, "mode": mode.value, "hold_timeout_s": float(timeout)}
        )
        return self.state()

    @table.endpoint("POST", "/api/gateway/resume", Scope.ADMIN)
    async def gateway_resume(self, call: Call) -> Any:
        """Resume LLM calls."""
        await self._change(None)
        return self.state()

    @table.endpoint(
        "GET",
        "/api/gateway/state",
        Scope.ADMIN,
        query={"wait_drained": Param("number", None, 0)},
    )
    async def gateway_state(self, call: Call) -> Any:
        """Pause state and in-flight LLM calls; `?wait_drained=S` waits up to S s for none in flight."""
        wait = call.query["wait_drained"]
        if wait is not None:
            deadline = asyncio.get_running_loop().time() + min(wait, self.options.max_wait_s)
            with contextlib.suppress(TimeoutError):
                await self.wait_until(
                    lambda c: c.in_flight == 0, deadline - asyncio.get_running_loop().time()
                )
                async with asyncio.timeout_at(deadline):
                    await self._others_drained()
        return self.state()

    async def _others_drained(self) -> None:
        """Under a shared pause, until every other live gateway on the store holds it with nothing in flight."""
        while self._store is not None and self.pause_id is not None and self.in_flight == 0:
            if await self._store.others_drained(self.pause_id):
                self.others_drained = True
                return
            # (the others' answers are rows in the store: read again, bounded by the caller's deadline)
            await asyncio.sleep(DRAIN_POLL_S)

    routes = table.routes

    # --- internals -------------------------------------------------------------------------------------------

    def _refuse_busy(self, flow: Flow, cap: int) -> None:
        """503 at once: a queue here would only move the overload into memory and into every caller's latency."""
        flow.metadata["control.rejected"] = "busy"
        self.refused_busy += 1
        if self._busy_counter is not None:
            self._busy_counter.inc()
        raise ServiceUnavailable(
            f"the gateway has {cap} LLM calls in flight, its limit (addons.control.max_in_flight); retry later",
            headers={"Retry-After": str(self.options.busy_retry_after_s)},
        )

    async def _gate(self, flow: Flow) -> None:
        """Hold or reject a call while paused; returns once it may go on (resumed within its bound)."""
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        deadline = t0 + (self.hold_timeout_s or 0.0)  # the bound of the pause the call arrived in
        retry = {"Retry-After": str(self.options.retry_after_s)}
        while self.paused:
            if self.mode is PauseMode.REJECT:
                flow.metadata["control.rejected"] = "paused"
                raise TooManyRequests("the gateway is paused (weight sync); retry later", headers=retry)
            remaining = deadline - loop.time()
            if remaining <= 0:
                flow.metadata["control.rejected"] = "hold_timeout"
                raise ServiceUnavailable(
                    "the gateway stayed paused longer than the hold timeout", headers=retry
                )
            if self.held >= self.options.max_held:
                flow.metadata["control.rejected"] = "hold_full"
                raise ServiceUnavailable(
                    f"the gateway is paused and holds {self.held} calls, its limit (addons.control.max_held)",
                    headers=retry,
                )
            resumed = self._resumed
            self.held += 1
            self._changed()
            try:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        await resumed.wait()
            except asyncio.CancelledError:
                # aiohttp cancels the handler when the client leaves; the relay is never reached to note it.
                flow.client_disconnected = True
                raise
            finally:
                self.held -= 1
                flow.metadata["control.held_s"] = loop.time() - t0
                self._changed()

    async def _change(self, pause: dict[str, Any] | None) -> None:
        """Pause (or resume: None) here, and every gateway on the store where one is shared. The shared state
        is applied in commit order (its version), whichever way it arrives: from the store's answer here or from
        a notification, so that gateways changed side by side end alike."""
        shared = await self._store.share_pause(pause) if self._store is not None else None
        if shared is None:
            self._apply(pause)
        else:
            self._apply_shared(shared)

    def _apply_shared(self, state: dict[str, Any]) -> None:
        if state["version"] > self._version:
            self._version = state["version"]
            self._apply(state["pause"])

    def _apply(self, pause: dict[str, Any] | None) -> None:
        """A pause (or resume: None), made here or heard from another gateway on the store."""
        if pause is None:
            if self.paused:
                self.paused, self.mode, self.hold_timeout_s, self.paused_since = False, None, None, None
                self.pause_id = None
                self._wake_held()
                self._changed()
            return
        mode = PauseMode(pause["mode"])
        if not self.paused:
            self.paused, self.paused_since = True, time.time()
        elif mode is not self.mode:
            self._wake_held()  # held calls re-check: switching to reject answers them 429 now
        self.mode, self.hold_timeout_s, self.pause_id = (
            mode,
            float(pause["hold_timeout_s"]),
            pause["pause_id"],
        )
        self.others_drained = False
        self._changed()

    def _report_soon(self) -> None:
        """Under a shared pause, tell the store how many calls are still in flight here (at most one write in
        flight: the next takes the count of its own moment)."""
        if self._reporting or self._store is None or self.pause_id is None or self._tasks is None:
            return
        self._reporting = True
        self._tasks.spawn(self._report(self._store), name="control.report_drain")

    async def _report(self, store: Store) -> None:
        try:
            while (pause_id := self.pause_id) is not None:
                reported = self.in_flight
                await store.report_drain(pause_id, reported)
                if (self.pause_id, self.in_flight) == (pause_id, reported):
                    return
        finally:
            self._reporting = False

    def _wake_held(self) -> None:
        resumed, self._resumed = self._resumed, asyncio.Event()
        resumed.set()

    def _changed(self) -> None:
        if self.paused and self._store is not None:
            self._report_soon()
        # Only allocates when someone waits, so the LLM hot path pays nothing for `wait_until`.
        tick, self._tick = self._tick, None
        if tick is not None:
            tick.set()
