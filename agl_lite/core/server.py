"""The aiohttp server: one handler turns each request into a Flow, drives the hooks and relays the upstream stream.

Chunks are written to the client as they arrive (never buffered); only the terminal `data: [DONE]` event (or, for a
plain body, the last chunk) waits for `response_end`, the commit point. Errors become JSON, never tracebacks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from dataclasses import replace
from typing import Any

import aiohttp
import structlog
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from multidict import CIMultiDict

from agl_lite.core.addons import AddonManager
from agl_lite.core.config import GatewayConfig
from agl_lite.core.flow import Flow, Request, Response, Transform, error_response, json_response
from agl_lite.core.http1 import HttpResponse
from agl_lite.core.routes import HttpRoute, RouteKind, RouteTable, Scope
from agl_lite.core.sse import DoneDetector
from agl_lite.core.upstream import Upstream, filter_headers, map_upstream_error
from agl_lite.errors import (
    ConfigError,
    HttpError,
    InternalError,
    NotFound,
    PayloadTooLarge,
    RequestTimeout,
    UpstreamError,
)

__all__ = ["CORE_ROUTES", "Gateway"]

log = structlog.get_logger("agl_lite.server")

CORE_ROUTES = (HttpRoute("healthz", "GET", "/healthz", Scope.PUBLIC, RouteKind.API, "Liveness probe."),)
"""Routes the core answers itself."""


class Gateway:
    """The addon chain behind an HTTP server. `start()` binds and fires `running`; `stop()` fires `shutdown`."""

    def __init__(self, config: GatewayConfig, addons: AddonManager) -> None:
        if not (config.server.header_timeout_s > 0 and config.server.body_timeout_s > 0):
            raise ConfigError(
                f"{config.source}: server.header_timeout_s and server.body_timeout_s must be > 0"
            )
        self.config = config
        self.addons = addons
        self.table = RouteTable([*CORE_ROUTES, *addons.routes()])
        addons.ctx.routes = self.table.routes
        self.upstream = Upstream(config.upstream)
        self._runner: web.ServerRunner | None = None
        self.port: int = 0
        self._access_log = config.log.access_log

    # --- lifecycle -----------------------------------------------------------------------------------------------

    def make_server(self) -> web.Server:
        """aiohttp's low-level server: every request goes to `handle`, which matches the route table itself
        (an aiohttp router would only resolve a catch-all route, at a measurable cost per request)."""
        max_body = self.config.server.max_body_bytes

        def make_request(
            message: Any, payload: Any, protocol: Any, writer: Any, task: asyncio.Task[None]
        ) -> web.BaseRequest:
            return web.BaseRequest(
                message, payload, protocol, writer, task, asyncio.get_running_loop(), client_max_size=max_body
            )

        return web.Server(
            self.handle,
            request_factory=make_request,
            handler_cancellation=True,
            access_log=None,
            max_field_size=65536,
            # aiohttp closes a connection that has not sent a whole request's headers within its keep-alive
            # timeout (from connect, and between requests): the slow-header bound.
            keepalive_timeout=self.config.server.header_timeout_s,
            logger=_PROTOCOL_LOG,
        )

    async def start(self) -> int:
        """Bind, configure the addons, serve, and fire `running`; returns the bound port.

        The socket is bound first so that with port 0 the addons are configured with the real port
        (`config.public_url` is what agents are told).
        """
        sock = _bind(self.config.server.host, self.config.server.port)
        try:
            self.port = sock.getsockname()[1]
            if self.config.server.port == 0:
                self.config = replace(self.config, server=replace(self.config.server, port=self.port))
            await self.addons.load()
            await self.addons.configure(self.config)
            await self.upstream.start()
            self._runner = web.ServerRunner(
                self.make_server(),
                shutdown_timeout=self.config.server.shutdown_timeout,
            )
            await self._runner.setup()
            await web.SockSite(self._runner, sock, backlog=1024).start()
            await self.addons.running()
        except BaseException:
            await self.stop()  # also when `running` failed: no half-started gateway, no unclosed session
            sock.close()  # after the site let go of it (closing it first breaks the site's cleanup)
            raise
        log.info("gateway listening", url=self.config.public_url, chain=[a.name for a in self.addons.addons])
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.addons.shutdown()
        await self.upstream.close()

    # --- one request ---------------------------------------------------------------------------------------------

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        try:
            match = self.table.match(request.method, request.path)
        except HttpError as exc:
            return _json_web_response(exc.status, exc.body(), exc.headers)
        try:
            if request.content.is_eof():  # the whole body is buffered already: no timer on the hot path
                body = await request.read()
            else:
                async with asyncio.timeout(self.config.server.body_timeout_s):
                    body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            too_large = PayloadTooLarge(f"request body exceeds {self.config.server.max_body_bytes} bytes")
            return _json_web_response(too_large.status, too_large.body(), {"Connection": "close"})
        except TimeoutError:
            slow = RequestTimeout(f"request body not received within {self.config.server.body_timeout_s:g} s")
            return _json_web_response(slow.status, slow.body(), {"Connection": "close"})
        flow = Flow(
            request=Request(
                request.method,
                request.path,
                request.query_string,
                CIMultiDict(request.headers),
                body,
                match.params,
            ),
            route=match.route,
        )
        try:
            return await self._run_flow(request, flow)
        except Exception as exc:  # a bug, not a condition: still JSON for the client, never a traceback
            log.error("flow failed", path=flow.request.path, error=repr(exc), exc_info=exc)
            internal = InternalError("internal error")
            return _json_web_response(internal.status, internal.body())
        finally:
            flow.t_end = time.monotonic()
            await self.addons.flow_done(flow)
            if self._access_log:
                log.info(
                    "flow",
                    method=flow.request.method,
                    path=flow.request.path,
                    status=flow.response.status if flow.response else None,
                    ms=round((flow.t_end - flow.t_start) * 1000, 2),
                )

    async def _run_flow(self, request: web.BaseRequest, flow: Flow) -> web.StreamResponse:
        await self.addons.request(flow)
        if flow.response is None and flow.route.name == "healthz":
            flow.response = json_response(200, {"status": "ok"})
        if flow.response is not None:
            return await self._send_short(request, flow)
        if not flow.upstreams:
            flow.response = error_response(
                NotFound(f"nothing answers {flow.request.method} {flow.request.path}")
            )
            return await self._send_short(request, flow)
        try:
            upstream_resp = await self.upstream.open(flow)
        except UpstreamError as exc:
            flow.error = exc
            await self.addons.error(flow)
            flow.response = error_response(exc)
            # `error` took the place of response_end; response_headers still runs, so that a translating addon
            # can give its client the error in the client's own shape.
            return await self._send_short(request, flow, end_hooks=False)
        try:
            return await self._relay(request, flow, upstream_resp)
        finally:
            # A fully read body returns its connection to the pool; a partial one is closed, never reused.
            upstream_resp.release()
            target = flow.upstream
            if target is not None and target.observer is not None:
                target.observer.attempt_ended(target, ok=not isinstance(flow.error, UpstreamError))

    async def _send_short(
        self, request: web.BaseRequest, flow: Flow, *, end_hooks: bool = True
    ) -> web.StreamResponse:
        await self.addons.response_headers(flow)
        if end_hooks:
            await self.addons.response_end(flow)
        response = flow.response
        assert response is not None
        out = web.Response(status=response.status, body=response.body, headers=response.headers)
        await out.prepare(request)  # here, not after return, so that a bad header fails inside the flow
        flow.bytes_to_client = len(response.body or b"")
        return out

    async def _relay(self, request: web.BaseRequest, flow: Flow, up: HttpResponse) -> web.StreamResponse:
        ctype = up.headers.get("Content-Type", "")
        flow.response = response = Response(
            status=up.status,
            headers=filter_headers(up.headers.items()),
            from_upstream=True,
            is_event_stream=ctype.startswith("text/event-stream"),
        )
        await self.addons.response_headers(flow)
        out = _RelayResponse(status=response.status, headers=response.headers)
        if response.is_event_stream:
            out.headers["Cache-Control"] = "no-cache"
            out.headers["X-Accel-Buffering"] = "no"
        taps, transforms = response.taps, response.transforms
        ended = False
        try:
            await out.prepare(request)  # the headers go out with the first bytes: one send, not two
            # Held back: a plain body's last read (until response_end), and a stream's bytes from `data: [DONE]`
            # on (after response_end, until the upstream's end), so that they leave with the end of the body.
            pending: bytes | None = None
            done = DoneDetector()
            async for chunk in up.content.iter_any():
                if flow.t_first_byte is None:
                    flow.t_first_byte = time.monotonic()
                for tap in taps:
                    tap(chunk)
                if transforms:
                    for t in transforms:
                        chunk = t(chunk)
                if response.is_event_stream:
                    if ended:  # after [DONE]: nothing but the end of the stream
                        pending = (pending or b"") + chunk
                        continue
                    cut = done.feed(chunk)
                    if cut >= 0:
                        if cut:
                            flow.bytes_to_client += cut
                            await out.write(chunk[:cut])
                        ended = True
                        await self.addons.response_end(flow)
                        pending = chunk[cut:]
                    elif chunk:
                        flow.bytes_to_client += len(chunk)
                        await out.write(chunk)
                else:
                    if pending is not None:
                        flow.bytes_to_client += len(pending)
                        await out.write(pending)
                    pending = chunk
            final = _flush_chain(transforms) if transforms else b""
            if not ended:
                ended = True
                await self.addons.response_end(flow)
            if pending:
                final = pending + final
            flow.bytes_to_client += len(final)
            await out.write_eof(final)  # the last bytes and the end of the body in one send
            return out
        except asyncio.CancelledError:
            # aiohttp cancels the handler when the client goes away (handler_cancellation=True): drop the upstream
            # connection at once so the inference server frees the sequence's KV cache.
            flow.client_disconnected = True
            up.close()
            await self._fail(flow, None, ended)
            raise
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            up.close()
            if request.transport is None or request.transport.is_closing():
                # The write to the client failed: the client went away, the upstream did nothing wrong.
                flow.client_disconnected = True
                await self._fail(flow, None, ended)
                return out
            err = map_upstream_error(exc, flow.upstream.name if flow.upstream else "", mid_response=True)
            await self._fail(flow, err, ended)
            if response.is_event_stream and not ended:
                # In-band, as vLLM itself reports errors mid-stream: the SDKs raise it as an APIError. It goes
                # through the transforms like any event, so a translating addon speaks its client's dialect.
                frame = _through(transforms, b"data: " + json.dumps(err.body()).encode() + b"\n\n")
                await _write_quietly(out, frame)
                await _write_eof_quietly(out)
            elif request.transport is not None:
                # A plain body cannot signal an error once its status went out: cut the connection instead.
                request.transport.close()
            return out
        except Exception as exc:
            up.close()
            log.error("relay failed", error=repr(exc), exc_info=exc)
            await self._fail(flow, InternalError("internal error while relaying the response"), ended)
            if request.transport is not None:
                request.transport.close()
            return out

    async def _fail(self, flow: Flow, err: HttpError | None, ended: bool) -> None:
        """`error` fires instead of `response_end`: once the response was committed, a late failure is only noted."""
        if err is not None:
            flow.error = err
        if not ended:
            await self.addons.error(flow)


def _flush_chain(transforms: list[Transform]) -> bytes:
    """What the transforms still owe at the end of the body: each one's leftovers go through those after it
    before they are flushed in turn."""
    out = b""
    for i, t in enumerate(transforms):
        owed = t.flush()
        for later in transforms[i + 1 :]:
            if owed:
                owed = later(owed)
        out += owed
    return out


def _apply(transforms: list[Transform], data: bytes) -> bytes:
    for t in transforms:
        data = t(data)
    return data


def _through(transforms: list[Transform], event: bytes) -> bytes:
    """`event` and then the end of the body through the transforms; the raw event if one of them fails."""
    try:
        return _apply(transforms, event) + _flush_chain(transforms)
    except Exception as exc:  # a transform that cannot take the error must not hide it from the client
        log.error("a transform failed on the in-band error event", error=repr(exc), exc_info=exc)
        return event


class _MalformedRequests(logging.Filter):
    """aiohttp answers HTTP its parser refuses (bad request line, header too long, bad chunking) with a 400 of its
    own and logs the exception with a traceback and the offending bytes. That is the client's input, not our bug:
    one warning line naming the error class instead (the bytes could hold a header such as Authorization)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            log.warning("malformed HTTP request refused", error=type(exc).__name__, status=exc.code)
            return False
        return True


_PROTOCOL_LOG = logging.getLogger("agl_lite.http")
_PROTOCOL_LOG.addFilter(_MalformedRequests())


async def _write_quietly(out: web.StreamResponse, data: bytes) -> None:
    with contextlib.suppress(ConnectionResetError, aiohttp.ClientConnectionResetError):
        await out.write(data)


async def _write_eof_quietly(out: web.StreamResponse) -> None:
    with contextlib.suppress(ConnectionResetError, aiohttp.ClientConnectionResetError):
        await out.write_eof()


class _RelayResponse(web.StreamResponse):
    """A streamed response whose headers leave with its first bytes (aiohttp sends them at once by default)."""

    _send_headers_immediately = False


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    sock.setblocking(False)
    return sock


def _json_web_response(
    status: int, body: dict[str, Any], headers: dict[str, str] | None = None
) -> web.Response:
    return web.json_response(body, status=status, headers=headers)
