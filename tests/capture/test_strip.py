"""The client's view: stripping what capture injected gives exactly what vLLM sends when not asked.

The reference is the mock vLLM's wire module (matched field for field to real vLLM 0.32): the same generated
answer rendered with and without the injected options; plus the real captures and property tests for chunking
and for string content that looks like the fields being stripped.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agl_lite.capture.strip import (
    StreamStripper,
    Strip,
    _null_logprobs,
    _object_end,
    client_view,
    strip_body,
)
from agl_lite.testing.mock_vllm.generate import ChoiceOutput, GenParams, generate_choice
from agl_lite.testing.mock_vllm.scenario import Scenario, ToolCallSpec
from agl_lite.testing.mock_vllm.tokenizer import FakeTokenizer
from agl_lite.testing.mock_vllm.wire import (
    Envelope,
    chat_body,
    chat_frames,
    completion_body,
    completion_frames,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32-cpu"
ADD_TOOL = {
    "type": "function",
    "function": {"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}},
}
PROMPT = [1, 9690, 198, 2683, 359, 253]
TOP_K = 2


def outputs(endpoint: str, n: int, tool: bool) -> list[ChoiceOutput]:
    """One generated answer (with logprobs, so that both renderings can show them or not)."""
    params = GenParams(
        prompt_ids=PROMPT,
        max_tokens=30,
        logprobs=True,
        top_k=TOP_K,
        tools=[ADD_TOOL] if tool else [],
        endpoint=endpoint,
    )
    scenario = Scenario(tool_call=ToolCallSpec("add", {"a": 2, "b": 3})) if tool else None
    outs = []
    for i in range(n):
        out = generate_choice(FakeTokenizer(), params, i, scenario, {})
        out.index = i
        outs.append(out)
    return outs


def envelope(*, ids: bool, logprobs: bool) -> Envelope:
    return Envelope(
        "chatcmpl-0123", 1796056150, "smollm2", "vllm-0.32.0-c0a109bf", PROMPT, ids, logprobs, TOP_K
    )


def render(
    endpoint: str, outs: list[ChoiceOutput], *, stream: bool, ids: bool, usage: bool, lp: bool
) -> bytes:
    env = envelope(ids=ids, logprobs=lp)
    prompts = [PROMPT] * len(outs)
    if endpoint == "chat":
        if stream:
            return b"".join(chat_frames(env, outs, usage))
        return json.dumps(chat_body(env, outs), ensure_ascii=False, separators=(",", ":")).encode()
    if stream:
        return b"".join(completion_frames(env, outs, prompts, usage))
    return json.dumps(completion_body(env, outs, prompts), ensure_ascii=False, separators=(",", ":")).encode()


FINGERPRINT = b',"system_fingerprint":"vllm-0.32.0-c0a109bf"'


def unasked_stream(want: bytes, *, usage: bool) -> bytes:
    """What the client gets: vLLM's unasked stream, less the fingerprint, which rode on the usage event it dropped
    (the gateway does not hold a choice event back to move the fingerprint onto it)."""
    return want if usage else want.replace(FINGERPRINT, b"")


def run_transform(strip: Strip, chunks: list[bytes], *, stream: bool, chat: bool) -> bytes:
    t = client_view(strip, stream=stream, chat=chat)
    assert t is not None
    return b"".join(t(c) for c in chunks) + t.flush()


ASKED = list(itertools.product([False, True], repeat=3))  # what the client asked: ids, usage, logprobs


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize(("ids", "usage", "lp"), ASKED)
def test_stream_stripped_equals_what_vllm_sends_unasked(
    endpoint: str, n: int, ids: bool, usage: bool, lp: bool
) -> None:
    outs = outputs(endpoint, n, tool=False)
    upstream = render(endpoint, outs, stream=True, ids=True, usage=True, lp=True)
    want = render(endpoint, outs, stream=True, ids=ids, usage=usage, lp=lp)
    strip = Strip(token_ids=not ids, usage=not usage, logprobs=not lp)
    if not strip:
        assert client_view(strip, stream=True, chat=endpoint == "chat") is None
        return
    assert run_transform(strip, [upstream], stream=True, chat=endpoint == "chat") == unasked_stream(
        want, usage=usage
    )


@pytest.mark.parametrize(("ids", "usage", "lp"), ASKED)
def test_tool_call_stream_drops_the_id_only_chunks_unless_ids_were_asked(
    ids: bool, usage: bool, lp: bool
) -> None:
    outs = outputs("chat", 1, tool=True)
    upstream = render("chat", outs, stream=True, ids=True, usage=True, lp=True)
    assert b'"delta":{}' in upstream  # the hermes parser held text back: chunks with ids only
    want = render("chat", outs, stream=True, ids=ids, usage=usage, lp=lp)
    strip = Strip(token_ids=not ids, usage=not usage, logprobs=not lp)
    if strip:
        assert run_transform(strip, [upstream], stream=True, chat=True) == unasked_stream(want, usage=usage)


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
@pytest.mark.parametrize(("ids", "lp"), list(itertools.product([False, True], repeat=2)))
def test_body_stripped_equals_what_vllm_sends_unasked(endpoint: str, ids: bool, lp: bool) -> None:
    outs = outputs(endpoint, 2, tool=endpoint == "chat")
    upstream = render(endpoint, outs, stream=False, ids=True, usage=False, lp=True)
    want = render(endpoint, outs, stream=False, ids=ids, usage=False, lp=lp)
    assert strip_body(upstream, Strip(token_ids=not ids, logprobs=not lp)) == want


def test_body_transform_holds_the_body_until_flush() -> None:
    body = (FIXTURES / "chat-nonstream-n2-ids-logprobs.json").read_bytes()
    t = client_view(Strip(token_ids=True), stream=False, chat=True)
    assert t is not None
    assert t(body[:100]) == b""
    assert t(body[100:]) == b""
    out = json.loads(t.flush())
    assert out["prompt_token_ids"] is None
    assert [c["token_ids"] for c in out["choices"]] == [None, None]


def events(raw: bytes) -> list[Any]:
    return [json.loads(line[6:]) for line in raw.split(b"\n") if line.startswith(b"data: {")]


def test_real_capture_ids_become_null_and_the_rest_is_untouched() -> None:
    raw = (FIXTURES / "chat-stream-tools-ids.sse").read_bytes()
    got = events(run_transform(Strip(token_ids=True), [raw], stream=True, chat=True))
    want = events(raw)
    for ev in want:
        if "prompt_token_ids" in ev:
            ev["prompt_token_ids"] = None
        for c in ev["choices"]:
            if "token_ids" in c:
                c["token_ids"] = None
    assert got == want


def test_real_capture_usage_event_dropped_with_its_fingerprint() -> None:
    raw = (FIXTURES / "chat-stream-n2-ids-logprobs-usage.sse").read_bytes()
    out = run_transform(Strip(usage=True), [raw], stream=True, chat=True)
    got = events(out)
    assert all(ev["choices"] for ev in got)
    assert all("usage" not in ev and "system_fingerprint" not in ev for ev in got)
    assert len(got) == len(events(raw)) - 1
    assert out.endswith(b"data: [DONE]\n\n")


def test_client_that_asked_everything_gets_no_transform() -> None:
    assert client_view(Strip(), stream=True, chat=True) is None
    assert client_view(Strip(), stream=False, chat=True) is None


def test_an_unfinished_event_waits_for_its_end() -> None:
    t = StreamStripper(Strip(token_ids=True), chat=True)
    assert t(b'data: {"choices":[{"index":0,"token_ids":[1,') == b""
    assert t(b"2]}]}\n") == b""
    assert t(b"\ndata: [DONE]\n\n") == b'data: {"choices":[{"index":0,"token_ids":null}]}\n\ndata: [DONE]\n\n'


def test_flush_releases_a_truncated_tail() -> None:
    t = StreamStripper(Strip(token_ids=True, usage=True), chat=True)
    first = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop","token_ids":[2]}]}\n\n'
    assert t(first + b"data: {") == first.replace(b"[2]", b"null")  # a whole event goes at once
    assert t.flush() == b"data: {"


STREAMS = sorted(FIXTURES.glob("*.sse"))


@settings(max_examples=60, deadline=None)
@given(
    path=st.sampled_from(STREAMS),
    cuts=st.lists(st.integers(min_value=0, max_value=20_000), max_size=40),
    strip=st.builds(Strip, st.booleans(), st.booleans(), st.booleans()).filter(bool),
)
def test_any_chunking_gives_the_same_client_bytes(path: Path, cuts: list[int], strip: Strip) -> None:
    raw = path.read_bytes()
    points = sorted({0, len(raw), *(c % (len(raw) + 1) for c in cuts)})
    chunks = [raw[a:b] for a, b in itertools.pairwise(points)]
    chat = path.name.startswith("chat")
    assert run_transform(strip, chunks, stream=True, chat=chat) == run_transform(
        strip, [raw], stream=True, chat=chat
    )


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_chunking_of_a_mock_stream_gives_what_vllm_sends_unasked(data: st.DataObject) -> None:
    outs = outputs("chat", 2, tool=True)
    upstream = render("chat", outs, stream=True, ids=True, usage=True, lp=True)
    want = render("chat", outs, stream=True, ids=False, usage=False, lp=False)
    cuts = data.draw(st.lists(st.integers(min_value=0, max_value=len(upstream)), max_size=60))
    points = sorted({0, len(upstream), *cuts})
    chunks = [upstream[a:b] for a, b in itertools.pairwise(points)]
    assert run_transform(Strip(True, True, True), chunks, stream=True, chat=True) == unasked_stream(
        want, usage=False
    )


LOOKALIKES = [
    '"token_ids":[1,2]',
    ',"token_ids":[3]',
    '{"prompt_token_ids":[4,5]}',
    '"logprobs":{"content":[]}',
    '"choices":[],"usage":{"a":1}',
    '"delta":{},"finish_reason":null',
    '"finish_reason":"stop"',
    "\\",
    '\\"',
    "data: [DONE]",
    "\n\n",
]


@settings(max_examples=200, deadline=None)
@given(
    text=st.lists(st.one_of(st.sampled_from(LOOKALIKES), st.text(max_size=8)), max_size=6).map("".join),
    ascii_only=st.booleans(),
)
def test_string_content_that_looks_like_stripped_fields_is_never_touched(text: str, ascii_only: bool) -> None:
    event = {
        "id": "x",
        "choices": [
            {
                "index": 0,
                "delta": {"content": text, "tool_calls": [{"index": 0, "function": {"arguments": text}}]},
                "logprobs": {"content": [{"token": text, "logprob": -0.5, "top_logprobs": []}]},
                "finish_reason": None,
                "token_ids": [7, 8],
            }
        ],
        "extra": {text: [9]},  # a key with the same look-alike text
    }
    raw = b"data: " + json.dumps(event, ensure_ascii=ascii_only, separators=(",", ":")).encode() + b"\n\n"
    out = run_transform(Strip(True, True, True), [raw], stream=True, chat=True)
    (got,) = events(out)
    want = json.loads(raw[6:])
    want["choices"][0]["token_ids"] = None
    want["choices"][0]["logprobs"] = None
    if text in ("token_ids", "prompt_token_ids"):
        want["extra"][text] = None  # then it is the field itself
    assert got == want


def test_a_usage_event_goes_wherever_it_comes() -> None:
    """The usage event the client did not ask for is dropped even before any choice finished (vLLM sends it
    last, but nothing in the client's view depends on where it is)."""
    usage = b'data: {"id":"x","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":1}}\n\n'
    text = b'data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
    t = StreamStripper(Strip(usage=True), chat=True)
    assert t(usage + text) == text
    assert t(text + usage + b"data: [DONE]\n\n") == text + b"data: [DONE]\n\n"


def test_real_capture_empty_deltas_with_the_logprobs_the_client_asked_for_stay() -> None:
    # Issue #15: streamed calls with `logprobs: true` lost every logprob of the tokens vLLM's tool parser held
    # back: their chunks (an empty delta with a logprob) were dropped as if they carried ids only.
    raw = (FIXTURES / "chat-stream-required-tool-ids-logprobs.sse").read_bytes()
    got = events(run_transform(Strip(token_ids=True), [raw], stream=True, chat=True))
    with_logprobs = [ev for ev in events(raw) if any(c.get("logprobs") for c in ev["choices"])]
    assert any(c["delta"] == {} for ev in with_logprobs for c in ev["choices"])
    assert [ev for ev in got if any(c.get("logprobs") for c in ev["choices"])] == [
        {**ev, "choices": [{**c, "token_ids": None} for c in ev["choices"]]} for ev in with_logprobs
    ]


@settings(max_examples=60, deadline=None)
@given(
    path=st.sampled_from(STREAMS),
    end=st.sampled_from([b"\r\n", b"\r"]),
    cuts=st.lists(st.integers(min_value=0, max_value=20_000), max_size=40),
    strip=st.builds(Strip, st.booleans(), st.booleans(), st.booleans()).filter(bool),
)
def test_crlf_and_cr_streams_are_stripped_as_their_lf_twins_at_any_chunking(
    path: Path, end: bytes, cuts: list[int], strip: Strip
) -> None:
    """Legal SSE line ends that vLLM never writes: the same events reach the client (the injected usage event
    dropped), each line ended with LF, split anywhere, a CRLF pair included."""
    lf = path.read_bytes()
    raw = lf.replace(b"\n", end)
    points = sorted({0, len(raw), *(c % (len(raw) + 1) for c in cuts)})
    chunks = [raw[a:b] for a, b in itertools.pairwise(points)]
    chat = path.name.startswith("chat")
    assert run_transform(strip, chunks, stream=True, chat=chat) == run_transform(
        strip, [lf], stream=True, chat=chat
    )


@pytest.mark.parametrize("end", [b"\r\n", b"\r"])
def test_a_crlf_or_cr_event_goes_as_soon_as_it_ends(end: bytes) -> None:
    """Split on LF alone, such a stream was held whole until its end."""
    t = StreamStripper(Strip(token_ids=True), chat=True)
    event = b'data: {"choices":[{"index":0,"token_ids":[1]}]}' + end + end
    assert t(event) == b'data: {"choices":[{"index":0,"token_ids":null}]}\n\n'
    assert t(b"data: [DONE]" + end + end) == b"data: [DONE]\n\n"


def test_an_object_whose_string_does_not_end_does_not_end_either() -> None:
    # A review after issue #15: the tokenizer needed a string's closing quote, so an unclosed string was tried again
    # from every quote after it (an event of 32 KB of escaped quotes held the event loop 2.2 s), and the braces in
    # its text were read as the object's own.
    assert _object_end(b'{"a":"x\\"}', 0) == -1  # was 10: the brace inside the string
    assert _object_end(b'{"a":"x\\', 0) == -1
    assert _object_end(b'{"a":"x\\"}"}', 0) == 12
    event = b'data: {"choices":[{"logprobs":{"x":"' + b'\\"' * 50_000 + b"\n\n"
    assert _null_logprobs(event) == event
