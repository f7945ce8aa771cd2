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
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import aiohttp
import structlog
from aiohttp import HttpVersion11, web
from aiohttp.http_exceptions import BadHttpMethod, HttpProcessingError
from aiohttp.web_protocol import RequestHandler, RequestPayloadError
from multidict import CIMultiDict

from agl_lite.core.addons import AddonManager
from agl_lite.core.config import GatewayConfig
from agl_lite.core.encoding import decode_body
from agl_lite.core.fdlimit import raise_nofile
from agl_lite.core.flow import (
    BodyRefused,
    Flow,
    Request,
    Response,
    Transform,
    error_response,
    flush_transforms,
    json_response,
)
from agl_lite.core.http1 import HttpResponse, ProtocolError
from agl_lite.core.routes import HttpRoute, RouteKind, RouteTable, Scope
from agl_lite.core.sse import DoneDetector
from agl_lite.core.upstream import Upstream, filter_headers, map_upstream_error
from agl_lite.errors import (
    BadRequest,
    BodyTimeout,
    ConfigError,
    ExpectationFailed,
    HttpError,
    InternalError,
    NotFound,
    PayloadTooLarge,
    ShuttingDown,
    UpstreamError,
)

__all__ = ["CORE_ROUTES", "Gateway"]

log = structlog.get_logger("agl_lite.server")

_AIOHTTP_SHUTDOWN_S = 1.0
"""What aiohttp waits for handlers at shutdown (twice: before and after cancelling them), after `Gateway.stop` let
the flows in flight finish or cut them."""

CORE_ROUTES = (HttpRoute("healthz", "GET", "/healthz", Scope.PUBLIC, RouteKind.API, "Liveness probe."),)
"""Routes the core answers itself."""
_UNMATCHED = HttpRoute(
    "unmatched", "*", "*", Scope.PUBLIC, RouteKind.API, "A request no route took (404, 405)."
)
"""The route of a flow made only to be counted and logged: its request matched no route, and no hook but
`flow_done` sees it."""


