"""The client is a remote Store: the same methods, signatures, records and errors, so a runner written against
`agl_lite.store.rules.Store` runs unchanged against a gateway elsewhere."""

from __future__ import annotations

import inspect
import typing
from typing import Any

import pytest

from agl_lite.client import AglLiteClient, SyncAglLiteClient
from agl_lite.errors import Conflict, NotFound
from agl_lite.store.memory import MemoryStore
from agl_lite.store.records import AttemptStatus, RolloutStatus
from agl_lite.store.rules import EventSpec, RolloutSpec, Store

STORE_METHODS = [
    "enqueue",
    "get_rollout",
    "list_rollouts",
    "cancel",
    "finish",
    "claim",
    "running",
    "completed",
    "start_attempt",
    "update_attempt",
    "attempts",
    "add_events",
    "events",
    "calls",
    "put_resource",
    "get_resource",
    "latest_resources",
    "put_model",
    "models",
    "close",
]


def params(fn: Any) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("name", STORE_METHODS)
def test_client_method_has_the_stores_signature(name: str) -> None:
    ours, theirs = getattr(AglLiteClient, name), getattr(Store, name)
    assert params(ours) == params(theirs)
    assert inspect.iscoroutinefunction(ours)
    returned, expected = typing.get_type_hints(ours)["return"], typing.get_type_hints(theirs)["return"]
    assert returned == expected or issubclass(returned, expected)


@pytest.mark.parametrize("name", [n for n in dir(AglLiteClient) if not n.startswith("_") and n != "url"])
def test_the_sync_twin_has_every_method_with_the_same_parameters(name: str) -> None:
    assert params(getattr(SyncAglLiteClient, name)) == params(getattr(AglLiteClient, name))


async def a_runner_round(store: Any) -> list[Any]:
    """What a runner does, written against the Store interface."""
    await store.enqueue([RolloutSpec({"q": 1}, id="r1")])
    (claimed,) = await store.claim("runner-1", 10)
    attempt = await store.start_attempt(claimed.id, "a1")
    await store.add_events(claimed.id, [EventSpec("reward", {"value": 1.0}, attempt.id)])
    await store.update_attempt(claimed.id, attempt.id, AttemptStatus.SUCCEEDED, exit_code=0)
    done = await store.finish(claimed.id, RolloutStatus.SUCCEEDED)
    rows, cursor = await store.completed(0)
    outcome: list[Any] = [done.status, done.reward, [r.id for r in rows], cursor]
    try:
        await store.cancel("r1")
    except Conflict:
        outcome.append("conflict")
    try:
        await store.get_rollout("nope")
    except NotFound:
        outcome.append("not found")
    return outcome + [(a.id, a.status, a.exit_code) for a in await store.attempts("r1")]


async def test_a_runner_round_is_the_same_in_process_and_remote(client: AglLiteClient) -> None:
    local = await a_runner_round(MemoryStore())
    assert local == [RolloutStatus.SUCCEEDED, 1.0, ["r1"], 1, "conflict", "not found", ("a1", "succeeded", 0)]
    assert await a_runner_round(client) == local
