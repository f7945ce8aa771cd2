"""Opening upstream responses: one connection pool per process (`http1`), explicit timeouts, hop-by-hop headers
dropped.

`Upstream.open` tries the flow's targets in order and returns the first usable response; it retries only on
connect failures and the configured statuses, i.e. always before any byte reached the client. It never reads
the body (the relay in `server.py` streams it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping

import structlog
from multidict import CIMultiDict

from agl_lite.core.config import UpstreamConfig
from agl_lite.core.flow import Flow, UpstreamTarget
from agl_lite.core.http1 import ConnectError, ConnectionPool, HttpResponse, ProtocolError
from agl_lite.errors import UpstreamError, UpstreamTimeout

__all__ = ["HOP_BY_HOP", "Upstream", "filter_headers", "map_upstream_error"]

log = structlog.get_logger("agl_lite.upstream")

HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "Proxy-Connection",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
        "Host",
        "Content-Length",
    )
)
"""Headers that describe one connection, not the message; never relayed in either direction."""

_DROP_UPSTREAM = HOP_BY_HOP | {"authorization", "x-api-key", "accept-encoding", "expect"}
"""Never forwarded upstream: hop-by-hop headers, the client's key (the upstream gets its own), its encodings, and
its `Expect` (the gateway answered it, and holds the whole body before it forwards anything)."""


def filter_headers(
    headers: Mapping[str, str] | Iterable[tuple[str, str]], *, drop: frozenset[str] = frozenset()
) -> CIMultiDict[str]:
    """A copy without hop-by-hop headers (and without the extra names in `drop`, lower-case)."""
    items = headers.items() if isinstance(headers, Mapping) else headers
    return CIMultiDict((k, v) for k, v in items if (kl := k.lower()) not in HOP_BY_HOP and kl not in drop)


class Upstream:
    def __init__(self, config: UpstreamConfig) -> None:
        self.config = config
        self._pool: ConnectionPool | None = None

    async def start(self) -> None:
        self._pool = ConnectionPool(
            max_connections=self.config.max_connections,
            keepalive_timeout=self.config.keepalive_timeout,
            connect_timeout=self.config.connect_timeout,
            read_timeout=self.config.read_timeout,
        )

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    @property
    def pool(self) -> ConnectionPool:
        if self._pool is None:
            raise RuntimeError("Upstream.start() was not awaited")
        return self._pool

    async def open(self, flow: Flow) -> HttpResponse:
        """The first usable upstream response for the flow; UpstreamError when every target failed. Each attempt is
        counted with its target's observer from here to its end: a failed one here, the one that answered in
        `finish`."""
        targets = flow.upstreams
        client_headers = flow.request.headers.items()
        last_error: UpstreamError | None = None
        for i, target in enumerate(targets):
            last = i == len(targets) - 1
            # One pass, no copies: drop hop-by-hop headers, the client's key, and whatever the target sets itself.
            drop = _DROP_UPSTREAM | {k.lower() for k in target.headers} if target.headers else _DROP_UPSTREAM
            headers = [(k, v) for k, v in client_headers if k.lower() not in drop]
            headers.append(("Accept-Encoding", "identity"))
            headers.extend(target.headers.items())
            body = flow.request.upstream_body(target.json_patch)
            if target.observer is not None:
                target.observer.attempt_started(target)
            flow.upstream = target  # the record names it even when the client leaves before its answer
            try:
                resp = await self.pool.request(flow.request.method, target.url, headers, body)
            except asyncio.CancelledError:  # the client left: not the upstream's fault, and no attempt leaks
                self._ended(target, ok=True)
                raise
            except (TimeoutError, OSError) as exc:
                last_error = map_upstream_error(exc, target.name)
                self._ended(target, ok=False)
                log.warning(
                    "upstream attempt failed",
                    upstream=target.name,
                    error=last_error.message,
                    retrying=not last,
                )
                if not last:
                    flow.retried.append((target.name, last_error.type))
                continue
            if resp.status in self.config.retry_on_status and not last:
                log.warning("upstream answered a retryable status", upstream=target.name, status=resp.status)
                resp.release()
                self._ended(target, ok=False)
                last_error = UpstreamError(f"upstream {target.name} answered {resp.status}")
                flow.retried.append((target.name, f"http_{resp.status}"))
                continue
            return resp
        raise last_error or UpstreamError("no upstream is configured for this request")

    def finish(self, flow: Flow, resp: HttpResponse) -> None:
        """End the attempt that answered: its connection goes back to the pool if the body was read whole (a
        partly read one is closed, never reused), and its observer hears how it ended."""
        resp.release()
        if flow.upstream is not None:
            self._ended(flow.upstream, ok=not isinstance(flow.error, UpstreamError))

    @staticmethod
    def _ended(target: UpstreamTarget, *, ok: bool) -> None:
        if target.observer is not None:
            target.observer.attempt_ended(target, ok=ok)


def map_upstream_error(exc: BaseException, name: str, *, mid_response: bool = False) -> UpstreamError:
    """The agl-lite error for a failure talking to upstream `name` (no secrets in the message)."""
    when = " mid-response" if mid_response else ""
    if isinstance(exc, asyncio.TimeoutError):
        return UpstreamTimeout(f"upstream {name} timed out{when}")
    if isinstance(exc, ConnectError):
        return UpstreamError(f"cannot connect to upstream {name}: {exc.os_error.strerror or exc.os_error}")
    if isinstance(exc, ProtocolError):  # its message is ours, and says what the upstream did wrong
        return UpstreamError(f"upstream {name} failed{when}: {exc}")
    return UpstreamError(f"upstream {name} failed{when}: {type(exc).__name__}")
