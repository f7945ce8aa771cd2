"""Retries: idempotent requests retry on 5xx, 429, timeouts and lost connections, with the injected backoff and the
server's Retry-After; non-idempotent ones never retry; a gateway restarted on the same port and database is
picked up by a client that was retrying."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest
from aiohttp import web

from agl_lite.client import (
    AglLiteClient,
    ConnectionFailed,
    RateLimitedError,
    RequestTimeout,
    RetryPolicy,
    Timeouts,
    UnavailableError,
)
from agl_lite.core.server import Gateway
from agl_lite.service import running_gateway
from agl_lite.store.rules import RolloutSpec
from agl_lite.testing.gateway import write_config
from agl_lite.testing.servers import serve_app
from tests.client.conftest import CHAIN, NO_UPSTREAM, sqlite_options
from tests.conftest import ADMIN_KEY, gateway_url


class Flaky:
    """A server whose first `failures` answers are `status` (with Retry-After), then 200 `{"models": []}`."""

    def __init__(self, failures: int, status: int = 503, retry_after: str | None = "2") -> None:
        self.failures, self.status, self.retry_after = failures, status, retry_after
        self.hits = 0

    async def handle(self, request: web.Request) -> web.Response:
        self.hits += 1
        if self.hits <= self.failures:
            headers = {"Retry-After": self.retry_after} if self.retry_after else {}
            kind = "rate_limited" if self.status == 429 else "service_unavailable"
            return web.json_response(
                {"error": {"type": kind, "message": "busy"}}, status=self.status, headers=headers
            )
        return web.json_response({"models": [], "rollouts": []})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app


class Sleeps:
    """The injected backoff: records each delay and returns at once."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        await asyncio.sleep(0)


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


async def test_get_is_retried_on_503_honouring_retry_after(sleeps: Sleeps) -> None:
    flaky = Flaky(failures=2)
    async with serve_app(flaky.app()) as url, AglLiteClient(url, "k", retry=RetryPolicy(sleep=sleeps)) as c:
        assert await c.models() == []
    assert (flaky.hits, sleeps.delays) == (3, [2.0, 2.0])


async def test_get_is_retried_on_429_with_backoff_when_no_retry_after(sleeps: Sleeps) -> None:
    flaky = Flaky(failures=2, status=429, retry_after=None)
    policy = RetryPolicy(base_s=0.5, jitter=0.0, sleep=sleeps)
    async with serve_app(flaky.app()) as url, AglLiteClient(url, "k", retry=policy) as c:
        assert await c.models() == []
    assert sleeps.delays == [0.5, 1.0]


async def test_retries_are_bounded(sleeps: Sleeps) -> None:
    flaky = Flaky(failures=100, status=429)
    async with (
        serve_app(flaky.app()) as url,
        AglLiteClient(url, "k", retry=RetryPolicy(3, sleep=sleeps)) as c,
    ):
        with pytest.raises(RateLimitedError):
            await c.models()
    assert flaky.hits == 3


async def test_a_non_idempotent_call_is_never_retried(sleeps: Sleeps) -> None:
    flaky = Flaky(failures=1)
    async with serve_app(flaky.app()) as url, AglLiteClient(url, "k", retry=RetryPolicy(sleep=sleeps)) as c:
        with pytest.raises(UnavailableError) as info:
            await c.claim("runner", 1)
    assert (flaky.hits, sleeps.delays, info.value.retry_after) == (1, [], 2.0)


async def test_an_unreachable_server_is_connection_failed_after_the_retries(
    sleeps: Sleeps, unused_tcp_port: int
) -> None:
    policy = RetryPolicy(attempts=4, base_s=1.0, jitter=0.0, sleep=sleeps)
    async with AglLiteClient(f"http://127.0.0.1:{unused_tcp_port}", "k", retry=policy) as c:
        with pytest.raises(ConnectionFailed, match="cannot reach"):
            await c.models()
        assert sleeps.delays == [1.0, 2.0, 4.0]
        with pytest.raises(ConnectionFailed):
            await c.claim("runner", 1)
        assert len(sleeps.delays) == 3  # the claim was not retried


