"""The bare pass-through: the ceiling for any aiohttp gateway. Read the body, forward it, stream the answer back.

Nothing added: no auth, no routing, no capture. Run: `python relay.py --port N --upstream http://127.0.0.1:M`.
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

SESSION = web.AppKey("session", aiohttp.ClientSession)
UPSTREAM = web.AppKey("upstream", str)


async def relay(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
    url = request.app[UPSTREAM] + request.path_qs
    async with request.app[SESSION].request(request.method, url, data=body, headers=headers) as up:
        out = web.StreamResponse(
            status=up.status, headers={"Content-Type": up.headers.get("Content-Type", "")}
        )
        await out.prepare(request)
        async for chunk in up.content.iter_any():
            await out.write(chunk)
        await out.write_eof()
        return out


async def client_session(app: web.Application) -> AsyncIterator[None]:
    app[SESSION] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
    yield
    await app[SESSION].close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="Base URL of the upstream, without a path.")
    args = parser.parse_args()
    app = web.Application()
    app[UPSTREAM] = args.upstream.rstrip("/")
    app.cleanup_ctx.append(client_session)
    app.router.add_route("*", "/{tail:.*}", relay)
    web.run_app(app, host=args.host, port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
