"""The JSON limits every request body is parsed under: as Python reads it, nested at most MAX_JSON_DEPTH deep."""

from __future__ import annotations

import math

import pytest

from agl_lite.core.json_limits import MAX_JSON_DEPTH, check_json_depth, loads
from agl_lite.errors import BadRequest


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def test_a_body_at_the_depth_bound_parses() -> None:
    obj = loads(nested(MAX_JSON_DEPTH))
    for _ in range(MAX_JSON_DEPTH - 1):
        (obj,) = obj
    assert obj == []


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 300, 5_000, 100_000])
def test_a_body_past_the_depth_bound_is_a_400(depth: int) -> None:
    with pytest.raises(BadRequest, match=f"deeper than {MAX_JSON_DEPTH} levels"):
        loads(nested(depth))


def test_depth_counts_objects_and_arrays_alike() -> None:
    body = b'{"a": [' * 70 + b"1" + b"]}" * 70  # 140 levels, half of each
    with pytest.raises(BadRequest):
        loads(body)


def test_a_wide_body_with_many_brackets_but_little_depth_parses() -> None:
    body = b"[" + b",".join([b"[[1]]"] * 1000) + b"]"
    assert len(loads(body)) == 1000


def test_python_only_values_are_read_as_python_reads_them() -> None:
    obj = loads(b'{"a": NaN, "b": 123456789012345678901234567890, "c": "\\ud800"}')
    assert math.isnan(obj["a"])
    assert (obj["b"], obj["c"]) == (123456789012345678901234567890, "\ud800")


@pytest.mark.parametrize("body", [b"{", b"\xff\xfe", b'{"a": 1,}'])
def test_invalid_json_is_a_400(body: bytes) -> None:
    with pytest.raises(BadRequest, match="not valid JSON"):
        loads(body)


def test_check_json_depth_takes_an_object_parsed_elsewhere() -> None:
    check_json_depth({"a": [1]}, b'{"a": [1]}')
    with pytest.raises(BadRequest):
        check_json_depth([[[[]]]], b"[[[[]]]]", limit=3)
