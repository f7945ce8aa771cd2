"""Request bodies sent with a `Content-Encoding`: decoded here, once, with the body size cap applied to what they
decode to (a few KiB of gzip can decode to gigabytes).

aiohttp's own decoding is off (`auto_decompress=False` in `core.server`): it answered a body that does not decode with
a plain-text 500 and a traceback, and capped only the encoded bytes.
"""

from __future__ import annotations

import zlib

from agl_lite.errors import BadRequest, PayloadTooLarge, UnsupportedMediaType

__all__ = ["decode_body"]

_WBITS = {"gzip": 31, "x-gzip": 31, "deflate": 15}
"""zlib's window bits per encoding: 31 reads the gzip container, 15 the zlib one (what HTTP calls deflate)."""
_STEP = 1 << 20


def decode_body(content_encoding: str, body: bytes, limit: int) -> bytes:
    """`body` decoded from `content_encoding` (a list, applied in order); at most `limit` bytes of it."""
    codings = [c.strip().lower() for c in content_encoding.split(",")]
    codings = [c for c in codings if c and c != "identity"]
    for coding in reversed(codings):
        wbits = _WBITS.get(coding)
        if wbits is None:
            raise UnsupportedMediaType(
                f"Content-Encoding {coding[:40]!r} is not supported: send gzip, deflate or identity"
            )
        body = _inflate(body, coding, wbits, limit)
    return body


def _inflate(data: bytes, coding: str, wbits: int, limit: int) -> bytes:
    inflater = zlib.decompressobj(wbits)
    out: list[bytes] = []
    size = 0
    try:
        chunk = inflater.decompress(data, _STEP)
        while True:
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"request body exceeds {limit} bytes once decoded")
            out.append(chunk)
            if not inflater.unconsumed_tail:
                break
            chunk = inflater.decompress(inflater.unconsumed_tail, _STEP)
        tail = inflater.flush()
    except zlib.error as exc:
        raise BadRequest(f"request body is not valid {coding} ({exc})") from exc
    if size + len(tail) > limit:
        raise PayloadTooLarge(f"request body exceeds {limit} bytes once decoded")
    if not inflater.eof:
        raise BadRequest(f"request body is not valid {coding} (it ends before its end)")
    if inflater.unused_data:
        raise BadRequest(f"request body is not valid {coding} (bytes past its end)")
    out.append(tail)
    return b"".join(out)
