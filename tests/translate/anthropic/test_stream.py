"""The stream translator: for any upstream content and any chunking of its bytes, the Anthropic event stream is
well-formed (event order, block indices, cumulative usage) and adds up to the same message, which is also what the
whole-body translation of the same answer gives. Plus the ends: `[DONE]`, truncation, in-band errors.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Any

from anthropic.types import Message
from hypothesis import given, settings
from hypothesis import strategies as st

from agl_lite.capture.client_view import ClientView
from agl_lite.translate.anthropic.message import MessageBuilder
from agl_lite.translate.anthropic.stream import StreamTranslator, message_body

# --- a chat answer, drawn, and rendered as vLLM streams and returns it --------------------------------------------


@dataclass
class Answer:
    segments: list[tuple[str, Any]]
    """("thinking", [pieces]) | ("text", [pieces]) | ("tool", (name, arguments object, [argument pieces]))"""
    finish: str
    matched: str | None
    prompt: int
    completion: int


text_pieces = st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=4)
json_values = st.one_of(st.integers(-5, 99), st.text(max_size=5), st.booleans(), st.none())
arguments = st.dictionaries(st.text(min_size=1, max_size=4), json_values, max_size=3)


# What a model writes as a tool call's arguments is not always a JSON object (issue #15: a string or an array
# made the SDK's `messages.stream` raise "Unable to parse tool parameter JSON"): the client's input is then {}.
not_objects = st.one_of(
    st.text(max_size=5).map(json.dumps),
    st.lists(json_values, max_size=3).map(json.dumps),
    arguments.map(lambda a: json.dumps(a)[:-1]),  # cut before its end (max_tokens)
    st.just("not json"),
)


@st.composite
def tool_segment(draw: st.DrawFn) -> tuple[str, Any]:
    if draw(st.booleans()):
        args = draw(arguments)
        raw = json.dumps(args, ensure_ascii=False)
    else:
        raw = draw(not_objects)
        args = {}
    cuts = sorted(set(draw(st.lists(st.integers(0, len(raw)), max_size=4))) | {0, len(raw)})
    pieces = [raw[a:b] for a, b in itertools.pairwise(cuts) if b > a] or [""]
    return ("tool", (draw(st.sampled_from(["add", "read_file", "bash"])), args, pieces))


@st.composite
def answers(draw: st.DrawFn) -> Answer:
    segments = draw(
        st.lists(
            st.one_of(
                text_pieces.map(lambda p: ("thinking", p)),
                text_pieces.map(lambda p: ("text", p)),
                tool_segment(),
            ),
            max_size=5,
        )
    )
    finish = draw(st.sampled_from(["stop", "length", "tool_calls"]))
    matched = draw(st.one_of(st.none(), st.just("END"))) if finish == "stop" else None
    return Answer(segments, finish, matched, draw(st.integers(1, 5000)), draw(st.integers(0, 5000)))


def frame(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def render_stream(a: Answer, *, prompt_ids: bool = True, done: bool = True) -> bytes:
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "served"}
    first = {
        **head,
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
    }
    if prompt_ids:
        first["prompt_token_ids"] = list(range(a.prompt))
    out = [frame(first)]
    tool_index = 0
    for kind, value in a.segments:
        deltas: list[dict[str, Any]] = []
        if kind == "thinking":
            deltas = [{"reasoning": p} for p in value]
        elif kind == "text":
            deltas = [{"content": p} for p in value]
        else:
            name, _, pieces = value
            for i, piece in enumerate(pieces):
                call: dict[str, Any] = {"index": tool_index, "function": {"arguments": piece}}
                if i == 0:
                    call |= {"id": f"call_{tool_index}", "type": "function"}
                    call["function"]["name"] = name
                deltas.append({"content": None, "tool_calls": [call]})
            tool_index += 1
        out += [frame({**head, "choices": [{"index": 0, "delta": d, "finish_reason": None}]}) for d in deltas]
    last = {"index": 0, "delta": {}, "finish_reason": a.finish, "stop_reason": a.matched}
    out.append(frame({**head, "choices": [last]}))
    usage = {
        "prompt_tokens": a.prompt,
        "completion_tokens": a.completion,
        "total_tokens": a.prompt + a.completion,
    }
    out.append(frame({**head, "choices": [], "usage": usage}))
    if done:
        out.append(b"data: [DONE]\n\n")
    return b"".join(out)


def render_body(a: Answer) -> bytes:
    texts = ["".join(v) for k, v in a.segments if k == "text"]
    thinking = ["".join(v) for k, v in a.segments if k == "thinking"]
    tools = [v for k, v in a.segments if k == "tool"]
    message = {
        "role": "assistant",
        "content": "".join(texts) or None,
        "reasoning": "".join(thinking) or None,
        "tool_calls": [
            {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": "".join(p)}}
            for i, (n, _, p) in enumerate(tools)
        ],
    }
    choice = {"index": 0, "message": message, "finish_reason": a.finish, "stop_reason": a.matched}
    usage = {"prompt_tokens": a.prompt, "completion_tokens": a.completion}
    return json.dumps({"id": "chatcmpl-1", "model": "served", "choices": [choice], "usage": usage}).encode()


def expected_content(a: Answer) -> list[dict[str, Any]]:
    """Independent of the builder: adjacent thinking (or text) segments are one block; each tool call is one."""
    content: list[dict[str, Any]] = []
    for i, (kind, value) in enumerate(a.segments):
        if kind == "tool":
            tool_no = sum(1 for k, _ in a.segments[:i] if k == "tool")
            content.append({"type": "tool_use", "id": f"call_{tool_no}", "name": value[0], "input": value[1]})
        elif content and content[-1]["type"] == kind:
            content[-1][kind] += "".join(value)
        elif kind == "text":
            content.append({"type": "text", "text": "".join(value)})
        else:
            content.append({"type": "thinking", "thinking": "".join(value), "signature": ""})
    return content


def expected_stop(a: Answer) -> tuple[str, str | None]:
    has_tool = any(k == "tool" for k, _ in a.segments)
    if a.finish == "stop" and a.matched is not None:
        return "stop_sequence", a.matched
    if a.finish == "length":
        return "max_tokens", None
    if a.finish == "tool_calls" or has_tool:
        return "tool_use", None
    return "end_turn", None


# --- reading the Anthropic stream back --------------------------------------------------------------------------------


def parse(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    assert raw.endswith(b"\n\n") or raw == b""
    out = []
    for block in raw.decode().split("\n\n")[:-1]:
        name_line, data_line = block.split("\n")
        out.append((name_line.removeprefix("event: "), json.loads(data_line.removeprefix("data: "))))
    return out


def reassemble(evs: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Check the grammar of the event stream while adding it up, as an Anthropic client does."""
    names = [n for n, _ in evs]
    assert names[:2] == ["message_start", "ping"]
    assert names[-2:] == ["message_delta", "message_stop"]
    message: dict[str, Any] = {}
    bufs: dict[int, str] = {}
    open_index: int | None = None
    for name, data in evs:
        assert data["type"] == name
        if name == "message_start":
            message = {**data["message"], "content": []}
            assert message["stop_reason"] is None
        elif name == "content_block_start":
            assert open_index is None
            assert data["index"] == len(message["content"])
            open_index = data["index"]
            message["content"].append(dict(data["content_block"]))
            bufs[open_index] = ""
        elif name == "content_block_delta":
            assert data["index"] == open_index
            block, delta = message["content"][data["index"]], data["delta"]
            kind = {"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "tool_use"}[
                delta["type"]
            ]
            assert block["type"] == kind
            if kind == "tool_use":
                bufs[data["index"]] += delta["partial_json"]
            else:
                block[kind] += delta[kind]
        elif name == "content_block_stop":
            assert data["index"] == open_index
            block = message["content"][open_index]
            if block["type"] == "tool_use":
                block["input"] = json.loads(bufs[open_index]) if bufs[open_index] else {}
            open_index = None
        elif name == "message_delta":
            assert open_index is None
            message.update(data["delta"])
            message["usage"] = {**message["usage"], **data["usage"]}
    return message


