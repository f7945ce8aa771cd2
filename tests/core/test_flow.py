"""Request body parsing: exactly as Python reads JSON (NaN, big integers, lone surrogates kept), else a 400.

orjson reads most bodies, but it turns integers beyond 64 bits into floats, silently changing what the client sent:
a body that may hold one goes to the stdlib parser (tests/core/test_json_limits.py).
"""

from __future__ import annotations

import pytest
from multidict import CIMultiDict

from agl_lite.core.flow import Request
from agl_lite.errors import BadRequest


def _request(body: bytes) -> Request:
    return Request("POST", "/v1/chat/completions", "", CIMultiDict(), body)


def test_json_is_parsed_once_and_cached() -> None:
    req = _request(b'{"model": "m", "n": 2}')
    first = req.json()
    assert first == {"model": "m", "n": 2}
    assert req.json() is first


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"x": NaN}', "nan"),  # Python clients send NaN
        (b'{"x": 123456789012345678901234567890}', 123456789012345678901234567890),
        (b'{"x": "\\ud800"}', "\ud800"),  # a lone surrogate
    ],
)
def test_json_is_read_as_python_reads_it(body: bytes, expected: object) -> None:
    value = _request(body).json_object()["x"]
    if expected == "nan":
        assert value != value  # NaN
    else:
        assert value == expected


@pytest.mark.parametrize("body", [b"{", b"not json", b'{"a": 1,}', b"\xff\xfe"])
def test_invalid_json_is_a_400_that_says_so(body: bytes) -> None:
    with pytest.raises(BadRequest, match="request body is not valid JSON"):
        _request(body).json()


def test_a_non_object_body_is_a_400() -> None:
    with pytest.raises(BadRequest, match="must be a JSON object"):
        _request(b"[1, 2]").json_object()