class Gateway:
    """The addon chain behind an HTTP server. `start()` binds and fires `running`; `stop()` fires `shutdown`."""

    def __init__(self, config: GatewayConfig, addons: AddonManager) -> None:
        if not (config.server.header_timeout_s > 0 and config.server.body_timeout_s > 0):
            raise ConfigError(
                f"{config.source}: server.header_timeout_s and server.body_timeout_s must be > 0"
            )
        if config.upstream.max_event_bytes < 1:
            raise ConfigError(f"{config.source}: upstream.max_event_bytes must be >= 1")
        if not (config.upstream.read_timeout > 0 and config.upstream.keepalive_timeout >= 0):
            raise ConfigError(
                f"{config.source}: upstream.read_timeout must be > 0 and upstream.keepalive_timeout >= 0 "
                "(0: no connection is kept)"
            )
        self.config = config
        self.addons = addons
        self.table = RouteTable([*CORE_ROUTES, *addons.routes()])
        addons.ctx.routes = self.table.routes
        self.upstream = Upstream(config.upstream)
        self._runner: web.ServerRunner | None = None
        self.port: int = 0
        self._access_log = config.log.access_log
        self._stopping = False
        self.stopping = addons.ctx.stopping
        """Set once `stop` began: from then on no new request is served."""
        self._flows: set[Flow] = set()  # in flight, for the shutdown to wait for and then cut
        self._idle = asyncio.Event()

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

        return _Server(
            self.handle,
            request_factory=make_request,
            handler_cancellation=True,
            access_log=None,
            max_field_size=65536,
            # aiohttp closes a connection that has not sent a whole request's headers within its keep-alive
            # timeout (from connect, and between requests): the slow-header bound.
            keepalive_timeout=self.config.server.header_timeout_s,
            logger=_PROTOCOL_LOG,
            auto_decompress=False,  # `core.encoding` decodes, with the size cap on the decoded bytes
        )

    async def start(self, *, configured: Callable[[], None] | None = None) -> int:
        """Bind, configure the addons, serve, and fire `running`; returns the bound port. `configured` runs once
        every addon is configured (every key read), before anything serves or starts: the process's protection
        (`key_source.protect_process`) goes there, so that no agent a `running` hook starts finds it open.

        The socket is bound first so that with port 0 the addons are configured with the real port
        (`config.public_url` is what agents are told).
        """
        raise_nofile(self.config.upstream.max_connections)
        if self.config.server.workers < 1:
            raise ConfigError(f"{self.config.source}: server.workers must be >= 1")
        if self.config.server.workers > 1 and self.config.server.port == 0:
            raise ConfigError(
                f"{self.config.source}: several workers need a port of their own (not 0) to share"
            )
        sock = _bind(self.config.server.host, self.config.server.port, self.config.server.workers > 1)
        try:
            self.port = sock.getsockname()[1]
            if self.config.server.port == 0:
                self.config = replace(self.config, server=replace(self.config.server, port=self.port))
            await self.addons.load()
            await self.addons.configure(self.config)
            if configured is not None:
                configured()
            await self.upstream.start()
            # `stop` waits for the flows itself; aiohttp's own wait is for what is left after they were cut.
            self._runner = web.ServerRunner(self.make_server(), shutdown_timeout=_AIOHTTP_SHUTDOWN_S)
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
        """Stop accepting, let the flows in flight finish for `shutdown_timeout` s in all, then cut the rest (their
        clients get 503 `shutting_down`, their records say `aborted`). aiohttp alone would wait that long twice
        (once for the handlers, once more after cancelling them)."""
        self._stopping = True
        self.stopping.set()
        if self._runner is not None:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.config.server.shutdown_timeout
            for site in list(self._runner.sites):
                await site.stop()  # no new connections
            cut_grace = min(1.0, self.config.server.shutdown_timeout / 4)
            await self._drained(deadline - cut_grace)
            for flow in list(self._flows):
                flow.abort(ShuttingDown("the gateway shut down before the call ended"))
            await self._drained(deadline)
            await self._runner.cleanup()
            self._runner = None
        await self.addons.shutdown()
        await self.upstream.close()

    # --- one request ---------------------------------------------------------------------------------------------

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        if self._stopping:  # a keep-alive connection's next request while the flows in flight drain
            gone = ShuttingDown("the gateway is shutting down; retry on a new connection")
            return _json_web_response(gone.status, gone.body(), {"Connection": "close", "Retry-After": "1"})
        try:
            match = self.table.match(request.method, request.path)
        except HttpError as exc:
            unmatched = Flow(
                request=Request(request.method, request.path, "", CIMultiDict(), b""),
                route=_UNMATCHED,
                response=error_response(exc),
            )
            await self._finished(unmatched, request.path)
            return _json_web_response(exc.status, exc.body(), exc.headers)
        flow = Flow(
            request=Request(
                request.method,
                request.path,
                request.rel_url.raw_query_string,  # as sent: forwarded upstream byte for byte
                CIMultiDict(request.headers),
                b"",
                match.params,
            ),
            route=match.route,
        )
        forwarding = False  # the body is in: from here on a cancelled flow still gets its `error`
        flow.canceller = asyncio.current_task().cancel  # type: ignore[union-attr]
        self._flows.add(flow)
        try:
            await self.addons.request_headers(flow)
            if flow.response is not None:  # answered on its headers (a bad key): its body is never read
                flow.response.headers["Connection"] = "close"
                return await self._send_short(request, flow)
            refused = await self._expected(request) or await self._read_body(request, flow)
            if refused is not None:  # no `response_end`: a refused body leaves no trace
                flow.response = error_response(refused)
                flow.response.headers["Connection"] = "close"
                return await self._send_short(request, flow, end_hooks=False)
            forwarding = True
            return await self._run_flow(request, flow)
        except asyncio.CancelledError:
            # (not when the relay already took the cancellation for the client's or the shutdown's)
            if flow.error is None and not flow.client_disconnected and _cut_by_us(flow):
                flow.error = flow.abort_error
                if forwarding and not flow.ended:
                    await self.addons.error(flow)
                flow.response = error_response(flow.error)  # type: ignore[arg-type]
                return await self._send_short(request, flow, end_hooks=False)
            if forwarding and not flow.ended:
                # Cancelled before the flow's end: the client left (or the gateway stopped) while an addon or the
                # upstream's headers were awaited. `error` still fires, so that the flow leaves its one record.
                self._cancelled(flow)
                await self.addons.error(flow)
            raise
        except Exception as exc:  # a bug, not a condition: still JSON for the client, never a traceback
            log.error("flow failed", path=flow.request.path, error=repr(exc), exc_info=exc)
            internal = InternalError("internal error")
            return _json_web_response(internal.status, internal.body())
        finally:
            # (the canceller holds this task, which holds the flow: no cycle left for the collector)
            flow.canceller = None
            self._flows.discard(flow)
            if not self._flows:
                self._idle.set()
            await self._finished(flow, request.path)

    async def _finished(self, flow: Flow, path: str) -> None:
        """Every request's end, routed or not: `flow_done` (metrics count it) and its access-log line, with the
        path the client sent (an addon may have rewritten the flow's, as the Anthropic one does)."""
        flow.t_end = end = time.monotonic()
        await self.addons.flow_done(flow)
        if self._access_log:
            log.info(
                "flow",
                method=flow.request.method,
                path=path,
                route=flow.route.name,
                status=flow.response.status if flow.response else None,
                ms=round((end - flow.t_start) * 1000, 2),
            )

    async def _drained(self, deadline: float) -> None:
        """Until no flow is in flight, or `deadline` (loop time)."""
        loop = asyncio.get_running_loop()
        while self._flows and (left := deadline - loop.time()) > 0:
            self._idle.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._idle.wait()

    async def _expected(self, request: web.BaseRequest) -> HttpError | None:
        """`Expect: 100-continue` (curl's for bodies over 1 KB) answered once the headers passed, before the body
        is read, as aiohttp's router would (its low-level server does not); any other expectation is a 417."""
        expect = request.headers.get("Expect")
        if expect is None:
            return None
        if expect.strip().lower() != "100-continue":
            return ExpectationFailed(f"unsupported Expect: {expect[:100]!r}; only 100-continue is")
        limit = self.config.server.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            # (not invited, then read and refused)
            return PayloadTooLarge(f"request body exceeds {limit} bytes")
        if request.version >= HttpVersion11 and not request.content.is_eof():
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        return None

    async def _read_body(self, request: web.BaseRequest, flow: Flow) -> HttpError | None:
        """Read the body into `flow.request.body`, decoded if it came with a Content-Encoding; the error to answer
        when it cannot be."""
        limit = self.config.server.max_body_bytes
        try:
            if request.content.is_eof():  # the whole body is buffered already: no timer on the hot path
                body = await request.read()
            else:
                async with asyncio.timeout(self.config.server.body_timeout_s):
                    body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return PayloadTooLarge(f"request body exceeds {limit} bytes")
        except TimeoutError:
            return BodyTimeout(f"request body not received within {self.config.server.body_timeout_s:g} s")
        except (RequestPayloadError, HttpProcessingError) as exc:
            return BadRequest(f"request body cannot be read: {str(exc)[:200]}")
        encoding = flow.request.headers.get("Content-Encoding")
        if encoding is not None:
            try:
                body = decode_body(encoding, body, limit)
            except HttpError as exc:
                return exc
            # What travels on is the decoded body: the header would describe bytes that are no longer there.
            del flow.request.headers["Content-Encoding"]
        flow.request.body = body
        return None

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
            self.upstream.finish(flow, upstream_resp)

    async def _send_short(
        self, request: web.BaseRequest, flow: Flow, *, end_hooks: bool = True
    ) -> web.StreamResponse:
        await self.addons.response_headers(flow)
        if end_hooks:
            await self.addons.response_end(flow)
            if flow.error is not None and flow.response is not None and flow.response.status < 400:
                flow.response = error_response(flow.error)  # the end was refused (`ResponseEndHook`)
                await self.addons.response_headers(flow)
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
            # (media types ignore case)
            is_event_stream=ctype.lstrip().lower().startswith("text/event-stream"),
        )
        await self.addons.response_headers(flow)
        out = _RelayResponse(status=response.status, headers=response.headers)
        if response.is_event_stream:
            out.headers["Cache-Control"] = "no-cache"
            out.headers["X-Accel-Buffering"] = "no"
        taps, transforms = response.taps, response.transforms
        ended = False
        flushed = False  # the transforms gave what they owe: a translated stream's end, at its `[DONE]`
        # (a translation into a stream without `[DONE]` says when the upstream's reached it: `flow.Transform`)
        ends = [end for t in transforms if (end := getattr(t, "ended", None)) is not None]
        try:
            # `out` is prepared at its first bytes, not before: until then a refused commit can still answer with a
            # status of its own (`_refuse`). (The headers left with the first bytes anyway: one send, not two.)
            # Held back: a plain body's last read (until response_end), and a stream's bytes from `data: [DONE]`
            # on (after response_end, until the upstream's end), so that they leave with the end of the body.
            pending: bytes | None = None
            done = DoneDetector()
            cap = self.config.upstream.max_event_bytes
            run = 0  # bytes of the stream's current event, or of the whole plain body
            last = b""  # a stream's last bytes before this read: a blank line may straddle two reads
            async for chunk in up.content.iter_any():
                if flow.t_first_byte is None:
                    flow.t_first_byte = time.monotonic()
                # Before the taps and transforms, which hold an event until its blank line: one endless event
                # (an endless line, or lines and never a blank one) must not become an endless buffer.
                if response.is_event_stream:
                    if chunk.endswith(b"\n\n"):  # (a read that ends an event: no scan)
                        run = 0
                    else:
                        end = _after_blank_line(last + chunk) - len(last)
                        run = run + len(chunk) if end < 0 else len(chunk) - end
                    last = chunk[-2:]
                else:
                    run += len(chunk)
                if run > cap:
                    what = "an event stream event" if response.is_event_stream else "a body"
                    raise ProtocolError(
                        f"the upstream sent {what} over {cap} bytes (upstream.max_event_bytes)"
                    )
                for tap in taps:
                    tap(chunk)
                if transforms and not flushed:
                    chunk = _converted(transforms, chunk)
                if response.is_event_stream:
                    # after [DONE]: nothing but the end of the stream (and no more than a line of it); nothing
                    # at all after a translation's end
                    if ended:
                        if not flushed and len(pending or b"") < cap:
                            pending = (pending or b"") + chunk[: cap - len(pending or b"")]
                        continue
                    cut = done.feed(chunk)
                    if cut < 0 and ends and any(end() for end in ends):
                        # The upstream's `[DONE]` reached a translation (Anthropic, Responses), whose client has
                        # no `[DONE]`: its end is what the translation still owes, held as `[DONE]` is.
                        cut, flushed = len(chunk), True
                        chunk += _converted_end(transforms)
                    if cut >= 0:
                        if cut:
                            if not out.prepared:
                                await out.prepare(request)
                            flow.bytes_to_client += cut
                            await out.write(chunk[:cut])
                        ended = True
                        await self.addons.response_end(flow)
                        if flow.error is not None:
                            return await self._refuse(request, flow, out, flushed=flushed)
                        pending = chunk[cut:]
                    elif chunk:
                        if not out.prepared:
                            await out.prepare(request)
                        flow.bytes_to_client += len(chunk)
                        await out.write(chunk)
                else:
                    if pending:
                        if not out.prepared:
                            await out.prepare(request)
                        flow.bytes_to_client += len(pending)
                        await out.write(pending)
                    pending = chunk
            refused: BodyRefused | None = None
            try:
                final = _converted_end(transforms) if transforms and not flushed else b""
            except BodyRefused as exc:
                # A conversion that cannot take this body: its error goes out, not the upstream's answer.
                final, refused = b"", exc
            if refused is not None and not ended:
                # The call failed, and its record says so: `response_end` would record the upstream's answer as
                # one the client got, and the client gets the conversion's error instead.
                ended = True
                await self._fail(flow, _refused_error(flow, refused), False)
                return await self._answer_refused(request, flow, out, refused)
            if not ended:
                ended = True
                await self.addons.response_end(flow)
                if flow.error is not None:
                    return await self._refuse(request, flow, out, flushed=True)
            if refused is not None:
                return await self._answer_refused(request, flow, out, refused)
            if pending:
                final = pending + final
            if response.status in _NO_BODY:
                final = b""  # whatever a transform made of it: a body here would be read as the next response
            if not out.prepared:
                await out.prepare(request)
            flow.bytes_to_client += len(final)
            await out.write_eof(final)  # the last bytes and the end of the body in one send
            return out
        except asyncio.CancelledError:
            # aiohttp cancels the handler when the client goes away (handler_cancellation=True), and at shutdown:
            # drop the upstream connection at once so the inference server frees the sequence's KV cache.
            up.close()
            if _cut_by_us(flow):  # the gateway cut it (`Flow.abort`) and its client is still there
                assert flow.abort_error is not None
                return await self._fail_mid_response(request, flow, out, flow.abort_error, ended)
            self._cancelled(flow)
            await self._fail(flow, None, ended)
            raise
        except _Unconvertible as exc:
            # Not the upstream's connection: its answer, which a transform could not take. The client's stream
            # ends as when the core refuses its end: what a translation owes, then the error in its dialect.
            up.close()
            err = map_upstream_error(exc, flow.upstream.name if flow.upstream else "", mid_response=True)
            log.warning("the upstream's answer could not be converted", path=request.path, error=err.message)
            await self._fail(flow, err, ended)
            frame = (
                _refusal(transforms, err, flushed=flushed) if response.is_event_stream and not ended else None
            )
            return await self._end_with(request, flow, out, err, frame)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            up.close()
            if request.transport is None or request.transport.is_closing():
                # The write to the client failed: the client went away, the upstream did nothing wrong.
                flow.client_disconnected = True
                await self._fail(flow, None, ended)
                return out if out.prepared else web.Response(status=499)  # (nobody reads it)
            err = map_upstream_error(exc, flow.upstream.name if flow.upstream else "", mid_response=True)
            log.warning(
                "upstream failed mid-response",
                upstream=flow.upstream.name if flow.upstream else None,
                path=request.path,
                error=err.message,
                bytes_to_client=flow.bytes_to_client,
                after_done=ended,
            )
            if ended and pending is not None and response.is_event_stream:
                # After `[DONE]`, its record committed: the stream is whole. Only its end was held (for the
                # commit, then for the upstream's end of body, which did not come): the client gets it.
                return await self._end_held(request, flow, out, pending, flushed=flushed)
            return await self._fail_mid_response(request, flow, out, err, ended)
        except Exception as exc:
            up.close()
            log.error("relay failed", error=repr(exc), exc_info=exc)
            internal = InternalError("internal error while relaying the response")
            await self._fail(flow, internal, ended)
            if not out.prepared:
                return _json_web_response(internal.status, internal.body())
            if request.transport is not None:
                request.transport.close()
            return out

    async def _end_held(
        self, request: web.BaseRequest, flow: Flow, out: web.StreamResponse, held: bytes, *, flushed: bool
    ) -> web.StreamResponse:
        """End the client's stream with the bytes held from `[DONE]` on (and what the transforms still owe, when
        they were not `flushed` at the `[DONE]` already)."""
        response = flow.response
        assert response is not None
        final = _through(response.transforms, b"") if response.transforms and not flushed else b""
        if not out.prepared:
            await out.prepare(request)
        flow.bytes_to_client += len(held) + len(final)
        with contextlib.suppress(ConnectionResetError, aiohttp.ClientConnectionResetError):
            await out.write_eof(held + final)
        return out

    async def _answer_refused(
        self, request: web.BaseRequest, flow: Flow, out: web.StreamResponse, refused: BodyRefused
    ) -> web.StreamResponse:
        """A whole-body conversion refused the upstream's body: the client gets its status and JSON body, with
        none of the upstream's headers (its Content-Type, its Content-Encoding)."""
        response = flow.response
        assert response is not None
        response.status = refused.status
        if out.prepared:
            # (a transform before it sent bytes already: a body whose status left cannot say more)
            if request.transport is not None:
                request.transport.close()
            return out
        answer = web.Response(
            status=refused.status, body=refused.body, headers={"Content-Type": "application/json"}
        )
        await answer.prepare(request)
        flow.bytes_to_client += len(refused.body)
        return answer

    async def _fail_mid_response(
        self, request: web.BaseRequest, flow: Flow, out: web.StreamResponse, err: HttpError, ended: bool
    ) -> web.StreamResponse:
        """The exchange failed after the upstream's headers: the client gets `err` in the only way still open."""
        await self._fail(flow, err, ended)
        response = flow.response
        assert response is not None
        frame = None
        if response.is_event_stream and not ended:
            # In-band, as vLLM itself reports errors mid-stream: the SDKs raise it as an APIError. It goes
            # through the transforms like any event, so a translating addon speaks its client's dialect.
            frame = _through(response.transforms, b"data: " + json.dumps(err.body()).encode() + b"\n\n")
        return await self._end_with(request, flow, out, err, frame)

    async def _refuse(
        self, request: web.BaseRequest, flow: Flow, out: web.StreamResponse, *, flushed: bool
    ) -> web.StreamResponse:
        """`response_end` refused the end (`flow.error`, e.g. the record could not be committed): the client gets
        the error instead, so that the call does not look complete."""
        err, response = flow.error, flow.response
        assert err is not None
        assert response is not None
        frame = _refusal(response.transforms, err, flushed=flushed) if response.is_event_stream else None
        return await self._end_with(request, flow, out, err, frame)

    async def _end_with(
        self,
        request: web.BaseRequest,
        flow: Flow,
        out: web.StreamResponse,
        err: HttpError,
        frame: bytes | None,
    ) -> web.StreamResponse:
        """End the response with `err`: as the stream's last event (`frame`), as the answer itself when no byte of
        the body left yet, or else by cutting the connection (a body whose status went out cannot say more)."""
        if frame is not None:
            if not out.prepared:
                await out.prepare(request)
            flow.bytes_to_client += len(frame)
            with contextlib.suppress(ConnectionResetError, aiohttp.ClientConnectionResetError):
                await out.write_eof(frame)
        elif not out.prepared:
            flow.response = error_response(err)
            return await self._send_short(request, flow, end_hooks=False)
        elif request.transport is not None:
            request.transport.close()
        return out

    def _cancelled(self, flow: Flow) -> None:
        """Why a cancelled flow ended: its client left, unless the gateway is stopping (then no client left)."""
        if not self._stopping:
            flow.client_disconnected = True
        elif flow.error is None:  # (a refused commit, say, keeps its own error)
            flow.error = ShuttingDown("the gateway shut down before the call ended")

    async def _fail(self, flow: Flow, err: HttpError | None, ended: bool) -> None:
        """`error` fires instead of `response_end`: once the response was committed, a late failure is only noted."""
        if err is not None:
            flow.error = err
        if not ended:
            await self.addons.error(flow)