def translate(chunks: list[bytes]) -> tuple[bytes, bytes, ClientView]:
    """(what the chunks gave, what flush gave, the view)."""
    view = ClientView("messages", b"{}", "msg_1")
    t = StreamTranslator(MessageBuilder("msg_1", "asked"), view)
    return b"".join(t(c) for c in chunks), t.flush(), view


def cut(raw: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(raw), *(c % (len(raw) + 1) for c in cuts)})
    return [raw[a:b] for a, b in itertools.pairwise(points)]


@settings(max_examples=150, deadline=None)
@given(answer=answers(), cuts=st.lists(st.integers(min_value=0, max_value=100_000), max_size=30))
def test_any_chunking_gives_a_well_formed_stream_that_adds_up_to_the_answer(
    answer: Answer, cuts: list[int]
) -> None:
    raw = render_stream(answer)
    body, tail, view = translate(cut(raw, cuts))
    whole_body, whole_tail, whole_view = translate([raw])
    assert body + tail == whole_body + whole_tail
    assert view.response == whole_view.response
    message = reassemble(parse(body + tail))
    assert message["content"] == expected_content(answer)
    assert (message["stop_reason"], message["stop_sequence"]) == expected_stop(answer)
    assert message["usage"] == {"input_tokens": answer.prompt, "output_tokens": answer.completion}
    assert (message["id"], message["model"]) == ("msg_1", "served")
    assert message == view.response  # what the record keeps is what the client added up
    Message.model_validate(message)


