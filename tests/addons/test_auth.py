from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from agl_lite.addons.auth import Auth
from agl_lite.addons.router import Router
from agl_lite.core.config import GatewayConfig
from agl_lite.core.contract import KeyRole, derive_key
from agl_lite.core.flow import Flow
from agl_lite.errors import ConfigError, Forbidden, Unauthorized
from agl_lite.store import rules
from agl_lite.store.rules import RolloutSpec
from agl_lite.store.sqlite import SQLiteStore
from agl_lite.testing.flows import make_flow
from tests.conftest import ADMIN_KEY
from tests.store.test_rules import running_rollout

AGENT_PATH = "/r/ro-1/a/at-1/v1/chat/completions"


def auth() -> Auth:
    addon = Auth()
    addon.configure(GatewayConfig(), Auth.Options())
    return addon


def flow(path: str, headers: dict[str, str] | None = None) -> Flow:
    return make_flow("POST", path, json_body={"model": "m"}, headers=headers, routes=Router.routes)


async def test_admin_key_passes_on_bare_path() -> None:
    f = flow("/v1/chat/completions", {"Authorization": f"Bearer {ADMIN_KEY}"})
    await auth().request_headers(f)
    assert f.metadata["auth.role"] is KeyRole.ADMIN
    assert "auth.rollout_id" not in f.metadata


async def test_agent_key_attributes_the_call() -> None:
    f = flow(AGENT_PATH, {"Authorization": f"Bearer {derive_key(ADMIN_KEY, 'ro-1')}"})
    await auth().request_headers(f)
    assert f.metadata["auth.role"] is KeyRole.AGENT
    assert (f.metadata["auth.rollout_id"], f.metadata["auth.attempt_id"]) == ("ro-1", "at-1")


async def test_x_api_key_header_is_accepted() -> None:
    f = flow(AGENT_PATH, {"x-api-key": derive_key(ADMIN_KEY, "ro-1")})
    await auth().request_headers(f)
    assert f.metadata["auth.role"] is KeyRole.AGENT


async def test_missing_key_is_401() -> None:
    with pytest.raises(Unauthorized, match="missing API key"):
        await auth().request_headers(flow(AGENT_PATH))


async def test_invalid_key_is_401_and_message_does_not_echo_it() -> None:
    with pytest.raises(Unauthorized) as info:
        await auth().request_headers(flow(AGENT_PATH, {"Authorization": "Bearer sk-secret-guess"}))
    assert "sk-secret-guess" not in json.dumps(info.value.body())


async def test_another_rollouts_key_is_403() -> None:
    with pytest.raises(Forbidden, match="another rollout"):
        await auth().request_headers(
            flow(AGENT_PATH, {"Authorization": f"Bearer {derive_key(ADMIN_KEY, 'ro-2')}"})
        )


async def test_agent_key_on_admin_route_is_403() -> None:
    with pytest.raises(Forbidden, match="needs the admin key"):
        await auth().request_headers(
            flow("/v1/chat/completions", {"Authorization": f"Bearer {derive_key(ADMIN_KEY, 'ro-1')}"})
        )


async def test_grader_key_on_agent_route_is_403() -> None:
    key = derive_key(ADMIN_KEY, "ro-1", KeyRole.GRADER)
    with pytest.raises(Forbidden, match="grader key cannot call"):
        await auth().request_headers(flow(AGENT_PATH, {"Authorization": f"Bearer {key}"}))


async def test_public_route_needs_no_key() -> None:
    f = make_flow("GET", "/healthz")
    await auth().request_headers(f)
    assert f.response is None


def test_missing_admin_key_stops_start_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGL_KEY")
    with pytest.raises(ConfigError, match="export AGL_KEY="):
        Auth().configure(GatewayConfig(), Auth.Options())


def test_short_admin_key_stops_start_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGL_KEY", "short")
    with pytest.raises(ConfigError, match="too short"):
        Auth().configure(GatewayConfig(), Auth.Options())


def _auth_on(store: SQLiteStore) -> Auth:
    """Auth as `configure` leaves it with a store in the chain, told of the rollouts' ends."""
    auth = Auth()
    auth.configure(GatewayConfig(), Auth.Options())
    auth.store = store
    store.on_rollout_ended(auth._rollout_ended)
    return auth


def _first_call(rollout_id: str) -> Flow:
    """An agent's LLM call, as attempt at-1 of `rollout_id`."""
    return make_flow(
        "POST",
        f"/r/{rollout_id}/a/at-1/v1/chat/completions",
        json_body={"model": "m"},
        headers={"Authorization": f"Bearer {derive_key(ADMIN_KEY, rollout_id)}"},
        routes=Router.routes,
    )


async def test_a_call_whose_gate_commits_with_its_rollouts_end_is_refused(tmp_path: Path) -> None:
    """An attempt's first call and the rollout's end in one group commit: the end's listeners (which cut the
    rollout's calls in flight) ran before the call was in flight, so it was admitted after the end and never cut."""
    store = await SQLiteStore.open(tmp_path / "store.db")
    try:
        await running_rollout(store, "ro-1")
        auth, flow = _auth_on(store), _first_call("ro-1")
        calling = asyncio.ensure_future(auth.request_headers(flow))  # at-1's first call: a gate write
        cancelling = asyncio.ensure_future(store.cancel("ro-1"))  # the trainer, in the same group commit
        await cancelling
        with pytest.raises(Forbidden, match="ended as this call was let in"):
            await calling
        assert "auth.role" not in flow.metadata  # refused: capture records nothing of it
        assert not auth._in_flight
    finally:
        await store.close()


async def test_a_call_whose_gate_commits_with_its_rollouts_end_is_refused_when_the_store_forgot_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, with a third write in the same group commit (another rollout's end) that takes the store's caches
    past their bound: they are dropped, the ended rollout's state with them, before the gate's caller resumes."""
    store = await SQLiteStore.open(tmp_path / "store.db")
    try:
        await store.enqueue([RolloutSpec(input={}, id=r) for r in ("ro-1", "ro-2")])
        await store.claim("runner", 10)
        del store._status["ro-2"]  # the cache holds ro-1 only ...
        monkeypatch.setattr(rules, "_KEPT", len(store._status))  # ... and is full
        auth, flow = _auth_on(store), _first_call("ro-1")
        calling = asyncio.ensure_future(auth.request_headers(flow))  # at-1's first call: a gate write
        ending = asyncio.ensure_future(store.cancel("ro-1"))  # in the same group commit
        forgetting = asyncio.ensure_future(store.cancel("ro-2"))  # too: its state is one past the bound
        await ending
        await forgetting
        with pytest.raises(Forbidden, match="cancelled"):
            await calling
        assert not auth._in_flight
    finally:
        await store.close()
