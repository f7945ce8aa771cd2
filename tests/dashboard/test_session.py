"""Dashboard sessions: random tokens, their CSRF token checked in constant time, bounded in number and in age."""

from __future__ import annotations

from agl_lite.dashboard.session import Sessions, tokens_match


def test_a_session_is_found_by_its_token_until_it_expires_or_is_dropped() -> None:
    now = [100.0]
    sessions = Sessions(ttl_s=60, clock=lambda: now[0])
    token, session = sessions.create()
    assert sessions.get(token) is session
    assert sessions.get("forged") is None
    assert sessions.get(None) is None
    now[0] += 61
    assert sessions.get(token) is None  # expired: gone
    token, _ = sessions.create()
    sessions.drop(token)
    assert sessions.get(token) is None


def test_tokens_and_csrf_tokens_are_random_and_checked() -> None:
    sessions = Sessions()
    (a, first), (b, second) = sessions.create(), sessions.create()
    assert a != b
    assert first.csrf != second.csrf
    assert len(a) >= 40
    assert first.csrf_ok(first.csrf)
    assert not first.csrf_ok(second.csrf)
    assert not first.csrf_ok(None)
    assert not first.csrf_ok("")


def test_the_oldest_session_goes_when_too_many_are_open() -> None:
    sessions = Sessions(max_sessions=2)
    oldest, _ = sessions.create()
    kept = [sessions.create()[0] for _ in range(2)]
    assert sessions.get(oldest) is None
    assert all(sessions.get(t) is not None for t in kept)


def test_tokens_match_only_the_same_token_and_take_any_text() -> None:
    assert tokens_match("abc", "abc")
    assert not tokens_match("abd", "abc")
    assert not tokens_match(None, "abc")
    assert not tokens_match("é", "abc")  # (a str compare_digest would raise on non-ASCII)
