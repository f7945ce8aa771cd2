"""Hostile input (issue #9, point 3): property tests of the parsers any client byte reaches, then a real gateway fed
oversize bodies, deep nesting, invalid UTF-8, malformed HTTP and slow clients.

Property tests owned elsewhere and not repeated here: the SSE splitter on a real stream under any chunking
(tests/core/test_sse.py) and the Anthropic stream translation (tests/translate/anthropic/test_stream.py). This file
adds the splitter on arbitrary bytes, the TOML config loader, the store API's payload validators and the LLM
calls' JSON parse.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import structlog
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from agl_lite.addons import ADDONS, DEFAULT_CHAIN
from agl_lite.core.addons import load_chain
from agl_lite.core.api import parse_body
from agl_lite.core.flow import Request
from agl_lite.core.jsoncodec import MAX_JSON_DEPTH
from agl_lite.core.registry import resolve_addon
from agl_lite.core.server import Gateway
from agl_lite.core.sse import DoneDetector, SSEParser
from agl_lite.errors import BadRequest, ConfigError
from agl_lite.service import load_config
from agl_lite.store.rules import STORE
from agl_lite.testing import MockVLLM, running_mock
from tests.conftest import ADMIN_KEY, GatewayFactory, gateway_url
from tests.reliability.sqlite_view import store_digest

AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}
CHAT_WITH = '{"model": "smollm2", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], '
"""A chat request's body, open for one more member and its closing brace."""

# --- the SSE splitter on arbitrary bytes -------------------------------------------------------------------------

SSE_PIECES = st.sampled_from(
    [
        b"data: ",
        b"data:",
        b"event: x",
        b"id: 7",
        b": note",
        b"\n",
        b"\r",
        b"\r\n",
        b"[DONE]",
        b'{"a": 1}',
        b"\xff",
    ]
) | st.binary(max_size=6)


@settings(deadline=None)
@given(
    pieces=st.lists(SSE_PIECES, max_size=60),
    cuts=st.lists(st.integers(min_value=0, max_value=600), max_size=25),
)
def test_sse_parser_gives_the_same_events_for_any_bytes_under_any_chunking(
    pieces: list[bytes], cuts: list[int]
) -> None:
    stream = b"".join(pieces)
    whole = SSEParser().feed(stream)
    parser, detector, found = SSEParser(), DoneDetector(), False
    points = sorted({0, len(stream), *(c for c in cuts if c <= len(stream))})
    events = []
    for a, b in itertools.pairwise(points):
        events += parser.feed(stream[a:b])
        found = detector.feed(stream[a:b]) >= 0 or found
    assert events == whole
    one = DoneDetector()
    assert found == (one.feed(stream) >= 0)  # the commit point is found however the bytes were cut


# --- the TOML config loader --------------------------------------------------------------------------------------

TOML_SCALARS = (
    st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text()
)
TOML_VALUES = st.recursive(
    TOML_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)


def _keys_of(section: str) -> st.SearchStrategy[str]:
    import dataclasses

    from agl_lite.core import config

    cls = {"server": config.ServerConfig, "upstream": config.UpstreamConfig, "log": config.LogConfig}[section]
    return st.sampled_from([f.name for f in dataclasses.fields(cls)]) | st.text(max_size=10)


def _addon_options(name: str) -> st.SearchStrategy[dict[str, Any]]:
    import dataclasses

    options = getattr(resolve_addon(name, ADDONS), "Options", None)
    known = [f.name for f in dataclasses.fields(options)] if options is not None else []
    keys = st.sampled_from(known) | st.text(max_size=8) if known else st.text(max_size=8)
    return st.dictionaries(keys, TOML_VALUES, max_size=4)


