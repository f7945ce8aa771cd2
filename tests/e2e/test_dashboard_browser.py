"""The dashboard in a real browser (Debian's Chromium, driven by Playwright): the login form, the rollouts list and
its filter, its live update when a rollout ends, a rollout's trajectory with its trained and context tokens, an
agent's `<script>` shown as text and never run, and no request of the pages answered with an error."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agl_lite.addons import DEFAULT_CHAIN
from agl_lite.core.server import Gateway
from agl_lite.store.records import RolloutStatus
from agl_lite.store.rules import EventSpec, Store
from tests.client.conftest import NO_UPSTREAM, make_call, running, sqlite_options, store_of
from tests.conftest import ADMIN_KEY, GatewayFactory, gateway_url

playwright = pytest.importorskip("playwright.async_api", reason="playwright is a dev dependency (make venv)")


def chromium_binary() -> str | None:
    """Debian's Chromium (`/usr/bin/chromium` is a shell wrapper; Playwright wants the binary itself)."""
    for candidate in (os.environ.get("AGL_CHROMIUM"), "/usr/lib/chromium/chromium", shutil.which("chromium")):
        if candidate and Path(candidate).exists():
            return candidate
    return None


CHROMIUM = chromium_binary()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        CHROMIUM is None, reason="Chromium is not installed (make test installs Debian's chromium)"
    ),
]
HOSTILE = "<script>window.__pwned = 1</script>"
PROMPT = [1, 2, 3, 4]
ITERATIONS = 5


async def populate(store: Store) -> None:
    """12 rollouts (every third failed, two still running) and `ro-multi`, a 3-turn agent whose turns merge into one
    row: 4 prompt tokens, then per turn 2 trained tokens and (between turns) 3 observation tokens."""
    ids = [f"ro-{i:02d}" for i in range(12)]
    await running(store, *ids)
    for i, rid in enumerate(ids[:-2]):
        await store.finish(rid, RolloutStatus.FAILED if i % 3 == 0 else RolloutStatus.SUCCEEDED)
    await running(store, "ro-multi")
    context = list(PROMPT)
    for turn in range(3):
        completion = [100 + 10 * turn, 101 + 10 * turn]
        call = make_call("ro-multi", "a1", turn, context, [completion])
        call.choices[0].text = HOSTILE if turn == 2 else f"turn {turn}"
        call.model_version = "v1"
        await store.add_call(call)
        context += [*completion, 7, 8, 9]  # the tool's answer: context for the next turn
    await store.add_events("ro-multi", [EventSpec("reward", {"value": 1.0})])
    await store.finish("ro-multi", RolloutStatus.SUCCEEDED)
    for k in range(ITERATIONS):  # what a trainer records after each iteration
        await store.put_resource("training", {"iteration": k, "version": f"v{k}", "mean_reward": 0.1 * k})


@pytest.fixture
async def gateway(gateway_factory: GatewayFactory, tmp_path: Path) -> AsyncIterator[Gateway]:
    async with gateway_factory(
        NO_UPSTREAM, chain=DEFAULT_CHAIN, addons=sqlite_options(tmp_path / "s.db")
    ) as gw:
        await populate(store_of(gw))
        yield gw


@contextlib.asynccontextmanager
async def browser_page() -> AsyncIterator[Any]:
    """A page of a headless Chromium; `page.errors` collects every failed request, error answer, page error and
    console error while it is open."""
    async with playwright.async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"], headless=True)
        try:
            tab = await browser.new_page()
            tab.errors = []
            # (a long poll the test navigates away from is aborted by the browser: not an error of the page)
            tab.on(
                "requestfailed",
                lambda r: (
                    r.failure != "net::ERR_ABORTED" and tab.errors.append(f"failed: {r.url} {r.failure}")
                ),
            )
            tab.on("response", lambda r: r.status >= 400 and tab.errors.append(f"{r.status}: {r.url}"))
            tab.on("pageerror", lambda e: tab.errors.append(f"page error: {e}"))
            tab.on("console", lambda m: m.type == "error" and tab.errors.append(f"console: {m.text}"))
            yield tab
        finally:
            await browser.close()


@pytest.fixture
async def page(gateway: Gateway) -> AsyncIterator[Any]:
    async with browser_page() as tab:
        yield tab


async def log_in(page: Any, base: str) -> None:
    await page.goto(f"{base}/dashboard/rollouts")  # sent to the login form
    assert page.url.endswith("/dashboard/login")
    await page.fill("input[name=key]", ADMIN_KEY)
    await page.click("#login button[type=submit]")
    await page.wait_for_url(f"{base}/dashboard/rollouts")


async def test_the_list_filters_and_follows_completions_live(gateway: Gateway, page: Any) -> None:
    base = gateway_url(gateway)
    await log_in(page, base)
    assert await page.locator("#rollouts tbody tr").count() == 13
    await page.select_option("select[name=status]", "failed")
    await page.click("#filters button[type=submit]")
    await page.wait_for_url("**/dashboard/rollouts?status=failed**")
    assert await page.locator("#rollouts tbody tr").count() == 4
    await page.select_option("select[name=status]", "")
    await page.fill("input[name=reward_min]", "0.5")
    await page.fill("input[name=model_version]", "v1")
    await page.click("#filters button[type=submit]")
    await page.wait_for_url("**/dashboard/rollouts?**reward_min=0.5**")
    assert await page.locator("#rollouts tbody tr").all_inner_texts() == [
        await page.locator("#ro-ro-multi").inner_text()
    ]
    await page.goto(f"{base}/dashboard/rollouts?status=running")
    assert await page.locator("#rollouts tbody tr").count() == 2
    await store_of(gateway).finish("ro-11", RolloutStatus.SUCCEEDED)  # while the page is open
    status = page.locator("#ro-ro-11 .status")
    await status.filter(has_text="succeeded").wait_for(timeout=10_000)
    assert await page.locator("#live-count").inner_text() == "1"
    assert page.errors == [], page.errors


async def test_a_trajectory_renders_its_trained_and_context_tokens_and_agent_markup_stays_text(
    gateway: Gateway, page: Any
) -> None:
    base = gateway_url(gateway)
    await log_in(page, base)
    await page.click("a[href='/dashboard/rollouts/ro-multi']")
    await page.wait_for_url(f"{base}/dashboard/rollouts/ro-multi")
    assert await page.locator("section.row").count() == 1
    assert await page.locator("section.row .tok.trained").count() == 3 * 2
    assert await page.locator("section.row .tok.ctx").count() == len(PROMPT) + 2 * 3
    assert await page.evaluate("window.__pwned") is None  # the agent's script never ran
    assert HOSTILE in await page.locator("#calls").inner_text()  # it is shown, as text
    assert await page.locator("#calls script").count() == 0
    assert page.errors == [], page.errors


async def test_the_training_plot_has_one_point_per_iteration_and_the_gateway_page_opens(
    gateway: Gateway, page: Any
) -> None:
    base = gateway_url(gateway)
    await log_in(page, base)
    await page.click("header nav a[href='/dashboard/training']")
    await page.wait_for_url(f"{base}/dashboard/training")
    assert await page.locator("#chart-mean_reward circle.pt").count() == ITERATIONS
    assert await page.locator("#chart-mean_reward figcaption").inner_text() == "Mean reward"
    await page.click("header nav a[href='/dashboard/gateway']")
    await page.wait_for_url(f"{base}/dashboard/gateway")
    assert await page.locator("#paused").inner_text() == "flowing"
    assert page.errors == [], page.errors