_RANK = {"thinking": 0, "text": 1, "tool": 2}


def in_vllm_order(a: Answer) -> Answer:
    """A whole body says reasoning, then content, then tool calls: the same answer streamed in that order."""
    return Answer(sorted(a.segments, key=lambda s: _RANK[s[0]]), a.finish, a.matched, a.prompt, a.completion)


@settings(max_examples=100, deadline=None)
@given(answer=answers().map(in_vllm_order))
def test_the_stream_and_the_whole_body_of_one_answer_give_the_same_message(answer: Answer) -> None:
    _, _, streamed = translate([render_stream(answer)])
    view = ClientView("messages", b"{}", "msg_1")
    whole = json.loads(message_body(render_body(answer), MessageBuilder("msg_1", "asked", emit=False), view))
    assert whole == streamed.response


@settings(max_examples=60, deadline=None)
@given(answer=answers(), cuts=st.lists(st.integers(min_value=0, max_value=100_000), max_size=30))
def test_the_end_of_the_message_waits_for_flush(answer: Answer, cuts: list[int]) -> None:
    body, tail, _ = translate(cut(render_stream(answer), cuts))
    assert b"message_stop" not in body
    assert [n for n, _ in parse(tail)] == ["message_delta", "message_stop"]


def test_message_start_carries_the_prompt_length_from_the_first_chunk() -> None:
    a = Answer([("text", ["hi"])], "stop", None, prompt=42, completion=2)
    body, _, _ = translate([render_stream(a)])
    start = parse(body)[0][1]
    assert start["message"]["usage"] == {"input_tokens": 42, "output_tokens": 0}


def test_without_prompt_ids_message_start_says_0_and_message_delta_the_real_count() -> None:
    a = Answer([("text", ["hi"])], "stop", None, prompt=42, completion=2)
    body, tail, _ = translate([render_stream(a, prompt_ids=False)])
    assert parse(body)[0][1]["message"]["usage"]["input_tokens"] == 0
    assert parse(tail)[0][1]["usage"] == {"input_tokens": 42, "output_tokens": 2}


def test_a_stream_without_done_ends_with_an_error_event() -> None:
    a = Answer([("text", ["hi"])], "stop", None, prompt=3, completion=2)
    _body, tail, view = translate([render_stream(a, done=False)])
    ((name, data),) = parse(tail)
    assert (name, data["error"]["type"]) == ("error", "api_error")
    assert view.response is not None
    assert view.response["stop_reason"] is None
    assert view.response["content"] == [{"type": "text", "text": "hi"}]


def test_an_in_band_upstream_error_becomes_an_error_event_and_ends_the_stream() -> None:
    a = Answer([("text", ["hi"])], "stop", None, prompt=3, completion=2)
    raw = render_stream(a)
    cut_at = raw.index(b"data: ", 10)  # after the first chunk
    err = frame({"error": {"message": "engine died", "type": "InternalServerError", "code": 503}})
    body, tail, _ = translate([raw[:cut_at], err, raw[cut_at:]])
    evs = parse(body + tail)
    assert evs[-1] == (
        "error",
        {"type": "error", "error": {"type": "overloaded_error", "message": "engine died"}},
    )
    assert [n for n, _ in evs] == ["message_start", "ping", "error"]


def test_other_choices_and_non_json_events_are_ignored() -> None:
    a = Answer([("text", ["hi"])], "stop", None, prompt=3, completion=2)
    raw = render_stream(a)
    other = frame(
        {"id": "x", "choices": [{"index": 1, "delta": {"content": "other"}, "finish_reason": None}]}
    )
    body, tail, view = translate([other, b"data: not json\n\n", raw])
    assert view.response is not None
    assert view.response["content"] == [{"type": "text", "text": "hi"}]
    reassemble(parse(body + tail))


def test_without_usage_the_output_count_is_the_ids_received() -> None:
    head = {"id": "c", "model": "m"}
    chunks = [
        frame({**head, "choices": [{"index": 0, "delta": {"content": "a"}, "token_ids": [5, 6]}]}),
        frame({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "token_ids": [2]}]}),
        b"data: [DONE]\n\n",
    ]
    _, tail, _ = translate(chunks)
    assert parse(tail)[0][1]["usage"]["output_tokens"] == 3
