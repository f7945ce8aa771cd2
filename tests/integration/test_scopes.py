"""Walks the route table of the default chain: every route × every kind of key gets what its scope says."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from agl_lite.addons import ADDONS, DEFAULT_CHAIN
from agl_lite.core.contract import KeyRole, derive_key
from agl_lite.core.routes import HttpRoute, Scope
from agl_lite.core.server import Gateway
from agl_lite.store.rules import STORE, RolloutSpec
from agl_lite.testing.servers import serve_app
from tests.conftest import ADMIN_KEY, GatewayFactory, gateway_url

ROLLOUT, OTHER = "ro-1", "ro-2"

KEYS: dict[str, str | None] = {
    "none": None,
    "wrong": "agl-agent.ro-1.not-a-valid-signature",
    "agent": derive_key(ADMIN_KEY, ROLLOUT, KeyRole.AGENT),
    "grader": derive_key(ADMIN_KEY, ROLLOUT, KeyRole.GRADER),
    "admin": ADMIN_KEY,
    "other_rollout": derive_key(ADMIN_KEY, OTHER, KeyRole.AGENT),
}

ALLOWED = "allowed"
SESSION_CHECK = "the addon's session check"
"""No key on a `session` route: auth lets it through, and the addon answers without a session (the dashboard: a
redirect to its login form, or 401 on the JSON its page script asks for)."""
EXPECTED: dict[Scope, dict[str, int | str]] = {
    Scope.PUBLIC: dict.fromkeys(KEYS, ALLOWED),
    Scope.ADMIN: {
        "none": 401,
        "wrong": 401,
        "agent": 403,
        "grader": 403,
        "admin": ALLOWED,
        "other_rollout": 403,
    },
    Scope.SESSION: {
        "none": SESSION_CHECK,
        "wrong": 401,
        "agent": 403,
        "grader": 403,
        "admin": ALLOWED,
        "other_rollout": 403,
    },
    Scope.AGENT: {
        "none": 401,
        "wrong": 401,
        "agent": ALLOWED,
        "grader": 403,
        "admin": ALLOWED,
        "other_rollout": 403,
    },
    Scope.GRADER: {
        "none": 401,
        "wrong": 401,
        "agent": 403,
        "grader": ALLOWED,
        "admin": ALLOWED,
        "other_rollout": 403,
    },
}


@pytest.fixture
async def gateway(gateway_factory: GatewayFactory) -> AsyncIterator[Gateway]:
    async def anything(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", anything)
    chain = DEFAULT_CHAIN
    assert set(chain) == set(ADDONS) - {"runner"}  # every built-in addon with routes (the runner has none)
    async with (
        serve_app(app) as upstream,
        gateway_factory(
            {"m": [upstream + "/v1"]}, chain=chain, addons={"store": {"backend": "memory"}}
        ) as gw,
    ):
        store = gw.addons.ctx.services.require(STORE, by="test")
        await store.enqueue([RolloutSpec(input={"q": 1}, id=ROLLOUT), RolloutSpec(input={"q": 2}, id=OTHER)])
        await store.claim("test", 2)  # running: agent and grader keys work only then
        yield gw


def concrete(route: HttpRoute) -> str:
    path = route.path.replace("{rollout_id}", ROLLOUT).replace("{attempt_id}", "at-1")
    return re.sub(r"\{\w+\}", "p1", path)


async def test_every_route_and_key_gets_the_status_its_scope_says(gateway: Gateway) -> None:
    assert {r.scope for r in gateway.table.routes} == set(Scope)
    failures = []
    async with aiohttp.ClientSession() as s:
        for route in gateway.table.routes:
            for key_name, key in KEYS.items():
                headers = {"Authorization": f"Bearer {key}"} if key else {}
                # valid for an LLM call, rejected (400, nothing changed) by every API payload model
                body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "prompt": "x"}
                async with s.request(
                    route.method,
                    gateway_url(gateway) + concrete(route),
                    json=body,
                    headers=headers,
                    allow_redirects=False,
                ) as r:
                    expected = EXPECTED[route.scope][key_name]
                    got: int | str = ALLOWED if r.status not in (401, 403) else r.status
                    if expected == SESSION_CHECK and r.status in (303, 401):
                        got = SESSION_CHECK
                    if r.status in (401, 403):
                        # (Anthropic routes answer in Anthropic's error types; Responses routes as OpenAI does,
                        # with the gateway's type as the code)
                        error = (await r.json())["error"]
                        assert (
                            error.get("code")
                            if route.name.startswith("responses")
                            else error["type"]
                            in (
                                "unauthorized",
                                "forbidden",
                                "authentication_error",
                                "permission_error",
                            )
                        )
                    if got != expected:
                        failures.append(
                            f"{route.method} {route.path} with {key_name} key: {r.status}, want {expected}"
                        )
    assert failures == []
