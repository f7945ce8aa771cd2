"""Request bodies: parsed exactly as Python reads JSON (NaN, big integers, lone surrogates kept), else a 400; and
written again for the upstream only when an addon changed them, spliced or whole, to the same values.

orjson reads most bodies, but it turns integers beyond 64 bits into floats, silently changing what the client sent:
a body that may hold one goes to the stdlib parser (tests/core/test_jsoncodec.py).
"""

from __future__ import annotations

import orjson
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


# --- what goes upstream -----------------------------------------------------------------------------------------

CLIENT = b'{"model": "m",  "messages": [{"role": "user", "content": "h\\u00e9"}]}'
"""A client's body with spacing and an escape that orjson would write otherwise: spliced bytes keep both."""


def test_an_unchanged_body_goes_upstream_as_the_client_sent_it() -> None:
    req = _request(CLIENT)
    req.json()
    assert req.upstream_body() is req.body


def test_new_members_are_spliced_into_the_clients_bytes() -> None:
    req = _request(CLIENT)
    req.set_fields({"return_token_ids": True})
    req.set_fields({"logprobs": True})
    sent = req.upstream_body()
    assert sent == CLIENT[:-1] + b',"return_token_ids":true,"logprobs":true}'
    assert (
        orjson.loads(sent)
        == req.json()
        == {**orjson.loads(CLIENT), "return_token_ids": True, "logprobs": True}
    )
    assert req.body == CLIENT  # the client's bytes are kept as they came


def test_a_target_field_the_body_has_writes_it_whole_once_per_call() -> None:
    req = _request(CLIENT)
    req.set_fields({"return_token_ids": True})
    sent = req.upstream_body({"model": "served"})
    assert orjson.loads(sent) == {**orjson.loads(CLIENT), "return_token_ids": True, "model": "served"}
    assert req.json()["model"] == "m"  # one target's fields are its own, not the request's
    assert orjson.loads(req.upstream_body()) == {**orjson.loads(CLIENT), "return_token_ids": True}


def test_a_target_field_the_body_lacks_is_spliced_too() -> None:
    req = _request(CLIENT)
    req.set_fields({"return_token_ids": True})
    assert req.upstream_body({"x": 1}) == CLIENT[:-1] + b',"return_token_ids":true,"x":1}'


@pytest.mark.parametrize("fields", [{"model": "other"}, {"return_token_ids": True, "model": "other"}])
def test_changing_a_member_the_client_sent_writes_the_body_whole(fields: dict[str, object]) -> None:
    req = _request(CLIENT)
    req.set_fields(fields)
    sent = req.upstream_body()
    assert orjson.loads(sent) == {**orjson.loads(CLIENT), **fields}
    assert sent.count(b'"model"') == 1  # no duplicate member that a parser could read either way


def test_an_empty_object_gains_members_written_whole() -> None:
    req = _request(b"{ }")
    req.set_fields({"a": 1})
    assert orjson.loads(req.upstream_body()) == {"a": 1}
    assert orjson.loads(_request(b"{}").upstream_body({"b": 2})) == {"b": 2}


def test_a_replacement_is_written_once_and_members_are_spliced_onto_it() -> None:
    req = _request(CLIENT)
    req.replace_json({"model": "m", "prompt": "x"})
    assert req.body == CLIENT
    assert req.upstream_body() == b'{"model":"m","prompt":"x"}'
    req.set_fields({"return_token_ids": True})
    assert req.upstream_body() == b'{"model":"m","prompt":"x","return_token_ids":true}'
    assert req.json() == {"model": "m", "prompt": "x", "return_token_ids": True}


@pytest.mark.parametrize(
    "body",
    [
        b'{"x": NaN, "model": "m"}',
        b'{"x": 123456789012345678901234567890, "model": "m"}',
        b'{"x": "\\ud800", "model": "m"}',
    ],
)
def test_what_only_python_reads_is_written_back_to_the_same_values(body: bytes) -> None:
    """orjson would write NaN as null and refuses big integers and lone surrogates: the upstream must still read
    what the client sent, spliced, written whole or replaced."""
    import json

    expected = json.loads(body)
    for change in ({"return_token_ids": True}, {"model": "other"}):
        req = _request(body)
        req.set_fields(change)
        assert repr(json.loads(req.upstream_body())) == repr({**expected, **change})
    req = _request(body)
    req.replace_json({**req.json_object(), "y": 1})
    assert repr(json.loads(req.upstream_body({"model": "z"}))) == repr({**expected, "y": 1, "model": "z"})


@pytest.mark.parametrize("encoding", ["utf-16-be", "utf-16-le", "utf-32-be", "utf-8-sig"])
def test_members_reach_a_body_in_any_encoding_python_reads(encoding: str) -> None:
    """A UTF-16 or -32 body (the stdlib reads them, and so vLLM) cannot take UTF-8 members spliced in: written
    whole instead; a UTF-8 body with a BOM still takes them."""
    import json

    req = _request('{"model": "m", "n": 1}'.encode(encoding))
    req.set_fields({"return_token_ids": True})
    assert json.loads(req.upstream_body()) == {"model": "m", "n": 1, "return_token_ids": True}


def test_an_addons_nan_goes_upstream_as_nan() -> None:
    """orjson writes NaN and infinities as null: a member an addon sets to one is written by the stdlib."""
    import json

    req = _request(CLIENT)
    req.set_fields({"t": float("nan"), "x": [float("inf")]})
    sent = json.loads(req.upstream_body())
    assert sent["t"] != sent["t"]
    assert sent["x"] == [float("inf")]
