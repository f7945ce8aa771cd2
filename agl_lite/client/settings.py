"""Where the client connects and with which key: from arguments, else the environment (`AGL_URL`, `AGL_KEY`).

Also the explicit timeouts (no total cap: a long-poll or a drain may rightly take minutes). No I/O here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from yarl import URL

from agl_lite.errors import ConfigError

__all__ = ["DEFAULT_URL", "ClientSettings", "Timeouts"]

DEFAULT_URL = "http://127.0.0.1:8100"
"""Where `agl-lite run` listens with the shipped config."""


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect_s: float = 10.0
    """Longest wait for a TCP connection, in seconds."""
    read_s: float = 60.0
    """Longest silence while reading an answer, in seconds; long-polls add their own wait to it."""


@dataclass(frozen=True, slots=True)
class ClientSettings:
    url: str
    """The gateway's base URL, without a trailing slash."""
    key: str | None
    """The admin key (`AGL_KEY`); None works only for public routes (`/healthz`)."""
    timeouts: Timeouts = Timeouts()

    @classmethod
    def resolve(
        cls, url: str | None = None, key: str | None = None, timeouts: Timeouts | None = None
    ) -> ClientSettings:
        """Arguments win over `AGL_URL` / `AGL_KEY`; the URL defaults to the local gateway."""
        raw = url or os.environ.get("AGL_URL") or DEFAULT_URL
        try:
            parsed = URL(raw)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"invalid gateway URL {raw!r}: {exc}") from None
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ConfigError(f"invalid gateway URL {raw!r}: use http://HOST:PORT or https://HOST")
        return cls(raw.rstrip("/"), key or os.environ.get("AGL_KEY") or None, timeouts or Timeouts())
