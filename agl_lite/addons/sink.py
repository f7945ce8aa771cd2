"""Sink: commits each captured LLM call (`capture.record`) to the store.

By default (`durability = "sync"`) it commits in `response_end`, before the client receives the end of its
response, so no agent ever saw a completion the store lost; `"async"` trades that for latency. Writes are batched
across flows by the store's group commit; its queue is bounded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import structlog

from agl_lite.core.config import GatewayConfig, option
from agl_lite.core.flow import Flow
from agl_lite.core.services import LoadContext
from agl_lite.errors import HttpError
from agl_lite.store.base import STORE, Store
from agl_lite.store.records import LLMCall

__all__ = ["Sink"]

log = structlog.get_logger("agl_lite.sink")


class Sink:
    @dataclass(frozen=True, slots=True)
    class Options:
        durability: Literal["sync", "async"] = option(
            "sync",
            "`sync`: commit before the client gets the end of the response; `async`: in the background.",
        )

    def __init__(self) -> None:
        self.committed = 0
        self.failed = 0

    def load(self, ctx: LoadContext) -> None:
        self._ctx = ctx

    def configure(self, config: GatewayConfig, options: Sink.Options | None) -> None:
        self.options = options or Sink.Options()
        self.store: Store = self._ctx.services.require(STORE, by="sink")

    async def response_end(self, flow: Flow) -> None:
        await self._commit(flow)

    async def error(self, flow: Flow) -> None:
        await self._commit(flow)

    async def _commit(self, flow: Flow) -> None:
        record = flow.metadata.get("capture.record")
        if not isinstance(record, LLMCall):
            return
        if self.options.durability == "async":
            self._ctx.tasks.spawn(self._write(record), name=f"sink {record.id}")
        else:
            await self._write(record)

    async def _write(self, record: LLMCall) -> None:
        try:
            await self.store.add_call(record)
            self.committed += 1
        except HttpError as exc:
            self.failed += 1
            log.error(
                "captured call not stored", call=record.id, rollout=record.rollout_id, error=exc.message
            )
