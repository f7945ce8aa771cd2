"""Assembly of the tapped upstream bytes: ids per choice checked against an independent parse of real captures,
batch decoding equal to event-by-event decoding, and how a stream's ending is read.
"""

from __future__ import annotations

import itertools
import json
from array import array
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agl_lite.capture import assemble
from agl_lite.capture.assemble import Assembly, Collector

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32-cpu"
STREAMS = sorted(FIXTURES.glob("*.sse"))
BODIES = sorted(p for p in FIXTURES.glob("c*.json"))


def independent(path: Path) -> dict[str, Any]:
    """Ids, prompt ids and logprobs per choice, read with the stdlib json from the raw capture."""
    raw = path.read_bytes()
    if path.suffix == ".json":
        objs = [json.loads(raw)]
    else:
        objs = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith(b"data: {")]
    ids: dict[int, list[int]] = {}
    lps: dict[int, list[float]] = {}
    prompt = None
    for obj in objs:
        prompt = prompt or obj.get("prompt_token_ids")
        for c in obj["choices"]:
            ids.setdefault(c["index"], []).extend(c.get("token_ids") or [])
            prompt = prompt or c.get("prompt_token_ids")
            lp = c.get("logprobs")
            if lp:
                values = [e["logprob"] for e in lp["content"]] if "content" in lp else lp["token_logprobs"]
                lps.setdefault(c["index"], []).extend(values)
    return {"ids": ids, "prompt": prompt, "logprobs": lps}


def collect(path: Path, chunk: int = 61) -> Assembly:
    raw = path.read_bytes()
    c = Collector(stream=path.suffix == ".sse", chat=path.name.startswith("chat"))
    for i in range(0, len(raw), chunk):
        c.feed(raw[i : i + chunk])
    return c.finish()


@pytest.mark.parametrize("path", STREAMS + BODIES, ids=lambda p: p.name)
def test_ids_per_choice_equal_an_independent_parse(path: Path) -> None:
    asm, want = collect(path), independent(path)
    choices = asm.choices()
    assert {c.index: c.token_ids.tolist() for c in choices} == want["ids"]
    prompt = asm.prompt_token_ids()
    assert (None if prompt is None else prompt.tolist()) == (want["prompt"] or None)
    assert all(isinstance(c.token_ids, array) and c.token_ids.typecode == "I" for c in choices)


@pytest.mark.parametrize("path", [p for p in STREAMS + BODIES if "logprobs" in p.name], ids=lambda p: p.name)
def test_logprobs_per_choice_equal_an_independent_parse(path: Path) -> None:
    want = independent(path)["logprobs"]
    got = {c.index: c.logprobs for c in collect(path).choices()}
    assert set(got) == set(want)
    for i, values in want.items():
        lp = got[i]
        assert lp is not None
        assert lp.tolist() == pytest.approx(values, rel=1e-6)


def test_streamed_tool_call_is_joined_per_tool_index() -> None:
    (choice,) = collect(FIXTURES / "chat-stream-forced-tool-ids.sse").choices()
    (call,) = choice.tool_calls
    assert call["id"].startswith("chatcmpl-tool-")
    assert call["function"]["name"] == "add"
    assert call["function"]["arguments"] == '[\n  ["gettu", "sume"],\n  ["yen'
    assert choice.text is None
    assert choice.finish_reason == "length"


def test_n2_stream_keeps_both_choices_text_and_finish_reasons() -> None:
    asm = collect(FIXTURES / "chat-stream-n2-ids-logprobs-usage.sse")
    assert [(c.index, c.text, c.finish_reason) for c in asm.choices()] == [
        (0, "The number we want is ", "length"),
        (1, "2+3 = Standard System", "length"),
    ]
    assert asm.usage == {"prompt_tokens": 42, "total_tokens": 54, "completion_tokens": 12}
    assert asm.completion_ids_count() == 12


def test_stream_with_done_is_done_and_one_without_is_not() -> None:
    raw = (FIXTURES / "chat-stream-plain.sse").read_bytes()
    whole = Collector(stream=True, chat=True)
    whole.feed(raw)
    assert whole.finish().done
    cut = Collector(stream=True, chat=True)
    cut.feed(raw[: raw.index(b"data: [DONE]")])
    asm = cut.finish()
    assert not asm.done
    assert asm.choices()[0].text == "The number we want is 2 +"


