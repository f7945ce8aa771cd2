"""The dashboard addon over HTTP: who may open it (the admin key, a session; never an agent's key), the login and
logout forms with their CSRF tokens and cookies, the headers every page carries, and escaping of what agents
wrote."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from agl_lite.addons import DEFAULT_CHAIN
from agl_lite.addons.dashboard import CSP
from agl_lite.core.contract import derive_key
from agl_lite.core.server import Gateway
from agl_lite.dashboard import pages
from agl_lite.store.records import RolloutStatus
from agl_lite.store.rules import EventSpec
from agl_lite.testing import MockVLLM, running_mock
from tests.client.conftest import NO_UPSTREAM, make_call, running, sqlite_options, store_of
from tests.conftest import ADMIN_KEY, GatewayFactory, gateway_url

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
HOSTILE = '<script>document.title="pwned"</script><img src=x onerror=alert(1)>'


@pytest.fixture
async def gateway(gateway_factory: GatewayFactory, tmp_path: Path) -> AsyncIterator[Gateway]:
    addons = sqlite_options(tmp_path / "store.db")
    async with gateway_factory(NO_UPSTREAM, chain=DEFAULT_CHAIN, addons=addons) as gw:
        yield gw


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as session:
        yield session


async def log_in(http: aiohttp.ClientSession, base: str, key: str = ADMIN_KEY) -> aiohttp.ClientResponse:
    async with http.get(f"{base}/dashboard/login") as form:
        nonce = re.search(r'name="csrf" value="([^"]+)"', await form.text())
    assert nonce is not None
    async with http.post(
        f"{base}/dashboard/login", data={"csrf": nonce[1], "key": key}, allow_redirects=False
    ) as resp:
        await resp.read()
        return resp


async def test_pages_need_the_admin_key_or_a_session_and_refuse_agent_keys(
    gateway: Gateway, http: aiohttp.ClientSession
) -> None:
    base = gateway_url(gateway)
    await running(store_of(gateway), "ro-1")
    async with http.get(f"{base}/dashboard/rollouts", allow_redirects=False) as resp:
        assert (resp.status, resp.headers["Location"]) == (303, "/dashboard/login")
    async with http.get(f"{base}/dashboard/rollouts/completed") as resp:
        assert resp.status == 401
    for key, status in ((derive_key(ADMIN_KEY, "ro-1"), 403), ("not-a-key-at-all-0123456789", 401)):
        async with http.get(f"{base}/dashboard/rollouts", headers={"Authorization": f"Bearer {key}"}) as resp:
            assert resp.status == status
    async with http.get(
        f"{base}/dashboard/rollouts", headers={"Authorization": f"Bearer {ADMIN_KEY}"}
    ) as resp:
        assert resp.status == 200
        assert "ro-1" in await resp.text()


async def test_login_exchanges_the_key_for_an_http_only_strict_cookie_and_logout_needs_its_csrf(
    gateway: Gateway, http: aiohttp.ClientSession
) -> None:
    base = gateway_url(gateway)
    wrong = await log_in(http, base, derive_key(ADMIN_KEY, "ro-1"))  # an agent's key is not the admin key
    assert wrong.status == 401
    ok = await log_in(http, base)
    assert (ok.status, ok.headers["Location"]) == (303, "/dashboard/rollouts")
    cookie = next(c for c in ok.headers.getall("Set-Cookie") if c.startswith("agl_dashboard="))
    assert "HttpOnly" in cookie
    assert "SameSite=Strict" in cookie
    assert "Path=/dashboard" in cookie
    assert ADMIN_KEY not in cookie
    async with http.get(f"{base}/dashboard/rollouts") as page:
        text = await page.text()
        assert page.status == 200
        assert ADMIN_KEY not in text
    csrf = re.search(r'name="csrf" value="([^"]+)"', text)
    assert csrf is not None
    async with http.post(f"{base}/dashboard/logout", data={"csrf": "forged"}, allow_redirects=False) as resp:
        assert resp.status == 400
    async with http.post(f"{base}/dashboard/logout", data={"csrf": csrf[1]}, allow_redirects=False) as resp:
        assert resp.status == 303
    async with http.get(f"{base}/dashboard/rollouts", allow_redirects=False) as resp:
        assert resp.status == 303  # the session is gone


async def test_a_login_form_posted_from_elsewhere_is_refused(gateway: Gateway) -> None:
    base = gateway_url(gateway)
    async with aiohttp.ClientSession() as fresh:  # no login cookie: the form was not this browser's
        async with fresh.post(f"{base}/dashboard/login", data={"csrf": "x", "key": ADMIN_KEY}) as resp:
            assert resp.status == 400
            assert not [c for c in resp.headers.getall("Set-Cookie", []) if c.startswith("agl_dashboard=")]


async def test_every_page_has_a_strict_csp_and_escapes_what_agents_wrote(
    gateway: Gateway, http: aiohttp.ClientSession
) -> None:
    base, store = gateway_url(gateway), store_of(gateway)
    await running(store, "ro-x")
    call = make_call("ro-x", "a1", 0, [1, 2, 3], [[10, 11]])
    call.choices[0].text = HOSTILE
    call.request = {"messages": [{"role": "user", "content": HOSTILE}]}
    await store.add_call(call)
    await store.add_events("ro-x", [EventSpec("note", {"text": HOSTILE})])
    await store.finish("ro-x", RolloutStatus.SUCCEEDED, HOSTILE)
    assert (await log_in(http, base)).status == 303
    bodies = {}
    for path in ("/dashboard/rollouts", "/dashboard/rollouts/ro-x", "/dashboard/login"):
        async with http.get(base + path) as resp:
            bodies[path] = body = await resp.text()
            assert resp.status == 200, path
            assert resp.headers["Content-Security-Policy"] == CSP
            assert resp.headers["X-Content-Type-Options"] == "nosniff"
            assert "<script>document" not in body
            assert "<img src=x" not in body
    shown = bodies["/dashboard/rollouts/ro-x"]
    assert (
        shown.count("&lt;script&gt;document.title=") >= 3
    )  # the completion, the prompt, the rollout's message
    assert "'unsafe-inline'" not in CSP
    assert "script-src 'self'" in CSP


async def test_the_live_updates_follow_the_completion_cursor(
    gateway: Gateway, http: aiohttp.ClientSession
) -> None:
    base, store = gateway_url(gateway), store_of(gateway)
    await running(store, "ro-a", "ro-b")
    _, head = await store.completed(0, 0)
    await store.finish("ro-b", RolloutStatus.SUCCEEDED)
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    async with http.get(f"{base}/dashboard/rollouts/completed?after={head}", headers=headers) as resp:
        answer = await resp.json()
    assert [r["id"] for r in answer["rollouts"]] == ["ro-b"]
    assert answer["cursor"] > head
    async with http.get(f"{base}/dashboard/rollouts/completed?after=-1", headers=headers) as resp:
        assert resp.status == 400


async def test_filters_and_pages(gateway: Gateway, http: aiohttp.ClientSession) -> None:
    base, store = gateway_url(gateway), store_of(gateway)
    await running(store, *(f"ro-{i:02d}" for i in range(60)))
    for i in range(0, 60, 3):
        await store.finish(f"ro-{i:02d}", RolloutStatus.FAILED)
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}

    async def ids(query: str) -> list[str]:
        async with http.get(f"{base}/dashboard/rollouts?{query}", headers=headers) as resp:
            assert resp.status == 200
            return re.findall(r'data-rollout="([^"]+)"', await resp.text())

    assert len(await ids("status=failed")) == 20
    first = await ids("")
    assert len(first) == 50
    async with http.get(f"{base}/dashboard/rollouts", headers=headers) as resp:
        after = re.search(r"after=(\d+)", await resp.text())
    assert after is not None
    assert len(await ids(f"after={after[1]}")) == 10
    async with http.get(f"{base}/dashboard/rollouts?status=nope", headers=headers) as resp:
        assert resp.status == 400


async def test_long_polls_end_when_the_gateway_stops_not_at_its_deadline(
    gateway_factory: GatewayFactory, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """The dashboard's live list waits 25 s and the API's cursor up to its `wait`: a stopping gateway answers them
    at once (an empty page at the same cursor) rather than holding its shutdown until `shutdown_timeout`."""
    addons = sqlite_options(tmp_path / "store.db")
    async with gateway_factory(NO_UPSTREAM, chain=DEFAULT_CHAIN, addons=addons) as gw:
        base, store = gateway_url(gw), store_of(gw)

        async def poll(path: str) -> tuple[int, dict[str, object]]:
            async with http.get(f"{base}{path}", headers=ADMIN) as resp:
                return resp.status, await resp.json()

        polls = [
            asyncio.ensure_future(poll("/dashboard/rollouts/completed?after=0")),
            asyncio.ensure_future(poll("/api/rollouts/completed?after=0&wait=60")),
        ]

        async def parked() -> None:
            while store.completion_waiters < 2:  # noqa: ASYNC110 — the store exposes a counter
                await asyncio.sleep(0.001)

        await asyncio.wait_for(parked(), 5)
        # Well inside the shutdown's own deadline (10 s), which the polls held before.
        await asyncio.wait_for(gw.stop(), gw.config.server.shutdown_timeout / 4)
        answers = await asyncio.wait_for(asyncio.gather(*polls), 1)
    assert answers == [(200, {"rollouts": [], "cursor": 0})] * 2


async def test_the_list_filters_by_reward_model_version_and_time_and_its_next_page_keeps_them(
    gateway: Gateway, http: aiohttp.ClientSession
) -> None:
    base, store = gateway_url(gateway), store_of(gateway)
    rollouts = await running(store, *(f"ro-{i:03d}" for i in range(120)))
    for i in range(120):
        await store.add_events(f"ro-{i:03d}", [EventSpec("reward", 1.0 if i % 2 else 0.0)])
        if i >= 10:
            call = make_call(f"ro-{i:03d}", None, 1, [1, 2], [[3]])
            call.model_version = "v2" if i % 4 == 1 else "v1"
            await store.add_call(call)

    async def ids(query: str) -> tuple[list[str], str | None]:
        async with http.get(f"{base}/dashboard/rollouts?{query}", headers=ADMIN) as resp:
            assert resp.status == 200, await resp.text()
            text = await resp.text()
        nxt = re.search(r'id="next" href="/dashboard/rollouts\?([^"]+)"', text)
        return re.findall(r'data-rollout="([^"]+)"', text), nxt[1].replace("&amp;", "&") if nxt else None

    def listed(query: str) -> list[str]:
        return [f"ro-{i:03d}" for i in range(120) if eval(query, {"i": i})]

    first, nxt = await ids("reward_min=0.5")
    assert first == listed("i % 2")[:50]
    assert nxt is not None
    assert "reward_min=0.5" in nxt
    second, _ = await ids(nxt)
    assert second == listed("i % 2")[50:]
    assert (await ids("reward_max=0.5&model_version=v1"))[0] == listed("i >= 10 and i % 2 == 0")[:50]
    assert (await ids("model_version=v2"))[0] == listed("i >= 10 and i % 4 == 1")
    # Times as the form's `datetime-local` input sends them: local time, to the second.
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(rollouts[0].created_at - 1))
    later = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(rollouts[0].created_at + 3600))
    assert len((await ids(f"since={since}"))[0]) == 50
    assert (await ids(f"since={later}"))[0] == []
    assert (await ids(f"until={since}"))[0] == []
    for bad in ("reward_min=high", "reward_max=nan", "since=yesterday", "model_version=" + "v" * 300):
        async with http.get(f"{base}/dashboard/rollouts?{bad}", headers=ADMIN) as resp:
            assert resp.status == 400, bad
            assert (await resp.json())["error"]["param"] == bad.split("=")[0]


async def test_the_gateway_page_shows_pause_and_each_upstreams_outcomes(
    gateway_factory: GatewayFactory, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with running_mock(MockVLLM(("m",))) as url:
        addons = sqlite_options(tmp_path / "store.db")
        async with gateway_factory({"m": [url]}, chain=DEFAULT_CHAIN, addons=addons) as gw:
            base, headers = gateway_url(gw), {"Authorization": f"Bearer {ADMIN_KEY}"}
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
            async with http.post(f"{base}/v1/chat/completions", json=body, headers=headers) as resp:
                assert resp.status == 200
            async with http.post(
                f"{base}/api/gateway/pause", json={"mode": "reject"}, headers=headers
            ) as resp:
                assert resp.status == 200
            async with http.get(f"{base}/dashboard/gateway", headers=headers) as resp:
                page = await resp.text()
    assert resp.status == 200
    assert '<dd id="paused">paused</dd>' in page
    (row,) = re.findall(r"<tr><td>m</td><td><code>(.*?)</code></td>\s*<td class=\"(\w+)\">.*?</td>\s*<td>(\d+)</td>"
                        r"\s*<td>(.*?)</td>", page, re.S)  # fmt: skip
    assert row == (url, "healthy", "0", "2xx: 1")


async def test_the_pages_stay_out_of_the_api_document(gateway: Gateway, http: aiohttp.ClientSession) -> None:
    async with http.get(f"{gateway_url(gateway)}/api/openapi.json") as resp:
        paths = (await resp.json())["paths"]
    assert "/api/rollouts" in paths
    assert not [p for p in paths if p.startswith("/dashboard")]


async def test_login_checks_the_key_auth_checks_and_never_an_empty_one(
    gateway_factory: GatewayFactory,
    tmp_path: Path,
    http: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    other = "another-admin-key-0123456789abcdef"
    monkeypatch.setenv("OTHER_ADMIN_KEY", other)
    addons = {**sqlite_options(tmp_path / "s.db"), "auth": {"key_env": "OTHER_ADMIN_KEY"}}
    async with gateway_factory(NO_UPSTREAM, chain=DEFAULT_CHAIN, addons=addons) as gw:
        base = gateway_url(gw)
        assert (await log_in(http, base, "")).status == 401
        assert (await log_in(http, base, ADMIN_KEY)).status == 401  # AGL_KEY is not the key auth checks here
        assert (await log_in(http, base, other)).status == 303


async def test_what_an_agent_sent_in_any_shape_never_breaks_its_rollouts_page(
    gateway: Gateway, http: aiohttp.ClientSession
) -> None:
    store = store_of(gateway)
    await running(store, "ro-odd")
    for k, request in enumerate(
        ("hi", [1, 2], {"messages": "hi"}, {"messages": [5]}, {"messages": [{"content": 7}]})
    ):
        call = make_call("ro-odd", "a1", k, [1, 2], [[3]])
        call.request = request  # as capture stores a request that failed validation: whatever came
        await store.add_call(call)
    async with http.get(f"{gateway_url(gateway)}/dashboard/rollouts/ro-odd", headers=ADMIN) as resp:
        assert resp.status == 200
        assert "[1,2]" in await resp.text()


async def test_a_rollout_of_many_calls_is_shown_without_its_trajectory(
    gateway: Gateway, http: aiohttp.ClientSession
) -> None:
    store = store_of(gateway)
    await running(store, "ro-many")
    for k in range(pages.MAX_TRAJECTORY_CALLS):
        await store.add_call(make_call("ro-many", "a1", k, [1, 2, k], [[3]]))
    async with http.get(f"{gateway_url(gateway)}/dashboard/rollouts/ro-many", headers=ADMIN) as resp:
        text = await resp.text()
    assert resp.status == 200
    assert "its merged trajectory is not drawn" in text
    assert 'class="row"' not in text


async def test_bad_forms_and_queries_are_clear_errors_with_the_pages_headers(
    gateway: Gateway, http: aiohttp.ClientSession
) -> None:
    base = gateway_url(gateway)
    async with http.post(f"{base}/dashboard/login", data="a=1&" * 5000) as resp:  # before any parsing
        assert resp.status == 413
    cookie = {"Cookie": "agl_dashboard_login=abc"}
    async with http.post(f"{base}/dashboard/login", data={"csrf": "é", "key": "k"}, headers=cookie) as resp:
        assert resp.status == 400  # a non-ASCII token is a mismatch, not a crash
    async with http.get(f"{base}/dashboard/rollouts?status=nope", headers=ADMIN) as resp:
        assert resp.status == 400
        assert resp.headers["Content-Security-Policy"] == CSP
    async with http.get(f"{base}/dashboard/rollouts?group_id=a/b", headers=ADMIN) as resp:
        assert resp.status == 400
    async with http.get(f"{base}/dashboard/", headers=ADMIN, allow_redirects=False) as resp:
        assert (resp.status, resp.headers["Location"]) == (303, "/dashboard/rollouts")
