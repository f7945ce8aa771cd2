"""A fake cluster per test with short injected timings, and the real `kubernetes` clients pointed at it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import kubernetes.aio.client
import kubernetes.client
import pytest

from agl_fake_k8s import FakeK8s, FakeK8sConfig, Timings, running_fake_k8s

FAST = Timings(time_scale=0.02)
"""Every duration read from an object runs 50 times faster: a 30 s grace period takes 0.6 s."""


@pytest.fixture
async def k8s() -> AsyncIterator[FakeK8s]:
    async with running_fake_k8s(FakeK8sConfig(timings=FAST)) as fake:
        yield fake


@pytest.fixture
async def aio(k8s: FakeK8s) -> AsyncIterator[kubernetes.aio.client.ApiClient]:
    """The asyncio client (`kubernetes.aio`), as the runner uses it."""
    async with kubernetes.aio.client.ApiClient(k8s.aio_api_client_config()) as api:
        yield api


@pytest.fixture
def sync_api(k8s: FakeK8s) -> kubernetes.client.ApiClient:
    """The synchronous client; call it through asyncio.to_thread, the server shares the test's event loop."""
    return kubernetes.client.ApiClient(k8s.api_client_config())