@st.composite
def config_documents(draw: st.DrawFn) -> dict[str, Any]:
    """Mostly the shape of a real agl-lite.toml, with wrong types, unknown keys and junk in every place."""
    doc: dict[str, Any] = {}
    for section in ("server", "upstream", "log"):
        if draw(st.booleans()):
            doc[section] = draw(st.dictionaries(_keys_of(section), TOML_VALUES, max_size=4))
    if draw(st.booleans()):
        chain = draw(st.lists(st.sampled_from(sorted(ADDONS)) | st.text(max_size=8), max_size=5, unique=True))
        addons: dict[str, Any] = {"chain": chain}
        for name in chain:
            if name in ADDONS and draw(st.booleans()):
                addons[name] = draw(_addon_options(name))
        doc["addons"] = addons
    doc.update(draw(st.dictionaries(st.text(max_size=8), TOML_VALUES, max_size=2)))
    return doc


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=config_documents())
def test_any_config_document_loads_or_is_a_config_error_naming_the_problem(doc: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "agl-lite.toml"
        path.write_text(tomli_w.dumps(doc))
        with contextlib.suppress(ConfigError):  # anything else escaping is the failure
            load_chain(load_config(path), ADDONS)  # every addon's options parsed too


@settings(deadline=None)
@given(raw=st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_any_bytes_as_a_config_file_load_or_are_a_config_error(raw: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "agl-lite.toml"
        path.write_bytes(raw)
        with contextlib.suppress(ConfigError):
            load_config(path)


# --- the JSON payload validators and the LLM calls' parse --------------------------------------------------------

JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=20)
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=25,
)


def _bodies(model: type[BaseModel]) -> st.SearchStrategy[bytes]:
    """The model's own field names with any values, plain JSON, deep nests and raw bytes."""
    fields = st.sampled_from(sorted(model.model_fields)) | st.text(max_size=6)
    shaped = st.dictionaries(fields, JSON_VALUES, max_size=6)
    deep = st.integers(min_value=MAX_JSON_DEPTH - 2, max_value=400).map(lambda n: b"[" * n + b"]" * n)
    return (shaped | JSON_VALUES).map(_json_bytes) | deep | st.binary(max_size=100)


def _json_bytes(value: Any) -> bytes:
    import json

    return json.dumps(value, allow_nan=True).encode()  # NaN and Infinity too: clients do send them


BODIES = {
    r.name: r.body
    for addon in DEFAULT_CHAIN
    for r in getattr(resolve_addon(addon, ADDONS), "routes", ())
    if r.body is not None
}
"""The body model of every endpoint of the default chain, as each declared it."""


@pytest.mark.parametrize("route", sorted(BODIES))
@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_a_payload_validator_accepts_a_storable_model_or_answers_400(route: str, data: st.DataObject) -> None:
    model: Any = BODIES[route]  # (the payload models, typed as their pydantic base there)
    body = data.draw(_bodies(model))
    try:
        parsed = parse_body(model, body)
    except BadRequest:
        return
    assert isinstance(parsed, model)
    orjson.dumps(parsed.model_dump(mode="json"))  # what the store then writes: it must serialise


@settings(deadline=None)
@given(body=JSON_VALUES.map(_json_bytes) | st.binary(max_size=100))
def test_an_llm_calls_body_parses_as_python_reads_it_or_answers_400(body: bytes) -> None:
    request = Request("POST", "/v1/chat/completions", "", {}, body)  # type: ignore[arg-type]
    with contextlib.suppress(BadRequest):
        request.json()


# --- a real gateway ------------------------------------------------------------------------------------------------

MAX_BODY = 64 * 1024
TIMEOUT_S = 0.5
SERVER = {"max_body_bytes": MAX_BODY, "header_timeout_s": TIMEOUT_S, "body_timeout_s": TIMEOUT_S}


@dataclass
class Served:
    gateway: Gateway
    mock: MockVLLM
    url: str
    db: Path
    http: aiohttp.ClientSession

    async def post(self, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
        async with self.http.post(self.url + path, data=body, headers=AUTH) as r:
            return r.status, await r.json(content_type=None)


@pytest.fixture
async def served(gateway_factory: GatewayFactory, tmp_path: Path) -> AsyncIterator[Served]:
    mock = MockVLLM(("smollm2",))
    async with (
        running_mock(mock) as url,
        gateway_factory(
            {"smollm2": [url]},
            chain=DEFAULT_CHAIN,
            addons={"store": {"backend": "sqlite", "path": "hostile.db"}},
            extra={"server": SERVER},
        ) as gw,
        aiohttp.ClientSession() as http,
    ):
        served = Served(gw, mock, gateway_url(gw), gw.config.base_dir / "hostile.db", http)
        async with http.post(
            served.url + "/api/rollouts", json={"rollouts": [{"rollout_id": "r1", "input": {}}]}, headers=AUTH
        ) as r:
            assert r.status == 201
        yield served


def _nested(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


def _hostile_bodies() -> list[tuple[str, bytes]]:
    chat = '{"model": "smollm2", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "x": %s}'
    return [
        (
            "api, nested past the bound",
            b'{"rollouts": [{"input": %s}]}' % _nested(MAX_JSON_DEPTH + 1).encode(),
        ),
        ("api, nested 300 deep", b'{"rollouts": [{"input": %s}]}' % _nested(300).encode()),
        ("api, nested 30,000 deep", b"[" * 30_000 + b"]" * 30_000),
        ("api, invalid UTF-8", b'{"rollouts": [{"input": "\xff\xfe"}]}'),
        ("api, lone surrogate", b'{"rollouts": [{"input": "\\ud800"}]}'),
        ("api, NaN", b'{"rollouts": [{"input": NaN}]}'),
        ("chat, nested past the bound", (chat % _nested(MAX_JSON_DEPTH + 1)).encode()),
        ("chat, nested 30,000 deep", (chat % ("[" * 30_000 + "]" * 30_000)).encode()),
        ("chat, invalid UTF-8", (chat % '"x"').encode().replace(b"hi", b"\xff\xfe")),
        ("chat, not JSON", b"{model: smollm2"),
    ]


@pytest.mark.parametrize(("what", "body"), _hostile_bodies(), ids=[w for w, _ in _hostile_bodies()])
async def test_a_hostile_body_is_a_400_json_error_that_changes_nothing_and_never_reaches_the_upstream(
    served: Served, what: str, body: bytes
) -> None:
    before = store_digest(served.db)
    path = "/api/rollouts" if what.startswith("api") else "/v1/chat/completions"
    status, got = await served.post(path, body)
    assert (status, got["error"]["type"]) == (400, "invalid_request"), got
    assert served.mock.requests_total == 0
    if what.startswith("api"):  # (a refused LLM call still leaves its one `rejected` record, by design)
        assert store_digest(served.db) == before


@pytest.mark.parametrize("path", ["/api/rollouts", "/v1/chat/completions", "/r/r1/a/a1/events"])
async def test_an_oversize_body_is_a_413_json_error_and_the_connection_closes(
    served: Served, path: str
) -> None:
    before = store_digest(served.db)
    body = b'{"rollouts": [{"input": "' + b"x" * (MAX_BODY + 1) + b'"}]}'
    async with served.http.post(served.url + path, data=body, headers=AUTH) as r:
        assert (r.status, (await r.json())["error"]["type"]) == (413, "payload_too_large")
        assert r.headers["Connection"] == "close"
    assert store_digest(served.db) == before
    assert served.mock.requests_total == 0


async def _raw(served: Served, data: bytes, *, until_close: bool = False) -> tuple[bytes, float]:
    """Send raw bytes and nothing more; the answer's first read (or, `until_close`, all it sent before closing)
    and how long that took. (After an error aiohttp keeps reading a request's body up to 10 s before it closes.)"""
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection("127.0.0.1", served.gateway.port)
    t0 = loop.time()
    writer.write(data)
    await writer.drain()
    read = reader.read() if until_close else reader.read(1 << 20)
    answer = await asyncio.wait_for(read, 20 * TIMEOUT_S + 10)
    writer.close()
    return answer, loop.time() - t0


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /api/rollouts/\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /api/rollouts?status=\xff HTTP/1.1\r\nHost: x\r\n\r\n",
        b"NOT-HTTP\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 70_000 + b"\r\n\r\n",
        b"POST /api/rollouts HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"POST /api/rollouts HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer aaaa-key\x01\r\n\r\n",
    ],
    ids=["utf8-path", "utf8-query", "not-http", "header-too-long", "bad-chunk", "bad-length", "key-bad-byte"],
)
async def test_malformed_http_is_a_400_and_logs_one_warning_without_a_traceback(
    served: Served, request_bytes: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    with structlog.testing.capture_logs() as logged:
        answer, _ = await _raw(served, request_bytes)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b" 400 " in head.split(b"\r\n")[0], answer[:200]
    assert b"application/json" in head
    assert orjson.loads(body)["error"]["type"] == "invalid_request"
    assert b"aaaa" not in body  # none of the client's bytes come back
    assert b"\xff" not in body
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    assert all(e.get("log_level") != "error" for e in logged)
    assert all(b"\xff" not in str(e).encode() and "aaaa" not in str(e) for e in logged)


async def test_an_authorization_header_of_raw_bytes_is_a_401_json_error(served: Served) -> None:
    answer, _ = await _raw(
        served,
        b"GET /api/rollouts HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer \xff\xfe\r\n\r\n",
    )
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b" 401 " in head.split(b"\r\n")[0]
    assert orjson.loads(body)["error"]["type"] == "unauthorized"


async def test_a_client_that_never_finishes_its_headers_is_cut_off_and_others_are_served(
    served: Served,
) -> None:
    slow = [
        asyncio.create_task(_raw(served, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ", until_close=True))
        for _ in range(20)
    ]
    async with served.http.get(served.url + "/healthz") as r:  # answered while twenty connections dawdle
        assert r.status == 200
    for answer, lived in await asyncio.gather(*slow):
        assert answer == b""  # closed without a word: nothing was asked
        assert TIMEOUT_S * 0.8 <= lived < TIMEOUT_S + 10


async def test_a_body_slower_than_its_timeout_is_a_408_json_error_that_changes_nothing(
    served: Served,
) -> None:
    before = store_digest(served.db)
    head = (
        b"POST /api/rollouts HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer " + ADMIN_KEY.encode() + b"\r\nContent-Length: 100\r\n\r\n"
        b'{"rollouts": '  # and then nothing more
    )
    answer, lived = await _raw(served, head)
    status_line, _, rest = answer.partition(b"\r\n")
    assert b" 408 " in status_line
    assert orjson.loads(rest.partition(b"\r\n\r\n")[2])["error"]["type"] == "request_timeout"
    assert lived >= TIMEOUT_S * 0.8
    assert store_digest(served.db) == before


@pytest.mark.parametrize(
    "extra",
    ['"seed": 100000000000000000000000', '"stop": ["\\ud800"]', '"temperature": NaN', '"user": "\\udfff"'],
)
async def test_values_python_reads_but_the_store_cannot_hold_still_leave_the_calls_record(
    served: Served, extra: str
) -> None:
    body = CHAT_WITH + extra + "}"
    status, _ = await served.post("/v1/chat/completions", body.encode())
    assert status == 200  # forwarded as vLLM (Python) reads it
    async with served.http.get(served.url + "/api/gateway/state?wait_drained=5", headers=AUTH) as r:
        assert (await r.json())["in_flight"] == 0
    store = served.gateway.addons.ctx.services.require(STORE, by="test")
    (call,) = await store.calls(None)
    assert call.outcome.value == "ok"


@pytest.mark.parametrize("extra", ['"top_k": 100000000000000000000000', '"stop_sequences": ["\\udfff"]'])
async def test_an_anthropic_body_with_values_orjson_cannot_encode_is_not_a_500(
    served: Served, extra: str
) -> None:
    body = CHAT_WITH + extra + "}"
    async with served.http.post(served.url + "/v1/messages", data=body.encode(), headers=AUTH) as r:
        assert r.status < 500, await r.text()