def test_an_unfinished_last_event_is_ignored() -> None:
    raw = (FIXTURES / "completions-stream-ids.sse").read_bytes()
    c = Collector(stream=True, chat=False)
    c.feed(raw[: raw.index(b"data: [DONE]") - 40])
    assert c.finish().choices()[0].token_ids.tolist() == [216, 35, 27, 33, 45]


def test_in_band_error_event_is_reported() -> None:
    c = Collector(stream=True, chat=True)
    c.feed(b'data: {"id":"a","choices":[{"index":0,"delta":{"content":"x"},"token_ids":[5]}]}\n\n')
    c.feed(b'data: {"error":{"message":"boom","type":"InternalServerError","code":500}}\n\ndata: [DONE]\n\n')
    asm = c.finish()
    assert asm.error == "InternalServerError: boom"
    assert asm.choices()[0].token_ids.tolist() == [5]


def test_crlf_and_multiline_data_are_parsed_exactly() -> None:
    c = Collector(stream=True, chat=True)
    c.feed(
        b'data: {"id":"a","choices":[{"index":0,\r\ndata: "token_ids":[5,6]}]}\r\n\r\ndata: [DONE]\r\n\r\n'
    )
    asm = c.finish()
    assert asm.done
    assert asm.choices()[0].token_ids.tolist() == [5, 6]


def test_done_without_its_blank_line_still_ends_the_stream() -> None:
    c = Collector(stream=True, chat=True)
    c.feed(b'data: {"id":"a","choices":[{"index":0,"token_ids":[5]}]}\n\ndata: [DONE]\n')
    assert c.finish().done


def test_body_that_is_not_json_is_an_error() -> None:
    c = Collector(stream=False, chat=True)
    c.feed(b'{"id": "a", "choi')
    asm = c.finish()
    assert asm.error is not None
    assert not asm.done


@settings(max_examples=40, deadline=None)
@given(path=st.sampled_from(STREAMS), limit=st.integers(min_value=1, max_value=4000), data=st.data())
def test_batch_decoding_at_any_size_equals_decoding_at_the_end(
    path: Path, limit: int, data: st.DataObject
) -> None:
    raw = path.read_bytes()
    cuts = data.draw(st.lists(st.integers(min_value=0, max_value=len(raw)), max_size=30))
    points = sorted({0, len(raw), *cuts})
    chat = path.name.startswith("chat")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(assemble, "COMPACT_BYTES", limit)  # tiny: decodes many batches on the way
        small = Collector(stream=True, chat=chat)
        for a, b in itertools.pairwise(points):
            small.feed(raw[a:b])
    whole = Collector(stream=True, chat=chat)
    whole.feed(raw)
    got, want = small.finish(), whole.finish()
    assert got.choices() == want.choices()
    assert (got.usage, got.done, got.response_id, got.prompt_token_ids()) == (
        want.usage,
        want.done,
        want.response_id,
        want.prompt_token_ids(),
    )


def test_a_long_stream_keeps_only_a_bounded_tail_of_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(assemble, "COMPACT_BYTES", 4096)
    event = b'data: {"id":"a","choices":[{"index":0,"delta":{"content":"x"},"token_ids":[7]}]}\n\n'
    c = Collector(stream=True, chat=True)
    for _ in range(2000):
        c.feed(event)
        assert c._size < 4096 + len(event)
    c.feed(b"data: [DONE]\n\n")
    asm = c.finish()
    assert asm.done
    assert asm.choices()[0].token_ids.tolist() == [7] * 2000


