"""The capture path's scans in C answer exactly what their Python twins answer: on every real vLLM capture cut
into reads, on generated and corrupted chat streams, and on bytes made of the very pieces the scans look for.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agl_lite.capture import assemble, native
from tests.capture.test_assemble import MALFORMED, chat_streams, text_delta

_native: ModuleType | None
try:
    from agl_lite.capture import _native
except ImportError:
    _native = None

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32-cpu"
CAPTURES = sorted(p for p in FIXTURES.iterdir() if p.suffix in (".sse", ".json"))
MARKERS = [b'"choices":[]', b'"delta":{}', b'"logprobs":{', b"\r", b"", b"token_ids"]
LEAD = (
    b'{"id":"a","object":"chat.completion.chunk","created":1,"model":"m","choices":[' + assemble._DELTA_TEXT
)

needs_native = pytest.mark.skipif(_native is None, reason="the C extension is not built here")


def buildable() -> bool:
    """A C compiler and Python's headers: what `pip install` needs to build the extension."""
    cc = str(sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(cc) is not None and (Path(sysconfig.get_paths()["include"]) / "Python.h").exists()


def test_the_extension_is_built_wherever_it_can_be() -> None:
    assert _native is not None or not buildable(), (
        "a C compiler is here, yet agl_lite.capture._native is missing"
    )


@needs_native
def test_the_c_scans_are_used_unless_the_environment_says_no() -> None:
    wanted = os.environ.get("AGL_NATIVE", "1") != "0"
    assert native.NATIVE is wanted
    assert (native.strip_ids is _native.strip_ids) is wanted  # type: ignore[union-attr]
    code = "from agl_lite.capture import native; print(native.NATIVE, native.strip_ids.__module__)"
    without = {k: v for k, v in os.environ.items() if k != "AGL_NATIVE"}
    for env, answer in (
        ({**without, "AGL_NATIVE": "0"}, ["False", "agl_lite.capture.native"]),
        (without, ["True", "agl_lite.capture._native"]),
    ):
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        assert out.stdout.split() == answer


def outcome(fn: Callable[..., Any], *args: Any) -> Any:
    """What a call returns, or the type of what it raised: both twins must agree on either."""
    try:
        return fn(*args)
    except (TypeError, ValueError) as exc:
        return type(exc)


def same_scans(data: bytes, lead: bytes = LEAD) -> None:
    assert _native is not None
    assert _native.strip_ids(data) == native.py_strip_ids(data)
    for marker in MARKERS:
        assert _native.find(data, marker) == native.py_find(data, marker), marker
    assert _native.text_runs(data, lead) == native.py_text_runs(data, lead)


def lead_of(stream: bytes) -> bytes:
    """The lead `Assembly` would pass for this stream (the first event's head, then a text delta's start)."""
    first = stream[6:].split(b"\n\n", 1)[0]
    k = first.find(b',"choices":[')
    return first[: k + 12] + assemble._DELTA_TEXT if k >= 0 else LEAD


@needs_native
@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.name)
def test_real_captures_scan_the_same_whole_and_in_reads(path: Path) -> None:
    raw = path.read_bytes()
    same_scans(raw, lead_of(raw))
    for size in (1, 7, 61, 500):
        for at in range(0, len(raw), size):
            same_scans(raw[at : at + size], lead_of(raw))


@needs_native
@settings(max_examples=300, deadline=None)
@given(stream=chat_streams())
def test_generated_chat_streams_scan_the_same(stream: tuple[bytes, bytes]) -> None:
    raw = b"".join(stream)
    same_scans(raw, lead_of(raw))


