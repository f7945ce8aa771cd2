"""Watches through the real clients: `kubernetes.watch.Watch` (sync, in a thread) and `kubernetes.aio.watch`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import kubernetes.aio.client
import kubernetes.aio.watch
import kubernetes.client
import kubernetes.watch
import pytest
from kubernetes.aio.client import CoreV1Api

from agl_fake_k8s import FakeK8s
from agl_fake_k8s.manifests import secret_manifest


def secret(name: str, **labels: str) -> dict[str, Any]:
    manifest = secret_manifest(name, {"k": "v"})
    manifest["metadata"]["labels"] = labels
    return manifest


def sync_events(
    api: kubernetes.client.ApiClient, count: int | None = None, **kwargs: Any
) -> list[tuple[str, str]]:
    """(type, name) of the first `count` events of a sync watch of secrets (all of them, given timeout_seconds)."""
    watch = kubernetes.watch.Watch()
    events = []
    for event in watch.stream(kubernetes.client.CoreV1Api(api).list_namespaced_secret, "default", **kwargs):
        events.append((event["type"], event["object"].metadata.name if event["type"] != "BOOKMARK" else ""))
        if len(events) == count:
            watch.stop()
    return events


@asynccontextmanager
async def raw_watch(k8s: FakeK8s, query: str) -> AsyncIterator[aiohttp.StreamReader]:
    """A watch of secrets over plain HTTP, to see the stream's bytes and how it ends."""
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {k8s.token}"}) as session:
        async with session.get(f"{k8s.url}/api/v1/namespaces/default/secrets?watch=true&{query}") as response:
            assert response.status == 200
            yield response.content


async def test_a_watch_without_resource_version_starts_with_the_current_state(
    k8s: FakeK8s, sync_api: kubernetes.client.ApiClient
) -> None:
    k8s.create("secrets", "default", secret("a"))
    k8s.create("secrets", "default", secret("b"))
    events = await asyncio.to_thread(sync_events, sync_api, 2)
    assert events == [("ADDED", "a"), ("ADDED", "b")]


async def test_a_watch_from_a_resource_version_replays_what_came_after_it(
    k8s: FakeK8s, sync_api: kubernetes.client.ApiClient
) -> None:
    k8s.create("secrets", "default", secret("before"))
    rv = str(k8s.resource_version)
    k8s.create("secrets", "default", secret("after"))
    await asyncio.to_thread(
        kubernetes.client.CoreV1Api(sync_api).delete_namespaced_secret, "before", "default"
    )
    events = await asyncio.to_thread(sync_events, sync_api, 2, resource_version=rv)
    assert events == [("ADDED", "after"), ("DELETED", "before")]


async def test_an_expired_resource_version_raises_410_in_the_sync_client(
    k8s: FakeK8s, sync_api: kubernetes.client.ApiClient
) -> None:
    k8s.create("secrets", "default", secret("a"))
    k8s.compact_history()
    with pytest.raises(kubernetes.client.ApiException) as raised:
        await asyncio.to_thread(sync_events, sync_api, resource_version="1", timeout_seconds=5)  # no retry
    assert raised.value.status == 410
    assert "Expired: too old resource version: 1" in str(raised.value.reason)


async def test_a_forced_expiry_hits_only_the_next_watch_with_a_resource_version(k8s: FakeK8s) -> None:
    k8s.create("secrets", "default", secret("a"))
    k8s.expire_next_watches(1)
    async with raw_watch(k8s, "timeoutSeconds=1") as fresh:  # no resourceVersion: not affected
        assert json.loads(await fresh.readline())["type"] == "ADDED"
    async with raw_watch(k8s, f"resourceVersion={k8s.resource_version}") as expired:
        line = json.loads(await expired.readline())
        assert (line["type"], line["object"]["code"], line["object"]["reason"]) == ("ERROR", 410, "Expired")
        assert await expired.read() == b""  # and the stream ends
    async with raw_watch(k8s, f"resourceVersion={k8s.resource_version}") as again:
        await k8s.wait_for(lambda: k8s.open_watches == 1)
        k8s.drop_watches()
        assert await again.read() == b""  # the fault is used up: no ERROR this time