@pytest.mark.parametrize("ids", [b"-1", b"null", b"1.5", b"4294967296", b'"7"'])
def test_a_long_stream_whose_ids_do_not_decode_fails_at_finish_not_in_the_tap(
    monkeypatch: pytest.MonkeyPatch, ids: bytes
) -> None:
    """The tap runs on the relay's path: a batch decode on the way that fails must not raise into it (that cut
    the client's stream); `finish`, where the record is built, raises what the decode at the end would."""
    monkeypatch.setattr(assemble, "COMPACT_BYTES", 4096)
    event = b'data: {"id":"a","choices":[{"index":0,"delta":{"content":"x"},"token_ids":[' + ids + b"]}]}\n\n"
    c = Collector(stream=True, chat=True)
    for _ in range(200):
        c.feed(event)  # raises nothing
        assert c._size < 4096 + len(event)  # and keeps nothing once a decode failed
    c.feed(b"data: [DONE]\n\n")
    with pytest.raises((TypeError, OverflowError)):
        c.finish()
    with pytest.raises((TypeError, OverflowError)):  # as one decode at the end fails
        Assembly(chat=True).add_events(event)


# --- the fast path of chat streams ---------------------------------------------------------------------------------

TEXT = st.lists(
    st.sampled_from(
        ["a", " ", '"', "\\", "\n", "é", "😀", "\x01", "}", "]", ",", ":", "[DONE]", '"},"logprobs":null']
    ),
    max_size=6,
).map("".join)
"""Text deltas: escapes, non-ASCII, and the bytes the fast path cuts at (escaped inside a JSON string)."""
IDS = st.lists(st.integers(min_value=0, max_value=2**32 - 1), max_size=3)