@needs_native
@pytest.mark.parametrize("raw", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_streams_scan_the_same(raw: bytes) -> None:
    same_scans(raw, lead_of(raw))


PIECES = st.sampled_from(
    [
        b'token_ids":[',
        b'"token_ids":[',
        b'{"token_ids":[',
        b',"prompt_token_ids":[',
        b"prompt_",
        b"{",
        b",",
        b'"',
        b"\\",
        b"[",
        b"]",
        b"]}]}",
        b"0",
        b"17",
        b"\n",
        b"\n\n",
        b"\n\ndata: ",
        b"data: ",
        b"[DONE]",
        b"\r",
        b"x",
        b"\xe9",
        b'"},"logprobs":null,"finish_reason":null,"token_ids":[',
        b'"choices":[]',
        b'"delta":{}',
        LEAD,
    ]
)
"""The bytes the scans look for, their neighbours, and the separators they cut at."""


@needs_native
@settings(max_examples=1500, deadline=None)
@given(pieces=st.lists(PIECES | st.binary(max_size=4), max_size=40), framed=st.booleans())
def test_bytes_made_of_the_scanned_pieces_scan_the_same(pieces: list[bytes], framed: bool) -> None:
    data = b"".join(pieces)
    if framed:  # as Assembly calls text_runs: whole `data:` events
        data = b"data: " + data + b"\n\n"
    same_scans(data)


@needs_native
@settings(max_examples=300, deadline=None)
@given(texts=st.lists(st.tuples(PIECES | st.binary(max_size=3), PIECES | st.binary(max_size=3)), max_size=8))
def test_text_deltas_with_odd_texts_and_ids_scan_the_same(texts: list[tuple[bytes, bytes]]) -> None:
    raw = b"".join(text_delta(text, ids) for text, ids in texts) + b"data: [DONE]\n\n"
    lead = lead_of(raw)
    assert _native is not None
    assert _native.text_runs(raw, lead) == native.py_text_runs(raw, lead)


@needs_native
def test_long_inputs_scan_the_same() -> None:
    """Runs of what the scans stop at (memchr's false starts, candidates that never close)."""
    key = b'{"token_ids":['
    for data in (
        b'"' * 200_000,
        b"[" * 200_000,
        (key + b"1," * 50) * 2_000,
        (key + b"1]") * 20_000,
        b"data: " + LEAD + b'"},"logprobs":null' * 20_000 + b"]}]}\n\n",
        b"data: " + b"\n\ndata: " * 30_000 + b"\n\n",
        b"data: " + b"\n\ndatx: " * 30_000 + b"\n\n",
    ):
        same_scans(data)


TAIL = b'"},"logprobs":null,"finish_reason":null,"token_ids":['

EDGES = {
    "a prompt_token_ids key after neither { nor ,": b'x"prompt_token_ids":[1]',
    "a token_ids key after neither { nor ,": b'x"token_ids":[1] {"token_ids":[2] ,"token_ids":[]',
    "ids that never close": b'{"token_ids":[1,2,{"token_ids":[3]',
    "a key inside another's ids": b'{"token_ids":[1{"token_ids":[2]]',
    "an event that only looks like [DONE]": b"data: [DONE!\n\ndata: [DONE]x\n\ndata: [DONE]\n\n",
    # more than 16 line breaks before the separator: the search for it gives up on memchr and goes on with memmem
    "many line breaks in a text delta": b'data: x"' + b"\n" * 17 + TAIL + b"1]}]}\n\ndata: [DONE]\n\n",
    "many false starts before a key": b"[" * 40 + b'{"token_ids":[1]' + b'"[' * 40 + b',"token_ids":[2]',
}
"""Inputs that tell apart a C scan from its twin where a plausible slip in the C code would (each one broke a
deliberately wrong build that the generated inputs let through)."""


@needs_native
@pytest.mark.parametrize("data", EDGES.values(), ids=EDGES.keys())
def test_edge_cases_scan_the_same(data: bytes) -> None:
    same_scans(data, b'x"')
    same_scans(data)


@needs_native
def test_the_built_module_is_built_from_the_source_here() -> None:
    """pytest imports what was built last: a C change without a rebuild would test the old code."""
    assert _native is not None
    source = Path(native.__file__).with_name("_native.c")
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    assert digest == _native.SOURCE_SHA256, (
        "agl_lite/capture/_native.c changed since it was built: pip install -e ."
    )


@needs_native
def test_bad_arguments_fail_alike() -> None:
    assert _native is not None
    for c, py, args in (
        (_native.strip_ids, native.py_strip_ids, ("text",)),
        (_native.find, native.py_find, (b"data", "a")),
        (_native.text_runs, native.py_text_runs, (b"data: x\n\n", b"no quote at the end")),
        (_native.text_runs, native.py_text_runs, (b"data: x\n\n", b"")),
    ):
        assert outcome(c, *args) == outcome(py, *args) != outcome(lambda: None)
