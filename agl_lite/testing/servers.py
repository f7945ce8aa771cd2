"""Run any aiohttp application on a free loopback port for the length of a test."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web

__all__ = ["serve_app"]


@asynccontextmanager
async def serve_app(app: web.Application, *, host: str = "127.0.0.1") -> AsyncIterator[str]:
    """Serve `app` on `host`, port 0; yields `http://host:port`. Handlers are cancelled when their client leaves."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()
