"""The one JSON codec of request bodies: how they are read (within one nesting bound), and how a changed body is
written again for the upstream.

Reading. One bound for every body the gateway parses (LLM calls through `Request.json`, the store API through its
payload models). Why: a body that parses can still fail later — orjson, which the store serialises with, stops at
254 levels, and the stdlib parser recurses until Python's own limit — and then it fails after the upstream answered
(a captured call the store cannot hold) or after the store took the write (a 500). Refusing it up front with a 400
keeps "bad input changes nothing".

Writing. A body is written again only when an addon changed it (`Request.set_fields`, `Request.replace_json`), once
per upstream attempt: new top-level members are spliced into the original bytes (a long context is not encoded
again); anything else is encoded whole by orjson, or by the stdlib when the body holds what only Python reads, so
that the upstream reads the values the client sent. Must not do I/O.
"""

from __future__ import annotations

import json
import math
from typing import Any

import orjson

from agl_lite.errors import BadRequest

__all__ = [
    "MAX_JSON_DEPTH",
    "check_json_depth",
    "dumps",
    "has_non_finite",
    "loads",
    "loads_or_none",
    "loads_storable",
    "parse",
    "with_members",
]

MAX_JSON_DEPTH = 128
"""Most nested arrays/objects a request body may hold (the store wraps bodies in a few levels of its own)."""


_DIGITS = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
"""A `bytes.translate` table: every digit becomes `0`, anything else a space."""
_RISKY_RUN = b"0" * 19
"""A run of 19 digits: an integer that may not fit 64 bits, which orjson would read as a float."""


def loads(body: bytes) -> Any:
    """The body as Python (and so vLLM) reads it, within the depth bound; any problem is a 400 that says which."""
    return parse(body)[0]


def loads_or_none(raw: bytes | None) -> Any:
    """`raw` parsed by orjson, or None when it is empty or not JSON (an answer to read what it can of)."""
    if not raw:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def parse(body: bytes) -> tuple[Any, bool]:
    """The body as Python (and so vLLM) reads it — `NaN`, integers of any size, lone surrogates included — within
    the depth bound, and whether it was read by the stdlib parser (so must be written by the stdlib encoder, see
    `dumps`); any problem is a 400 that says which.

    orjson reads the common body five times faster than the stdlib and to the same values, except that it reads
    an integer past 64 bits as a float, and refuses what only Python accepts (`NaN`, lone surrogates, a BOM,
    UTF-16): a body with a 19-digit run, or one orjson refuses, goes to the stdlib parser.
    """
    if body.translate(_DIGITS).find(_RISKY_RUN) < 0:
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError:
            pass
        else:
            check_json_depth(obj, body)
            return obj, False
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from exc
    except RecursionError:  # thousands of nested brackets: the parser's own stack gave up
        raise BadRequest(f"request body nests deeper than {MAX_JSON_DEPTH} levels") from None
    check_json_depth(obj, body)
    return obj, True


def dumps(obj: Any, *, python_only: bool = False) -> bytes:
    """`obj` as compact JSON for an upstream. orjson unless `python_only` (the value came from the stdlib parser):
    orjson writes `NaN` as `null` and refuses integers past 64 bits and lone surrogates, which the stdlib writes
    back as the client sent them."""
    if not python_only:
        try:
            return orjson.dumps(obj)
        except TypeError:  # (orjson.JSONEncodeError is one) what only Python writes: big integers, surrogates
            pass
    return json.dumps(obj, separators=(",", ":")).encode()


def has_non_finite(value: Any) -> bool:
    """Whether `value` holds a NaN or an infinity, which orjson writes as `null` (so `dumps` must be told)."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(has_non_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(has_non_finite(v) for v in value)
    return False


def with_members(raw: bytes, members: dict[str, Any], *, python_only: bool = False) -> bytes | None:
    """`raw`, the bytes of a JSON object with at least one member and none of `members`' keys, with `members` added
    at its end and its other bytes unchanged; None when `raw` does not end as an object (the caller then encodes
    the whole body)."""
    raw = raw.rstrip()
    if not raw.endswith(b"}"):
        return None
    if python_only and json.detect_encoding(raw) not in ("utf-8", "utf-8-sig"):
        return None  # UTF-16 or -32, which only the stdlib reads: UTF-8 members cannot go inside it
    return raw[:-1] + b"," + dumps(members, python_only=python_only)[1:]


def loads_storable(body: bytes) -> Any:
    """The body parsed for the store (which serialises with orjson): an integer past 64 bits, which orjson would
    have read as a float and stored changed, is a 400 instead."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from exc
    if body.translate(_DIGITS).find(_RISKY_RUN) >= 0:  # (rare: a 19-digit run, in a string or a number)
        try:
            json.loads(body, parse_int=_int64)
        except _TooBig as exc:
            raise BadRequest(
                f"integer {exc.args[0][:40]}... does not fit 64 bits; send it as a string"
            ) from None
        except (ValueError, RecursionError):
            pass  # orjson read it: the bound below and its own checks decide
    check_json_depth(obj, body)
    return obj


class _TooBig(Exception):
    pass


def _int64(digits: str) -> int:
    value = int(digits)
    if not -(2**63) <= value < 2**64:
        raise _TooBig(digits)
    return value


def check_json_depth(obj: Any, body: bytes, limit: int = MAX_JSON_DEPTH) -> None:
    """400 when `obj` (parsed from `body`) nests deeper than `limit`.

    A body with fewer than `limit` brackets cannot nest that deep: counted in C, that skips the walk for almost
    every request, so the LLM hot path pays two byte scans.
    """
    if body.count(b"{") + body.count(b"[") <= limit:
        return
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        if depth > limit:
            raise BadRequest(f"request body nests deeper than {limit} levels")
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
