"""Upstream base URLs (issue #15, low): `POST /api/models` took endpoints that failed later with a 500 and a
traceback, and echoed `user:pw@` to agents in 502 bodies and records."""

from __future__ import annotations

import pytest

from agl_lite.core.upstream_urls import endpoint_problem


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8000/v1", "https://vllm.internal/v1", "http://[::1]:9/v1", "http://h"]
)
def test_a_plain_http_url_with_a_host_is_an_endpoint(url: str) -> None:
    assert endpoint_problem(url) is None


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://user:pw@vllm:8000/v1", "credentials"),
        ("http://token@vllm/v1", "credentials"),
        ("ftp://vllm/v1", "http"),
        ("http:///v1", "host[:port]"),
        ("http://", "host[:port]"),
        ("http://vllm:99999/v1", "port 1-65535"),
        ("http://vllm:port/v1", "host[:port]"),
        ("http://vllm/v1?x=1", "no query"),
        ("http://vllm/v1#f", "fragment"),
        ("http://vl lm/v1", "spaces"),
        ("http://vllm/v1\n", "spaces"),
        ("http://\u00e9t\u00e9/v1", "plain ASCII"),
    ],
)
def test_anything_else_says_why(url: str, why: str) -> None:
    problem = endpoint_problem(url)
    assert problem is not None
    assert why in problem
    assert "pw" not in problem
