"""Dashboard sessions: the admin key, given once to the login form, exchanged for a random token kept in an
`HttpOnly`, `SameSite=Strict` cookie, so that the key never sits in a URL, a page or the browser's storage.

Each session carries its own CSRF token, which every form that changes state sends back. Sessions live in the
gateway's memory (a restart logs everyone out) and are bounded in number and in age.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["COOKIE", "Session", "Sessions", "tokens_match"]

COOKIE = "agl_dashboard"
"""The session cookie's name."""


@dataclass(slots=True)
class Session:
    csrf: str
    """What a state-changing form must send back (`csrf` field)."""
    expires: float

    def csrf_ok(self, given: str | None) -> bool:
        return tokens_match(given, self.csrf)


def tokens_match(given: str | None, expected: str) -> bool:
    """`given` is `expected`, compared in constant time. (As bytes: `compare_digest` refuses a non-ASCII str with a
    TypeError, and a form may send anything.)"""
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


class Sessions:
    """Sessions by token; the oldest goes when `max_sessions` are open, an expired one on its next use."""

    def __init__(
        self, ttl_s: float = 8 * 3600, max_sessions: int = 1000, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl_s = ttl_s
        self.max_sessions = max_sessions
        self._clock = clock
        self._by_token: dict[str, Session] = {}

    def create(self) -> tuple[str, Session]:
        if len(self._by_token) >= self.max_sessions:
            self._by_token.pop(next(iter(self._by_token)))
        token = secrets.token_urlsafe(32)
        session = self._by_token[token] = Session(secrets.token_urlsafe(24), self._clock() + self.ttl_s)
        return token, session

    def get(self, token: str | None) -> Session | None:
        session = self._by_token.get(token) if token else None
        if session is not None and session.expires <= self._clock():
            del self._by_token[token]  # type: ignore[arg-type]
            return None
        return session

    def drop(self, token: str | None) -> None:
        if token:
            self._by_token.pop(token, None)
