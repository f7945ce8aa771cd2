"""Upstream.open in isolation: the aiohttp client calls are faked with aioresponses (no sockets needed)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from aioresponses import aioresponses
from yarl import URL

from agl_lite.core.config import UpstreamConfig
from agl_lite.core.flow import Flow, UpstreamTarget
from agl_lite.core.upstream import Upstream
from agl_lite.errors import UpstreamError
from agl_lite.testing.flows import make_flow

A = "http://127.0.0.1:18001/v1/x"
B = "http://127.0.0.1:18002/v1/x"


class Response(aiohttp.ClientResponse):
    """aioresponses 0.7.9 predates aiohttp 3.14's required `stream_writer` argument (its open issue #289)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("stream_writer", SimpleNamespace(output_size=0))
        super().__init__(*args, **kwargs)


class Observer:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, bool | None]] = []

    def attempt_started(self, target: UpstreamTarget) -> None:
        self.events.append(("start", target.name, None))

    def attempt_ended(self, target: UpstreamTarget, *, ok: bool) -> None:
        self.events.append(("end", target.name, ok))


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    up = Upstream(UpstreamConfig())
    await up.start()
    yield up
    await up.close()


def flow_to(*urls: str, observer: Observer | None = None, headers: dict[str, str] | None = None) -> Flow:
    f = make_flow("GET", "/healthz", headers=headers)
    f.upstreams = [UpstreamTarget(URL(u), name=u, observer=observer) for u in urls]
    return f


async def test_connect_failure_moves_on_to_the_next_target(upstream: Upstream) -> None:
    obs = Observer()
    with aioresponses() as fake:
        fake.get(A, exception=aiohttp.ClientConnectionError("refused"))
        fake.get(B, status=200, body=b"ok", response_class=Response)
        resp = await upstream.open(f := flow_to(A, B, observer=obs))
        assert resp.status == 200
    assert f.upstream is not None
    assert f.upstream.name == B
    assert obs.events == [("start", A, None), ("end", A, False), ("start", B, None)]


async def test_retryable_status_moves_on_but_not_past_the_last_target(upstream: Upstream) -> None:
    with aioresponses() as fake:
        fake.get(A, status=503, response_class=Response)
        fake.get(B, status=503, body=b"busy too", response_class=Response)
        resp = await upstream.open(flow_to(A, B))
        assert resp.status == 503  # the last target's answer is relayed as it is
        assert await resp.read() == b"busy too"


async def test_every_target_down_is_an_upstream_error(upstream: Upstream) -> None:
    with aioresponses() as fake:
        fake.get(A, exception=aiohttp.ClientConnectionError("refused"))
        fake.get(B, exception=TimeoutError())
        with pytest.raises(UpstreamError) as info:
            await upstream.open(flow_to(A, B))
    assert info.value.type == "upstream_timeout"


async def test_client_key_and_hop_by_hop_headers_never_go_upstream(upstream: Upstream) -> None:
    headers = {
        "Authorization": "Bearer client-key",
        "x-api-key": "client-key",
        "Connection": "close",
        "Accept-Encoding": "gzip",
        "X-Trace": "t1",
    }
    f = flow_to(A, headers=headers)
    f.upstreams[0].headers = {"Authorization": "Bearer upstream-key"}
    with aioresponses() as fake:
        fake.get(A, status=200, response_class=Response)
        await upstream.open(f)
        ((_, call),) = [(k, v[0]) for k, v in fake.requests.items()]
    sent = dict(call.kwargs["headers"])
    assert sent == {"X-Trace": "t1", "Accept-Encoding": "identity", "Authorization": "Bearer upstream-key"}
