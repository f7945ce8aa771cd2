"""A testing kit for addon authors: run an addon's lifecycle with parsed options, record finished flows, and feed
upstream chunks through a response's taps and transforms as the gateway does.

    addon = await configured(Audit(), {"path": "audit.jsonl"})
    flow = make_flow("POST", "/v1/chat/completions", json_body={...})
    client_bytes = drive(flow, [b"data: ...\\n\\n", b"data: [DONE]\\n\\n"])

With a real gateway: `running_gateway(config, extra_addons=[recorder := FlowRecorder()])`, then
`await recorder.record()` is the captured call of the first flow that finished.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from agl_lite.core.addons import AddonManager, instance_entry
from agl_lite.core.config import GatewayConfig
from agl_lite.core.flow import Flow, flush_transforms
from agl_lite.core.services import LoadContext
from agl_lite.errors import InternalError
from agl_lite.store.records import LLMCall

__all__ = ["FlowRecorder", "configured", "drive"]

A = TypeVar("A")


async def configured(
    addon: A,
    options: Mapping[str, Any] | None = None,
    *,
    config: GatewayConfig | None = None,
    ctx: LoadContext | None = None,
) -> A:
    """`addon` after its `load` and `configure`, with `options` (an `[addons.NAME]` table) checked and parsed by
    its `Options` exactly as the gateway would: an unknown key or a bad value is the same `ConfigError`. Without
    `options`: the `options` the addon was built with, else its defaults."""
    config = config or GatewayConfig()
    manager = AddonManager([instance_entry(addon, config, options)], ctx)
    await manager.load()
    await manager.configure(config)
    return addon


def drive(flow: Flow, chunks: Iterable[bytes]) -> bytes:
    """Feed upstream `chunks` through `flow.response`'s taps and transforms in order, as the gateway relays them;
    what the client would receive (the transforms' leftovers flushed at the end)."""
    resp = flow.response
    if resp is None:
        raise InternalError("drive() needs flow.response (set it, or run response_headers first)")
    out: list[bytes] = []
    for chunk in chunks:
        for tap in resp.taps:
            tap(chunk)
        for t in resp.transforms:
            chunk = t(chunk)
        out.append(chunk)
    out.append(flush_transforms(resp.transforms))
    return b"".join(out)


class FlowRecorder:
    """An addon that keeps every finished flow (`flow_done`), for a test to wait on and read."""

    def __init__(self) -> None:
        self.flows: list[Flow] = []
        self._changed = asyncio.Event()

    def flow_done(self, flow: Flow) -> None:
        self.flows.append(flow)
        self._changed.set()

    async def wait(self, n: int = 1, timeout: float = 5.0) -> list[Flow]:
        """The finished flows, once there are at least `n` (TimeoutError after `timeout` seconds)."""
        async with asyncio.timeout(timeout):
            while len(self.flows) < n:
                self._changed.clear()
                await self._changed.wait()
        return self.flows

    async def record(self, n: int | None = None) -> LLMCall:
        """The captured call (`capture.record`) of the `n`-th flow that finished; without `n`, of the one flow
        the test made (an error if more than one has finished)."""
        flows = await self.wait(n or 1)
        if n is None and len(flows) != 1:
            raise AssertionError(f"{len(flows)} flows finished where one was expected")
        record = flows[(n or 1) - 1].metadata.get("capture.record")
        if not isinstance(record, LLMCall):
            raise AssertionError(
                f"flow {n or 1} has no captured call (is capture in the chain before this addon?)"
            )
        return record