def _cut_by_us(flow: Flow) -> bool:
    """Whether a cancellation is the gateway's `Flow.abort` alone (then the client is still there to be answered,
    and the task is uncancelled); False when aiohttp cancelled it too (the client left, or shutdown)."""
    task = asyncio.current_task()
    return flow.abort_error is not None and task is not None and task.uncancel() == 0


def _after_blank_line(data: bytes) -> int:
    """Where the last event of `data` ends (past its blank line), -1 if none does. With CR line ends (legal SSE) a
    blank line is LF LF, CR CR or LF CR, CRLF included (CRLF CRLF holds LF CR); the end found with CR may be a byte
    short, which a size bound does not mind."""
    end = data.rfind(b"\n\n")
    if data.find(b"\r") >= 0:
        end = max(end, data.rfind(b"\r\r"), data.rfind(b"\n\r"))
    return end + 2 if end >= 0 else -1


def _converted(transforms: list[Transform], chunk: bytes) -> bytes:
    """`chunk` through the transforms (the client's view, a translation). They read the upstream's bytes: what one
    cannot take (a field of a type it does not expect, say) fails the call as any malformed upstream answer does,
    with an error the client can read and one record, never as a bug of the relay's (a cut stream, a traceback)."""
    try:
        for t in transforms:
            chunk = t(chunk)
        return chunk
    except Exception as exc:
        raise _unconvertible(exc) from exc