async def test_a_silent_server_is_a_request_timeout() -> None:
    never = asyncio.Event()

    async def hang(_: web.Request) -> web.Response:
        await never.wait()
        raise AssertionError("unreachable")

    app = web.Application()
    app.router.add_get("/api/models", hang)
    async with (
        serve_app(app) as url,
        AglLiteClient(url, "k", timeouts=Timeouts(read_s=0.05), retry=RetryPolicy(attempts=1)) as c,
    ):
        with pytest.raises(RequestTimeout):
            await c.models()


# --- a restarted gateway ---------------------------------------------------------------------------------------


class Restarts:
    """Starts a second gateway on the first one's port and database when the client's backoff runs `on`."""

    def __init__(self, directory: Path, port: int, on: int) -> None:
        db = directory / "store.db"
        self.config = write_config(
            directory / "second",
            NO_UPSTREAM,
            chain=CHAIN,
            addons=sqlite_options(db),
            extra={"server": {"port": port}},
        )
        self.on = on
        self.delays: list[float] = []
        self.running: AbstractAsyncContextManager[Gateway] | None = None

    async def sleep(self, delay: float) -> None:
        self.delays.append(delay)
        if len(self.delays) == self.on:
            self.running = running_gateway(self.config)
            await self.running.__aenter__()


class FirstGateway:
    """The gateway the client first talks to; stopped by the test (or at teardown if the test failed first)."""

    def __init__(self, directory: Path) -> None:
        config = write_config(
            directory / "first", NO_UPSTREAM, chain=CHAIN, addons=sqlite_options(directory / "store.db")
        )
        self._running: AbstractAsyncContextManager[Gateway] | None = running_gateway(config)

    async def start(self) -> Gateway:
        assert self._running is not None
        return await self._running.__aenter__()

    async def stop(self) -> None:
        running, self._running = self._running, None
        if running is not None:
            await running.__aexit__(None, None, None)


@pytest.fixture
async def first_gateway(tmp_path: Path) -> AsyncIterator[FirstGateway]:
    first = FirstGateway(tmp_path)
    yield first
    await first.stop()


@pytest.fixture
async def restarts() -> AsyncIterator[list[Restarts]]:
    made: list[Restarts] = []
    yield made
    for r in made:
        if r.running is not None:
            await r.running.__aexit__(None, None, None)


async def test_client_retrying_through_a_restart_reads_what_was_written_before(
    tmp_path: Path, first_gateway: FirstGateway, restarts: list[Restarts]
) -> None:
    gw = await first_gateway.start()
    restart = Restarts(tmp_path, gw.port, on=2)
    restarts.append(restart)
    async with AglLiteClient(gateway_url(gw), ADMIN_KEY, retry=RetryPolicy(sleep=restart.sleep)) as c:
        (before,) = await c.enqueue([RolloutSpec({"q": 1})])
        await first_gateway.stop()
        again = await c.get_rollout(before.id)  # fails twice, then the second gateway answers
    assert (again.id, again.input) == (before.id, {"q": 1})
    assert len(restart.delays) == 2


async def test_enqueue_retried_through_a_restart_creates_each_rollout_once(
    tmp_path: Path, first_gateway: FirstGateway, restarts: list[Restarts]
) -> None:
    gw = await first_gateway.start()
    restart = Restarts(tmp_path, gw.port, on=1)
    restarts.append(restart)
    async with AglLiteClient(gateway_url(gw), ADMIN_KEY, retry=RetryPolicy(sleep=restart.sleep)) as c:
        await first_gateway.stop()
        created = await c.enqueue([RolloutSpec({"q": i}) for i in range(3)])
        assert [r.input for r in await c.list_rollouts()] == [r.input for r in created]
    assert len(restart.delays) == 1
