"""HTTP to the gateway: one aiohttp session, explicit timeouts, JSON in and out, errors mapped to the client's
typed errors, and retries — only for requests the caller marks idempotent.

It knows nothing of routes or records; `client.py` does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson

from agl_lite.client.errors import (
    ApiError,
    ClientError,
    ConnectionFailed,
    RateLimitedError,
    RequestTimeout,
    ServerError,
    UnavailableError,
    error_from_response,
)
from agl_lite.client.retry import RetryPolicy
from agl_lite.client.settings import ClientSettings

__all__ = ["Transport", "path"]

Params = Mapping[str, str | int | float]


def path(template: str, *segments: str) -> str:
    """`path("/api/rollouts/{}/events", rid)` with each segment quoted (ids never become extra path parts)."""
    return template.format(*(quote(s, safe="") for s in segments))


def _retryable(exc: ClientError) -> bool:
    return isinstance(
        exc, ConnectionFailed | RequestTimeout | RateLimitedError | UnavailableError | ServerError
    )


class Transport:
    """Sends requests to one gateway. The session is made on first use, in the loop that uses it."""

    def __init__(
        self,
        settings: ClientSettings,
        retry: RetryPolicy,
        trace_configs: Sequence[aiohttp.TraceConfig] = (),
    ) -> None:
        self.settings = settings
        self.retry = retry
        self._trace_configs = list(trace_configs)
        self._session: aiohttp.ClientSession | None = None
        self.requests = 0
        """Requests sent, retries included."""
        self.retries = 0

    def _session_now(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            t = self.settings.timeouts
            headers = {"Accept": "application/json", "User-Agent": "agl-lite-client"}
            if self.settings.key:
                headers["Authorization"] = f"Bearer {self.settings.key}"
            self._session = aiohttp.ClientSession(
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=None, connect=t.connect_s, sock_read=t.read_s),
                trace_configs=self._trace_configs or None,
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(
        self,
        method: str,
        route: str,
        *,
        body: Any = None,
        params: Params | None = None,
        idempotent: bool,
        wait_s: float = 0.0,
        as_bytes: bool = False,
    ) -> Any:
        """The decoded JSON answer of `method route` (its bytes with `as_bytes`, e.g. NDJSON); `wait_s` is how long the
        server may rightly stay silent (a long-poll, a drain) on top of the read timeout. Idempotent requests are
        retried per the policy."""
        retry = 0
        while True:
            try:
                return await self._once(method, route, body, params, wait_s, as_bytes)
            except ClientError as exc:
                if not idempotent or not _retryable(exc) or retry + 1 >= self.retry.attempts:
                    raise
                delay = self.retry.delay(retry, exc.retry_after if isinstance(exc, ApiError) else None)
                retry += 1
                self.retries += 1
                await self.retry.sleep(delay)

    async def _once(
        self, method: str, route: str, body: Any, params: Params | None, wait_s: float, as_bytes: bool = False
    ) -> Any:
        url = self.settings.url + route
        extra: dict[str, Any] = {}
        if wait_s:  # only then: `timeout=None` would switch every timeout off
            t = self.settings.timeouts
            extra["timeout"] = aiohttp.ClientTimeout(
                total=None, connect=t.connect_s, sock_read=t.read_s + wait_s
            )
        if body is not None:
            extra["data"] = orjson.dumps(body)
            extra["headers"] = {"Content-Type": "application/json"}
        query = {k: str(v) for k, v in params.items()} if params else None
        self.requests += 1
        try:
            async with self._session_now().request(method, url, params=query, **extra) as resp:
                raw = await resp.read()
                status, retry_after = resp.status, resp.headers.get("Retry-After")
        except aiohttp.ConnectionTimeoutError as exc:
            raise ConnectionFailed(f"cannot reach {self.settings.url}: connection timed out") from exc
        except TimeoutError as exc:
            raise RequestTimeout(f"{method} {route}: no answer from {self.settings.url} in time") from exc
        except aiohttp.ClientConnectorError as exc:
            raise ConnectionFailed(f"cannot reach {self.settings.url}: {exc.strerror or exc}") from exc
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            raise ConnectionFailed(
                f"{method} {route}: connection to {self.settings.url} lost ({exc})"
            ) from exc
        except aiohttp.ClientError as exc:
            raise ClientError(f"{method} {route}: {exc}") from exc
        if status >= 400:
            try:
                decoded: Any = orjson.loads(raw)
            except orjson.JSONDecodeError:
                decoded = raw.decode("utf-8", "replace")
            raise error_from_response(status, decoded, retry_after)
        if as_bytes:
            return raw
        try:
            return orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError as exc:
            raise ClientError(
                f"{method} {route}: the server answered {status} with a body that is not JSON"
            ) from exc