def chat_event(head: dict[str, Any], kind: str, text: str, ids: list[int], ascii_only: bool) -> bytes:
    """One event as vLLM 0.32 writes it (its key order, compact separators)."""
    if kind == "done":
        return b"data: [DONE]\n\n"
    if kind == "comment":
        return b": ping\n\n"
    ev: dict[str, Any] = dict(head)
    text_delta = {"delta": {"content": text}, "logprobs": None, "finish_reason": None, "token_ids": ids}
    if kind == "text":
        ev["choices"] = [{"index": 0, **text_delta}]
    elif kind == "other_id":  # a text delta as the fast path cuts it, but from another response id
        ev |= {"id": "chatcmpl-other", "choices": [{"index": 0, **text_delta}]}
    elif kind == "second":  # another choice's text: n = 2
        ev["choices"] = [{"index": 1, **text_delta}]
    elif kind == "null_ids":
        ev["choices"] = [{"index": 0, **text_delta, "token_ids": None}]
    elif kind == "role":
        role = {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        ev |= {"choices": [role], "prompt_token_ids": ids or None, "prompt_text": None}
    elif kind == "tool":
        call = {"index": 0, "function": {"arguments": text}}
        ev["choices"] = [{"index": 0, **text_delta, "delta": {"tool_calls": [call]}}]
    elif kind == "finish":
        delta = {"content": text} if text else {}
        finish = {
            "delta": delta,
            "logprobs": None,
            "finish_reason": "stop",
            "stop_reason": None,
            "token_ids": ids,
        }
        ev["choices"] = [{"index": 0, **finish}]
    elif kind == "usage":
        ev |= {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": len(ids), "total_tokens": 9}}
    elif kind == "error":
        ev = {"error": {"message": text, "type": "InternalServerError", "code": 500}}
    return b"data: " + json.dumps(ev, ensure_ascii=ascii_only, separators=(",", ":")).encode() + b"\n\n"


OTHER_KINDS = (
    "role",
    "tool",
    "finish",
    "second",
    "null_ids",
    "usage",
    "error",
    "other_id",
    "done",
    "comment",
)
KINDS = ["text"] * 8 + list(OTHER_KINDS)
"""Mostly text deltas, as in a real stream."""


@st.composite
def chat_streams(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """A chat stream in two batches (as `Collector` decodes a long one): mostly text deltas, any other event."""
    head = {
        "id": draw(st.sampled_from(["chatcmpl-869e265e3b2cae15", 'chat"q', "é"])),
        "object": "chat.completion.chunk",
        "created": 1796056150,
        "model": draw(st.sampled_from(["smollm2", 'a"b\\c', "模型"])),
    }
    ascii_only = draw(st.booleans())
    kinds = draw(st.lists(st.sampled_from(KINDS), min_size=1, max_size=12))
    events = [chat_event(head, k, draw(TEXT), draw(IDS), ascii_only) for k in kinds]
    cut = draw(st.integers(min_value=0, max_value=len(events)))
    return b"".join(events[:cut]), b"".join(events[cut:])


def state(asm: Assembly) -> tuple[Any, ...]:
    prompt = asm.prompt_token_ids()
    return (
        asm.choices(),
        asm.usage,
        asm.done,
        asm.response_id,
        asm.served_model,
        None if prompt is None else prompt.tolist(),
        asm.error,
    )


@settings(max_examples=300, deadline=None)
@given(stream=chat_streams())
def test_the_chat_fast_path_equals_the_general_fold(stream: tuple[bytes, bytes]) -> None:
    fast, general = Assembly(chat=True), Assembly(chat=True)
    for batch in stream:
        if not batch:
            continue
        before = state(fast)
        if not fast._add_chat_events(batch):
            assert state(fast) == before  # declined: nothing changed, the general fold reads it
            fast.add_events_general(batch)
        general.add_events_general(batch)
        assert state(fast) == state(general)


def read_both_ways(raw: bytes) -> tuple[bool, Assembly, Assembly]:
    """(whether the fast path took it, the fast path's assembly, the general path's)."""
    fast, general = Assembly(chat=True), Assembly(chat=True)
    before = state(fast)
    took = fast._add_chat_events(raw)
    if not took:
        assert state(fast) == before  # declined: nothing changed
        fast.add_events_general(raw)
    general.add_events_general(raw)
    return took, fast, general


@pytest.mark.parametrize("path", [p for p in STREAMS if p.name.startswith("chat")], ids=lambda p: p.name)
def test_real_chat_streams_read_the_same_on_either_path(path: Path) -> None:
    _, fast, general = read_both_ways(path.read_bytes())
    assert state(fast) == state(general)


def test_text_deltas_with_ids_take_the_fast_path() -> None:
    """What capture asks vLLM for by default: ids on every delta, no logprobs (with them, the general path)."""
    took, fast, general = read_both_ways((FIXTURES / "chat-stream-tools-ids.sse").read_bytes())
    assert took
    assert state(fast) == state(general)


H = b'{"id":"a","object":"o","created":1,"model":"m","choices":['
ROLE = (
    b"data: "
    + H
    + b'{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'
)


def text_delta(text: bytes, ids: bytes, head: bytes = H) -> bytes:
    return (
        b"data: "
        + head
        + b'{"index":0,"delta":{"content":"'
        + text
        + b'"},"logprobs":null,"finish_reason":null,"token_ids":['
        + ids
        + b"]}]}\n\n"
    )


MALFORMED = {
    # a line break in the ids or the head: JSON whitespace, but the end of an SSE line
    "line break in ids": text_delta(b"x", b"1\n"),
    "line break in later ids": text_delta(b"x", b"1") + text_delta(b"y", b"2\n,3"),
    "blank line in ids": text_delta(b"x", b"1\n\n,2"),
    "line break in the head": text_delta(b"x", b"1", head=H.replace(b'"a",', b'"a",\n')),
    # broken payloads that a batch would decode to as many values as there are events
    "broken halves": text_delta(b"x", b"1")
    + b"data: [0\n\n"
    + text_delta(b"y", b"2")
    + b"data: 0]\n\ndata: 0,0\n\n",
    "broken halves around [DONE]": ROLE
    + b'data: 0,{"id":"b","object":"o","created":1,"model":"m2","choices":[{"index":1,"delta":{"content":"Q"},'
    b'"finish_reason":"stop"}]}\n\ndata: [0\n\ndata: 0]\n\ndata: [DONE]\n\ndata: 1\n\n',
    # an escaped closing quote: broken texts that a batch would decode to as many strings
    "escaped closing quote": text_delta(b"a\\", b"1") + text_delta(b',"q', b"2"),
    "escaped closing quote, three": text_delta(b"a\\", b"1")
    + text_delta(b",", b"2")
    + text_delta(b"b", b"3"),
    "a quote inside a text": text_delta(b'a\\"b', b"1") + text_delta(b"c", b"2"),
    "ids that are not token ids": text_delta(b"x", b'1,"a"') + text_delta(b"y", b"[2]"),
    "ids that close the array": text_delta(b"x", b'1],"q":[2'),
}
"""Streams no vLLM sends, where cutting by position could read what the general path does not."""


@pytest.mark.parametrize("raw", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_streams_read_the_same_on_either_path(raw: bytes) -> None:
    try:
        _, fast, general = read_both_ways(raw)
    except TypeError:  # ids that are not integers fail the general fold too
        with pytest.raises(TypeError):
            Assembly(chat=True).add_events_general(raw)
        return
    assert state(fast) == state(general)


def test_the_fast_path_declines_what_is_not_one_data_line_per_event() -> None:
    line = b'data: {"id":"a","object":"chat.completion.chunk","created":1,"model":"m","choices":[]}\n\n'
    for odd in (
        b": ping\n\n",
        b'data: {"x":\ndata: 1}\n\n',
        b"event: x\n" + line[:-2] + b"\n\n",
        b"data: nope\n\n",
    ):
        asm = Assembly(chat=True)
        assert not asm._add_chat_events(line + odd)
        assert state(asm) == state(Assembly(chat=True))


def outcome(read: Any) -> Any:
    """The state a read leaves, or the type of the exception it raised (both paths must agree on either)."""
    try:
        return state(read())
    except (TypeError, OverflowError) as exc:
        return type(exc)


@settings(max_examples=400, deadline=None)
@given(
    stream=chat_streams(),
    edits=st.lists(
        st.tuples(
            st.integers(min_value=0), st.sampled_from([b"\n", b"\\", b'"', b",", b"[", b"]", b"0", b"\n\n"])
        ),
        min_size=1,
        max_size=3,
    ),
)
def test_corrupted_streams_read_the_same_on_either_path(
    stream: tuple[bytes, bytes], edits: list[tuple[int, bytes]]
) -> None:
    """A few bytes inserted anywhere in a generated stream (kept ending at an event boundary): the fast path
    declines or reads exactly what the general path reads."""
    raw = b"".join(stream)
    for at, byte in edits:
        at %= max(1, len(raw) - 1)
        raw = raw[:at] + byte + raw[at:]

    def fast() -> Assembly:
        asm = Assembly(chat=True)
        before = state(asm)
        if not asm._add_chat_events(raw):
            assert state(asm) == before
            asm.add_events_general(raw)
        return asm

    def general() -> Assembly:
        asm = Assembly(chat=True)
        asm.add_events_general(raw)
        return asm

    assert outcome(fast) == outcome(general)


def test_a_byte_order_mark_before_the_stream_is_dropped_as_sse_says() -> None:
    c = Collector(stream=True, chat=True)
    c.feed("\ufeff".encode() + text_delta(b"he", b"5"))
    c.feed(text_delta(b"llo", b"6") + b"data: [DONE]\n\n")
    asm = c.finish()
    assert [(ch.text, ch.token_ids.tolist()) for ch in asm.choices()] == [("hello", [5, 6])]


def test_a_malformed_tool_delta_costs_only_itself() -> None:
    """Deltas with a tool index that is no number, a function that is no object, arguments that are no string,
    tool calls that are no list, in an otherwise good stream: the record keeps the rest (it was thrown away
    whole) and makes up no call."""
    good = {"index": 0, "id": "call_1", "function": {"name": "f", "arguments": "{}"}}
    bad_args = {"index": 0, "function": {"arguments": 5}}
    events: list[Any] = [[{"index": "a", "function": 5}], ["x"], [{"index": 1, "function": 5}], [good]]
    events += [[bad_args], 7]
    raw = b"".join(
        b"data: "
        + json.dumps({"choices": [{"index": 0, "delta": {"tool_calls": e}, "finish_reason": None}]}).encode()
        + b"\n\n"
        for e in events
    )
    c = Collector(stream=True, chat=True)
    c.feed(raw + b"data: [DONE]\n\n")
    (choice,) = c.finish().choices()
    assert [t["function"] for t in choice.tool_calls] == [{"name": "f", "arguments": "{}"}]
