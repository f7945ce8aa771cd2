"""`paused()` around a weight sync: pause (hold), drain the calls in flight, run the block, resume on the way out."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

from agl_lite.addons import DEFAULT_CHAIN
from agl_lite.addons.control import Control
from agl_lite.client import AglLiteClient, DrainTimeout, GatewayState
from agl_lite.testing import MockVLLM, Scenario, running_mock
from tests.client.conftest import FAST, sqlite_options
from tests.conftest import ADMIN_KEY, GatewayFactory, gateway_url

MESSAGES = [{"role": "user", "content": "hi"}]


@dataclass
class Setup:
    client: AglLiteClient
    control: Control
    mock: MockVLLM
    sdk: openai.AsyncOpenAI

    async def open_stream(self) -> Any:
        """A streamed call that is in flight (first chunk read) until closed."""
        self.mock.enqueue(Scenario(stall_after=2))
        stream = await self.sdk.chat.completions.create(model="smollm2", messages=MESSAGES, stream=True)
        async for _ in stream:
            break
        return stream


@pytest.fixture
async def setup(gateway_factory: GatewayFactory, tmp_path: Path) -> AsyncIterator[Setup]:
    mock = MockVLLM(("smollm2",))
    async with (
        running_mock(mock) as url,
        gateway_factory(
            {"smollm2": [url]},
            chain=tuple(n for n in DEFAULT_CHAIN if n != "metrics"),
            addons=sqlite_options(tmp_path / "s.db"),
        ) as gw,
        AglLiteClient(gateway_url(gw), ADMIN_KEY, retry=FAST) as client,
        openai.AsyncOpenAI(base_url=gateway_url(gw) + "/v1", api_key=ADMIN_KEY, max_retries=0) as sdk,
    ):
        (control,) = [a.addon for a in gw.addons.addons if isinstance(a.addon, Control)]
        yield Setup(client, control, mock, sdk)


async def test_the_block_runs_only_once_the_call_in_flight_is_done(setup: Setup) -> None:
    stream = await setup.open_stream()
    inside: list[GatewayState] = []

    async def sync_weights() -> None:
        async with setup.client.paused(drain_timeout_s=10) as state:
            inside.append(state)
            assert setup.control.paused

    syncing = asyncio.ensure_future(sync_weights())
    await setup.control.wait_until(lambda c: c.paused, timeout=5)
    done, _ = await asyncio.wait({syncing}, timeout=0.1)
    assert not done  # still draining: the stream is in flight
    assert not inside
    await stream.close()
    await asyncio.wait_for(syncing, 5)
    assert (inside[0].paused, inside[0].in_flight) == (True, 0)
    assert not setup.control.paused


async def test_calls_arriving_during_the_block_are_held_then_served(setup: Setup) -> None:
    async with setup.client.paused(hold_timeout_s=30):
        call = asyncio.ensure_future(
            setup.sdk.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=3)
        )
        await setup.control.wait_until(lambda c: c.held == 1, timeout=5)
        assert setup.mock.requests_total == 0
    completion = await asyncio.wait_for(call, 5)
    assert completion.choices


async def test_the_gateway_resumes_when_the_block_raises(setup: Setup) -> None:
    with pytest.raises(RuntimeError, match="sync failed"):
        async with setup.client.paused():
            raise RuntimeError("sync failed")
    assert not setup.control.paused


async def test_a_drain_that_times_out_raises_and_resumes(setup: Setup) -> None:
    stream = await setup.open_stream()
    with pytest.raises(DrainTimeout) as info:
        async with setup.client.paused(drain_timeout_s=0.05):
            raise AssertionError("the block must not run")
    assert info.value.in_flight == 1
    assert not setup.control.paused
    await stream.close()


async def test_without_require_drained_the_block_runs_anyway(setup: Setup) -> None:
    stream = await setup.open_stream()
    async with setup.client.paused(drain_timeout_s=0.05, require_drained=False) as state:
        assert state.in_flight == 1
    await stream.close()
