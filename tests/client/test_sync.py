"""SyncAglLiteClient: the same calls, blocking, from plain code or from a thread that already runs a loop."""

from __future__ import annotations

import pytest

from agl_lite.client import NotFoundError, SyncAglLiteClient
from agl_lite.store.records import RolloutStatus
from tests.client.conftest import FAST, BackgroundGateway, make_call
from tests.conftest import ADMIN_KEY


@pytest.fixture
def client(background_gateway: BackgroundGateway) -> SyncAglLiteClient:
    with SyncAglLiteClient(background_gateway.url, ADMIN_KEY, retry=FAST) as c:
        yield c  # type: ignore[misc]


def test_a_training_round_blocking(client: SyncAglLiteClient, background_gateway: BackgroundGateway) -> None:
    (group,) = client.enqueue_group([{"q": 1}], n=2)
    claimed = client.claim("runner", 10)
    for rollout in claimed:
        attempt = client.start_attempt(rollout.id)
        background_gateway.run(
            background_gateway.store.add_call(make_call(rollout.id, attempt.id, 0, [1, 2], [[3]]))
        )
        client.finish(rollout.id, RolloutStatus.SUCCEEDED)
    result = client.wait([r.id for r in group], timeout=10)
    assert result.done
    for rollout in result.rollouts:
        client.reward(rollout.id, 1.0)
    assert [c.prompt_token_ids.tolist() for c in client.iter_calls(group[0].id)] == [[1, 2]]  # type: ignore[union-attr]
    assert [r.reward for r in client.iter_rollouts()] == [1.0, 1.0]
    with client.paused() as state:
        assert state.paused
    assert client.gateway_state().paused is False


def test_completions_is_a_plain_iterator(
    client: SyncAglLiteClient, background_gateway: BackgroundGateway
) -> None:
    (group,) = client.enqueue_group([{"q": 1}], n=3)
    client.claim("runner", 3)
    for rollout in reversed(group):
        client.finish(rollout.id, RolloutStatus.FAILED)
    seen = []
    for rollout in client.completions(poll_s=5):
        seen.append(rollout.id)
        if len(seen) == 3:
            break
    assert seen == [r.id for r in reversed(group)]


def test_errors_are_the_same_typed_errors(client: SyncAglLiteClient) -> None:
    with pytest.raises(NotFoundError):
        client.get_rollout("nope")


async def test_it_works_from_a_thread_that_runs_a_loop(background_gateway: BackgroundGateway) -> None:
    # A notebook cell: the caller's loop is running; the client blocks on its own loop, not this one.
    with SyncAglLiteClient(background_gateway.url, ADMIN_KEY) as c:
        assert c.health() == {"status": "ok"}


def test_a_closed_client_says_so(background_gateway: BackgroundGateway) -> None:
    c = SyncAglLiteClient(background_gateway.url, ADMIN_KEY)
    c.close()
    c.close()
    with pytest.raises(RuntimeError, match="closed"):
        c.models()


def test_the_twin_has_every_method_of_the_async_client_with_its_signature() -> None:
    """Each blocking method is the async client's own, wrapped: a method added there and forgotten here fails."""
    import inspect

    from agl_lite.client.client import AglLiteClient

    public = {n for n, v in vars(AglLiteClient).items() if not n.startswith("_") and inspect.isfunction(v)}
    assert public - {"close", "paused"} <= set(vars(SyncAglLiteClient))
    for name in public - {"close", "paused"}:
        twin, own = (inspect.signature(getattr(c, name)) for c in (SyncAglLiteClient, AglLiteClient))
        assert twin.parameters == own.parameters, name
        assert getattr(SyncAglLiteClient, name).__qualname__ == f"SyncAglLiteClient.{name}"
