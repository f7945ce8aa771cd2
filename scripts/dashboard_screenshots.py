"""Screenshots of each dashboard page for docs/dashboard.md, taken in Debian's Chromium over a run's store.

    make demo                                            # a learning run: examples/learning/.run
    .venv/bin/python scripts/dashboard_screenshots.py    # -> docs/dashboard/*.png

It starts the gateway of the run's `dashboard.toml` (the store and the dashboard only) on a free port with the
run's `admin.key`, logs in through the form, and photographs the rollouts list, a rollout's page (the first
succeeded rollout of the last iteration), the training page and the gateway page.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import shutil
from pathlib import Path

from playwright.async_api import async_playwright

from agl_lite.service import load_config, running_gateway

ROOT = Path(__file__).resolve().parent.parent


async def shoot(run: Path, out: Path, chromium: str, key: str) -> None:
    config = load_config(run / "dashboard.toml")
    config = dataclasses.replace(config, server=dataclasses.replace(config.server, port=0))
    async with running_gateway(config) as gw, async_playwright() as pw:
        base = f"http://127.0.0.1:{gw.port}"
        browser = await pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = await browser.new_page(viewport={"width": 1280, "height": 900})
        await page.goto(f"{base}/dashboard/login")
        await page.fill("input[name=key]", key)
        await page.click("#login button[type=submit]")
        await page.wait_for_url(f"{base}/dashboard/rollouts")
        await page.screenshot(path=out / "rollouts.png")
        await page.goto(f"{base}/dashboard/rollouts?status=succeeded")
        last = await page.locator("#rollouts tbody tr a").last.get_attribute("href")
        await page.goto(base + str(last))
        await page.screenshot(path=out / "rollout.png", full_page=True)
        await page.goto(f"{base}/dashboard/training")
        await page.screenshot(path=out / "training.png", full_page=True)
        await page.goto(f"{base}/dashboard/gateway")
        await page.screenshot(path=out / "gateway.png")
        await browser.close()
    print(f"screenshots in {out}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, default=ROOT / "examples" / "learning" / ".run")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "dashboard")
    parser.add_argument(
        "--chromium",
        default="/usr/lib/chromium/chromium"
        if Path("/usr/lib/chromium/chromium").exists()
        else shutil.which("chromium"),
    )
    args = parser.parse_args()
    if not (args.run / "dashboard.toml").exists():
        parser.error(f"no run in {args.run}: run `make demo` first")
    os.environ["AGL_KEY"] = key = (args.run / "admin.key").read_text().strip()
    args.out.mkdir(parents=True, exist_ok=True)
    asyncio.run(shoot(args.run, args.out, args.chromium, key))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