def _converted_end(transforms: list[Transform]) -> bytes:
    """What the transforms still owe at the end of the body, as `_converted`; a `BodyRefused` passes as it is."""
    try:
        return flush_transforms(transforms)
    except BodyRefused:
        raise
    except Exception as exc:
        raise _unconvertible(exc) from exc


def _refused_error(flow: Flow, refused: BodyRefused) -> UpstreamError:
    """The error a whole-body conversion's refusal leaves on its flow (and so in its record): the message of the
    refusal's JSON body, which says what the upstream's answer lacked."""
    try:
        body = json.loads(refused.body)
    except ValueError:
        body = None
    err = body.get("error") if isinstance(body, dict) else None
    message = err.get("message") if isinstance(err, dict) else None
    if not isinstance(message, str):
        message = f"its answer could not be converted for the client (HTTP {refused.status})"
    return UpstreamError(f"upstream {flow.upstream.name if flow.upstream else ''}: {message}")


class _Unconvertible(ProtocolError):
    """A transform raised on the upstream's bytes (`_converted`)."""


def _unconvertible(exc: Exception) -> _Unconvertible:
    return _Unconvertible(
        f"the upstream's answer could not be converted for the client ({type(exc).__name__}: {exc})"
    )


def _refusal(transforms: list[Transform], err: HttpError, *, flushed: bool) -> bytes:
    """The error event a stream ends with instead of its end, in the client's dialect: a transform that owes its
    client an end of its own (`refuse(err)`, e.g. the Anthropic translation) says it; the others pass it on."""
    frame = b"data: " + json.dumps(err.body()).encode() + b"\n\n"
    try:
        for t in transforms:
            refuse = getattr(t, "refuse", None)
            frame = refuse(err) if refuse is not None else t(frame)
        return frame if flushed else frame + flush_transforms(transforms)
    except Exception as exc:  # a transform that cannot take the error must not hide it from the client
        log.error("a transform failed on the refusal event", error=repr(exc), exc_info=exc)
        return b"data: " + json.dumps(err.body()).encode() + b"\n\n"


