"""The runner protocol is a part of the Store interface: the in-process store and the HTTP client both are one,
method for method, and only the in-process store offers the enqueue signal."""

from __future__ import annotations

import inspect
import typing

import pytest

from agl_lite.client import AglLiteClient
from agl_lite.runner.seams import EnqueueSignal, RunnerStore
from agl_lite.store.memory import MemoryStore
from agl_lite.store.rules import RolloutSpec, Store
from tests.conftest import ADMIN_KEY, GatewayFactory, gateway_url

PROTOCOL_METHODS = sorted(
    name for name, member in vars(RunnerStore).items() if inspect.iscoroutinefunction(member)
)


def params(fn: typing.Any) -> list[tuple[str, typing.Any, typing.Any]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_the_protocol_covers_what_a_runner_does() -> None:
    assert PROTOCOL_METHODS == [
        "claim",
        "completed",
        "finish",
        "get_rollout",
        "running",
        "start_attempt",
        "update_attempt",
    ]


@pytest.mark.parametrize("impl", [Store, AglLiteClient])
@pytest.mark.parametrize("name", PROTOCOL_METHODS)
def test_both_stores_implement_each_method_with_its_signature(impl: type, name: str) -> None:
    ours, theirs = getattr(RunnerStore, name), getattr(impl, name)
    assert params(theirs) == params(ours)
    assert inspect.iscoroutinefunction(theirs)
    want, got = typing.get_type_hints(ours)["return"], typing.get_type_hints(theirs)["return"]
    assert got == want or issubclass(got, want)


async def test_only_the_in_process_store_offers_the_enqueue_signal() -> None:
    assert isinstance(MemoryStore(), EnqueueSignal)
    async with AglLiteClient("http://127.0.0.1:9", "k" * 20) as client:
        assert not isinstance(client, EnqueueSignal)


async def a_follower_start(store: typing.Any) -> list[int]:
    """What the runner's cancel watch does first: learn the head of the completion cursor."""
    heads = [(await store.completed(0, 0))[1]]
    await store.enqueue([RolloutSpec({}, id="a"), RolloutSpec({}, id="b")])
    await store.cancel("a")
    await store.cancel("b")
    rows, head = await store.completed(0, 0, wait=5.0)  # no rows, and no waiting
    return [*heads, head, len(rows)]


async def test_limit_zero_gives_the_head_of_the_completion_cursor_in_process_and_over_http(
    gateway_factory: GatewayFactory,
) -> None:
    assert await a_follower_start(MemoryStore()) == [0, 2, 0]
    chain = ("store", "auth", "store_api")
    async with (
        gateway_factory({}, chain=chain, addons={"store": {"backend": "memory"}}) as gw,
        AglLiteClient(gateway_url(gw), ADMIN_KEY) as client,
    ):
        assert await a_follower_start(client) == [0, 2, 0]


async def test_the_enqueue_signal_is_set_by_the_next_enqueue_only() -> None:
    store = MemoryStore()
    before = store.enqueued()
    assert not before.is_set()
    await store.enqueue([RolloutSpec({}, id="a")])
    assert before.is_set()
    assert not store.enqueued().is_set()  # a fresh one for the next wait
