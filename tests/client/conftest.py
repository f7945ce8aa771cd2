"""A real gateway with the store API and controls over SQLite, in the test's loop (async tests) or in a thread of
its own (the CLI and the sync client, which block); a client whose retries take no time; captured-call records."""

from __future__ import annotations

import asyncio
import threading
from array import array
from collections.abc import AsyncIterator, Coroutine, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from agl_lite.client import AglLiteClient, RetryPolicy
from agl_lite.core.server import Gateway
from agl_lite.service import running_gateway
from agl_lite.store.records import CallOutcome, ChoiceRecord, LLMCall, Rollout, RolloutConfig, RolloutStatus
from agl_lite.store.rules import STORE, RolloutSpec, Store
from agl_lite.testing.gateway import write_config
from tests.conftest import ADMIN_KEY, GatewayFactory, gateway_url

T = TypeVar("T")

CHAIN = ("store", "auth", "store_api", "control")
NO_UPSTREAM = {"m": ["http://127.0.0.1:9/v1"]}


async def no_sleep(_: float) -> None:
    await asyncio.sleep(0)


FAST = RetryPolicy(sleep=no_sleep)
"""Retries as usual, without waiting."""


def sqlite_options(path: Path) -> dict[str, dict[str, Any]]:
    return {"store": {"backend": "sqlite", "path": str(path)}}


def store_of(gw: Gateway) -> Store:
    return gw.addons.ctx.services.require(STORE, by="test")


@pytest.fixture
async def gateway(gateway_factory: GatewayFactory, tmp_path: Path) -> AsyncIterator[Gateway]:
    async with gateway_factory(NO_UPSTREAM, chain=CHAIN, addons=sqlite_options(tmp_path / "store.db")) as gw:
        yield gw


@pytest.fixture
async def client(gateway: Gateway) -> AsyncIterator[AglLiteClient]:
    async with AglLiteClient(gateway_url(gateway), ADMIN_KEY, retry=FAST) as c:
        yield c


async def running(store: Store, *ids: str, **config: Any) -> list[Rollout]:
    """Rollouts enqueued and claimed (running), by id."""
    await store.enqueue([RolloutSpec({"q": i}, id=i, config=RolloutConfig(**config)) for i in ids])
    return await store.claim("test-runner", len(ids))


async def finished(store: Store, *ids: str, status: RolloutStatus = RolloutStatus.SUCCEEDED) -> None:
    await running(store, *ids)
    for rid in ids:
        await store.finish(rid, status)


def make_call(
    rollout_id: str | None,
    attempt_id: str | None,
    order_key: int,
    prompt: list[int],
    completions: list[list[int]],
    *,
    outcome: CallOutcome = CallOutcome.OK,
) -> LLMCall:
    """A captured chat call with one choice per completion (logprobs of -0.5, -0.25, ... per token)."""
    return LLMCall(
        id=f"call-{rollout_id}-{order_key}",
        order_key=order_key,
        outcome=outcome,
        api="chat",
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        status=200,
        model="m",
        model_version="v1",
        response_id=f"chatcmpl-{rollout_id}-{order_key}",
        request={"model": "m", "messages": [{"role": "user", "content": f"turn {order_key}"}]},
        prompt_token_ids=array("I", prompt),
        choices=[
            ChoiceRecord(
                index=i,
                text=f"answer {i}",
                finish_reason="stop",
                token_ids=array("I", ids),
                logprobs=array("f", [-0.5 / (k + 1) for k in range(len(ids))]),
            )
            for i, ids in enumerate(completions)
        ],
    )


class BackgroundGateway:
    """A gateway serving from a thread of its own, for tests that block (the CLI, the sync client)."""

    def __init__(self, directory: Path, chain: tuple[str, ...] = CHAIN) -> None:
        self.config = write_config(
            directory, NO_UPSTREAM, chain=chain, addons=sqlite_options(directory / "s.db")
        )
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._running: AbstractAsyncContextManager[Gateway] = running_gateway(self.config)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the gateway's loop (e.g. on its store) and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def __enter__(self) -> BackgroundGateway:
        self._thread.start()
        self.gateway = self.run(self._running.__aenter__())
        self.url = gateway_url(self.gateway)
        self.store = store_of(self.gateway)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.run(self._running.__aexit__(None, None, None))
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            self.loop.close()


@pytest.fixture
def background_gateway(tmp_path: Path) -> Iterator[BackgroundGateway]:
    with BackgroundGateway(tmp_path / "gw") as gw:
        yield gw