def _through(transforms: list[Transform], event: bytes) -> bytes:
    """`event` and then the end of the body through the transforms; the raw event if one of them fails."""
    try:
        out = event
        for t in transforms:
            out = t(out)
        return out + flush_transforms(transforms)
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


_NO_BODY = frozenset({204, 304})
"""Statuses no body may follow (HTTP/1.1 framing): the client reads the next response right after the headers."""


class _RequestHandler(RequestHandler):
    """aiohttp's protocol, but what its parser refuses (a bad request line, a header too long or holding a byte it
    will not take, bad chunking) is answered with the JSON error shape, saying what kind of error it was and never
    the client's bytes (aiohttp's plain-text 400 quoted the offending header line, an `Authorization` included)."""

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if self._request_count == 1 and isinstance(exc, BadHttpMethod):
            # Not HTTP at all on a connection's first bytes (TLS, a port scan): aiohttp's debug line, not ours.
            self.logger.debug("not an HTTP request", exc_info=exc)
        else:
            # (one warning line: `_MalformedRequests`)
            self.log_exception("Error handling request", exc_info=exc)
        if request.writer.output_size > 0:
            raise ConnectionError("a response was sent already: the connection is cut instead")
        kind = type(exc).__name__ if exc is not None else "error"
        err: HttpError = (
            BadRequest(f"malformed HTTP request ({kind})")
            if 400 <= status < 500
            else InternalError(f"internal error ({status})")
        )
        body = err.body()
        body["error"]["code"] = status
        answer = web.Response(status=status, body=json.dumps(body).encode(), content_type="application/json")
        answer.force_close()
        return answer


class _Server(web.Server):
    """aiohttp's low-level server with `_RequestHandler` as each connection's protocol."""

    def __call__(self) -> RequestHandler:
        return _RequestHandler(self, loop=self._loop, **self._kwargs)


class _RelayResponse(web.StreamResponse):
    """A streamed response whose headers leave with its first bytes (aiohttp sends them at once by default)."""

    _send_headers_immediately = False


def _bind(host: str, port: int, shared: bool = False) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if shared:  # `server.workers`: each worker binds the port, the kernel spreads the connections among them
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
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