async def test_objects_entering_and_leaving_a_selector_are_added_and_deleted(
    k8s: FakeK8s, aio: kubernetes.aio.client.ApiClient
) -> None:
    core = CoreV1Api(aio)
    await core.create_namespaced_secret("default", secret("s", tier="a"))
    watch = kubernetes.aio.watch.Watch()
    events: list[tuple[str, str]] = []

    async def collect() -> None:
        async for event in watch.stream(
            core.list_namespaced_secret, "default", label_selector="tier in (b,c)", timeout_seconds=5
        ):
            events.append((event["type"], event["object"].metadata.labels["tier"]))
            if len(events) == 3:
                watch.stop()
                return

    task = asyncio.ensure_future(collect())
    await k8s.wait_for(lambda: k8s.open_watches == 1)
    for tier in ("b", "c", "d"):
        await core.patch_namespaced_secret("s", "default", {"metadata": {"labels": {"tier": tier}}})
    await asyncio.wait_for(task, 5)
    assert events == [("ADDED", "b"), ("MODIFIED", "c"), ("DELETED", "c")]  # DELETED carries the last match


async def test_a_field_selector_on_the_name_watches_one_object(
    k8s: FakeK8s, sync_api: kubernetes.client.ApiClient
) -> None:
    for name in ("x", "y"):
        k8s.create("secrets", "default", secret(name))
    events = await asyncio.to_thread(sync_events, sync_api, 1, field_selector="metadata.name=y")
    assert events == [("ADDED", "y")]  # x sorts first: had it leaked, it would be here


async def test_bookmarks_carry_the_current_resource_version(
    k8s: FakeK8s, aio: kubernetes.aio.client.ApiClient
) -> None:
    watch = kubernetes.aio.watch.Watch()
    core = CoreV1Api(aio)
    stream = watch.stream(
        core.list_namespaced_secret, "default", allow_watch_bookmarks=True, timeout_seconds=5
    )
    first = asyncio.ensure_future(stream.__anext__())
    await k8s.wait_for(lambda: k8s.open_watches == 1)
    k8s.create("secrets", "default", secret("a"))
    assert (await first)["type"] == "ADDED"
    assert k8s.send_bookmarks() == 1
    bookmark = await stream.__anext__()
    assert bookmark["type"] == "BOOKMARK"
    assert watch.resource_version == str(k8s.resource_version)
    watch.stop()


async def test_a_clean_drop_ends_the_stream_and_an_abrupt_one_cuts_it(k8s: FakeK8s) -> None:
    async with raw_watch(k8s, "") as first, raw_watch(k8s, "") as second:
        await k8s.wait_for(lambda: k8s.open_watches == 2)
        assert k8s.drop_watches() == 2
        assert (await first.read(), await second.read()) == (b"", b"")
    await k8s.wait_for(lambda: k8s.open_watches == 0)
    assert k8s.watches_opened == 2

    async with raw_watch(k8s, "") as cut:
        await k8s.wait_for(lambda: k8s.open_watches == 1)
        assert k8s.drop_watches(abrupt=True) == 1
        with pytest.raises(aiohttp.ClientPayloadError):
            await cut.read()


async def test_timeout_seconds_ends_a_watch_cleanly(
    k8s: FakeK8s, sync_api: kubernetes.client.ApiClient
) -> None:
    events = await asyncio.to_thread(sync_events, sync_api, timeout_seconds=1, allow_watch_bookmarks=True)
    assert events == [("BOOKMARK", "")]  # a 1.20 server's one bookmark just before the deadline
    assert k8s.open_watches == 0


async def test_send_initial_events_ends_the_initial_state_with_a_bookmark(k8s: FakeK8s) -> None:
    k8s.create("secrets", "default", secret("a"))
    query = "sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan"
    async with raw_watch(k8s, query) as stream:
        added, bookmark = json.loads(await stream.readline()), json.loads(await stream.readline())
    assert (added["type"], added["object"]["metadata"]["name"]) == ("ADDED", "a")
    assert bookmark["type"] == "BOOKMARK"
    assert bookmark["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    assert k8s.requests_by_verb["watch"] == 1
