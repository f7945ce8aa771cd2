"""The commit point: a captured call is durable before its client sees the end of the response."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest

from agl_lite.core.services import LoadContext
from agl_lite.store.memory import MemoryRepo, MemoryStore
from agl_lite.store.records import CallOutcome
from agl_lite.store.rules import STORE
from agl_lite.store.sqlite import SQLiteStore
from agl_lite.testing import MockVLLM, running_mock
from tests.conftest import ADMIN_KEY, GatewayFactory, gateway_url

T = TypeVar("T")
AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}
BODY = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


class GatedStore(MemoryStore):
    """A memory store whose writes wait until the test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.waiting = asyncio.Event()

    async def _write(self, fn: Callable[[MemoryRepo], T]) -> T:
        self.waiting.set()
        await self.gate.wait()
        return await super()._write(fn)


class ProvideStore:
    """Provides the gated store in place of the `store` addon."""

    def __init__(self, store: GatedStore) -> None:
        self.store = store

    def load(self, ctx: LoadContext) -> None:
        ctx.services.provide(STORE, self.store, by="test")


async def test_done_waits_for_the_commit(gateway_factory: GatewayFactory) -> None:
    store = GatedStore()
    async with (
        running_mock(MockVLLM()) as url,
        gateway_factory(
            {"smollm2": [url]}, chain=("auth", "route", "capture", "sink"), extra_addons=[ProvideStore(store)]
        ) as gw,
    ):
        async with (
            aiohttp.ClientSession() as s,
            s.post(
                gateway_url(gw) + "/v1/chat/completions", json={**BODY, "stream": True}, headers=AUTH
            ) as r,
        ):
            first = await asyncio.wait_for(r.content.readuntil(b"\n\n"), 5)
            assert first.startswith(b"data: {")
            await asyncio.wait_for(store.waiting.wait(), 5)  # the sink is committing
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(r.content.readuntil(b"data: [DONE]"), 0.3)
            store.gate.set()
            rest = await asyncio.wait_for(r.content.read(), 5)
            assert rest.endswith(b"data: [DONE]\n\n")
    (call,) = await store.calls(None)
    assert call.outcome is CallOutcome.OK


GATEWAY_CONFIG = """
routes = "routes.toml"
[server]
port = {port}
[addons]
chain = ["store", "auth", "route", "capture", "sink"]
[addons.store]
path = "calls.db"
"""


async def start_gateway(directory: Path) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agl_lite",
        "run",
        "--config",
        str(directory / "agl-lite.toml"),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "AGL_KEY": ADMIN_KEY},
    )
    assert proc.stderr is not None
    seen = b""
    while b"gateway listening" not in seen:
        line = await asyncio.wait_for(proc.stderr.readline(), 30)
        if not line:
            raise AssertionError(f"gateway exited: {seen.decode()}")
        seen += line
    return proc


@pytest.mark.parametrize("stream", [True, False])
async def test_sigkill_right_after_the_client_got_done_loses_no_record(
    tmp_path: Path, unused_tcp_port: int, stream: bool
) -> None:
    async with running_mock(MockVLLM()) as url:
        (tmp_path / "routes.toml").write_text(f'[models.smollm2]\nupstreams = [{{ base_url = "{url}" }}]\n')
        (tmp_path / "agl-lite.toml").write_text(GATEWAY_CONFIG.format(port=unused_tcp_port))
        gateway = await start_gateway(tmp_path)
        try:
            ids: list[Any] = []
            async with aiohttp.ClientSession() as s:
                for _ in range(5):
                    async with s.post(
                        f"http://127.0.0.1:{unused_tcp_port}/v1/chat/completions",
                        json={**BODY, "stream": stream},
                        headers=AUTH,
                    ) as r:
                        raw = await r.read()
                        assert r.status == 200
                    ids.append(raw)
            gateway.send_signal(signal.SIGKILL)  # at once: nothing gets a chance to flush
        finally:
            if gateway.returncode is None:
                gateway.kill()
            await gateway.wait()
    store = await SQLiteStore.open(tmp_path / "calls.db")
    try:
        calls = await store.calls(None)
    finally:
        await store.close()
    assert len(calls) == 5
    assert all(c.outcome is CallOutcome.OK and c.choices and len(c.choices[0].token_ids) > 0 for c in calls)
