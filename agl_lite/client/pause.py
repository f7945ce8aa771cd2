"""`paused()`: pause the gateway (hold new LLM calls), wait for the calls in flight to drain, run the block (a
weight sync), and resume on the way out — on an exception or a cancellation too.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Literal, Protocol

from agl_lite.client.errors import DrainTimeout
from agl_lite.client.results import GatewayState

__all__ = ["paused"]


class _Control(Protocol):
    def pause(
        self, mode: Literal["hold", "reject"] = "hold", hold_timeout_s: float | None = None
    ) -> Awaitable[GatewayState]: ...
    def resume(self) -> Awaitable[GatewayState]: ...
    def gateway_state(self, wait_drained: float | None = None) -> Awaitable[GatewayState]: ...


@asynccontextmanager
async def paused(
    control: _Control,
    *,
    drain_timeout_s: float = 60.0,
    hold_timeout_s: float | None = None,
    mode: Literal["hold", "reject"] = "hold",
    require_drained: bool = True,
) -> AsyncIterator[GatewayState]:
    """Yields the gateway's state once drained. Calls that arrive meanwhile are held (or rejected with 429 in
    `reject` mode) until resume or their hold timeout (`hold_timeout_s`; the gateway's default when None).

    With `require_drained`, calls still in flight after `drain_timeout_s` raise DrainTimeout (after resuming).
    """
    await control.pause(mode, hold_timeout_s)
    try:
        state = await control.gateway_state(wait_drained=drain_timeout_s)
        if not state.drained and require_drained:
            where = "here" if state.in_flight else "in another gateway on the store"
            raise DrainTimeout(
                f"LLM calls still in flight {where} after {drain_timeout_s} s; the gateway was resumed",
                state.in_flight,
            )
        yield state
    finally:
        # Shielded: a second cancellation must not leave the gateway paused.
        await asyncio.shield(control.resume())
