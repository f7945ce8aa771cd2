"""Request bodies with a Content-Encoding: decoded once, capped on what they decode to, refused as JSON otherwise."""

from __future__ import annotations

import gzip
import zlib

import pytest

from agl_lite.core.encoding import decode_body
from agl_lite.errors import BadRequest, PayloadTooLarge, UnsupportedMediaType

BODY = b'{"model": "m", "messages": []}'


@pytest.mark.parametrize(
    ("encoding", "encoded"),
    [
        ("gzip", gzip.compress(BODY)),
        ("x-gzip", gzip.compress(BODY)),
        ("deflate", zlib.compress(BODY)),
        ("identity", BODY),
        ("GZip", gzip.compress(BODY)),
        ("deflate, gzip", gzip.compress(zlib.compress(BODY))),
        ("identity, gzip", gzip.compress(BODY)),
    ],
)
def test_what_an_encoding_encoded_decodes_to_the_body(encoding: str, encoded: bytes) -> None:
    assert decode_body(encoding, encoded, 1 << 20) == BODY


@pytest.mark.parametrize(
    "encoded",
    [BODY, gzip.compress(BODY)[:-3], gzip.compress(BODY) + b"junk", zlib.compress(BODY), b""],
)
def test_a_body_that_is_not_what_its_encoding_says_is_a_bad_request(encoded: bytes) -> None:
    with pytest.raises(BadRequest, match="not valid gzip"):
        decode_body("gzip", encoded, 1 << 20)


def test_the_size_cap_applies_to_the_decoded_bytes() -> None:
    bomb = gzip.compress(b"0" * (8 << 20))  # 8 MiB from a few KiB
    assert len(bomb) < 64 << 10
    with pytest.raises(PayloadTooLarge, match="once decoded"):
        decode_body("gzip", bomb, 1 << 20)
    assert len(decode_body("gzip", bomb, 8 << 20)) == 8 << 20


@pytest.mark.parametrize("encoding", ["br", "zstd", "compress", "gzip, br"])
def test_other_encodings_are_unsupported(encoding: str) -> None:
    with pytest.raises(UnsupportedMediaType, match="not supported"):
        decode_body(encoding, BODY, 1 << 20)
