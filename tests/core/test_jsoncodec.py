"""The JSON limits every request body is parsed under: as Python reads it, nested at most MAX_JSON_DEPTH deep."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agl_lite.core.jsoncodec import MAX_JSON_DEPTH, check_json_depth, loads, loads_or_none, loads_storable
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


def same(a: Any, b: Any) -> bool:
    """Equal values of equal types all the way down (1 and 1.0 differ; NaN equals NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


BOUNDS = [2**63 - 1, -(2**63), 2**63, -(2**63) - 1, 2**64 - 1, 2**64, 10**18, -(10**18), 10**19, 10**30]
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from(BOUNDS)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None)
@given(value=JSON_VALUES, ascii_only=st.booleans())
def test_any_body_reads_as_the_stdlib_reads_it(value: Any, ascii_only: bool) -> None:
    """The orjson path gives exactly the stdlib's values: big integers stay integers, floats stay floats, and what
    only Python accepts (NaN, infinities, lone surrogates) still parses."""
    body = json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    assert same(loads(body), json.loads(body))


@pytest.mark.parametrize("number", [str(2**64), str(-(2**63) - 1), "1" * 40])
def test_an_integer_the_store_would_change_is_refused_not_stored_as_a_float(number: str) -> None:
    # Issue #15 (low): orjson read it as a float, and the store answered 201 with another number.
    with pytest.raises(BadRequest, match="does not fit 64 bits"):
        loads_storable(f'{{"data": {{"x": {number}}}}}'.encode())


@pytest.mark.parametrize("body", [b'{"x": 18446744073709551615}', b'{"id": "12345678901234567890123"}'])
def test_what_fits_64_bits_and_long_digit_strings_are_read_as_they_are(body: bytes) -> None:
    assert loads_storable(body) == json.loads(body)


@pytest.mark.parametrize(
    ("raw", "want"),
    [(None, None), (b"", None), (b"{oops", None), (b'{"a": [1]}', {"a": [1]}), (b"null", None)],
)
def test_loads_or_none_reads_what_is_json_and_nothing_else(raw: bytes | None, want: Any) -> None:
    assert loads_or_none(raw) == want
