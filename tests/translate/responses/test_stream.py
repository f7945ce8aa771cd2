"""The stream translator: for any answer vLLM may give (reasoning, then text, then tool calls) and any chunking of
its bytes, the Responses event stream is well formed (every event valid for the openai SDK, sequence numbers
0, 1, 2..., each item added before its deltas and done before the end) and adds up to the same Response as the
whole-body translation of the same answer. Plus the ends: `[DONE]`, truncation, cut at max tokens, in-band errors.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from agl_lite.capture.client_view import ClientView
from agl_lite.errors import InsufficientStorage
from agl_lite.translate.responses import ResponseBuilder, StreamTranslator, response_body, to_chat

EVENT = TypeAdapter(ResponseStreamEvent)
TOOLS = [{"type": "function", "name": n, "parameters": {"type": "object"}} for n in ("add", "bash")]
TOOLS.append({"type": "custom", "name": "apply_patch", "description": "A patch."})


@dataclass
class Answer:
    reasoning: list[str]
    text: list[str]
    calls: list[tuple[str, str, list[str]]]
    """(name, whole arguments, the pieces they stream in)"""
    finish: str


pieces = st.lists(st.text(min_size=1, max_size=6), max_size=4)


@st.composite
def calls(draw: st.DrawFn) -> tuple[str, str, list[str]]:
    name = draw(st.sampled_from(["add", "bash", "apply_patch"]))
    if name == "apply_patch":
        raw = json.dumps({"input": draw(st.text(max_size=12))}, ensure_ascii=False)
    else:
        raw = json.dumps(draw(st.dictionaries(st.text(min_size=1, max_size=3), st.integers(), max_size=3)))
    cuts = sorted(set(draw(st.lists(st.integers(0, len(raw)), max_size=3))) | {0, len(raw)})
    return name, raw, [raw[a:b] for a, b in itertools.pairwise(cuts) if b > a]


answers = st.builds(
    Answer,
    pieces,
    pieces,
    st.lists(calls(), max_size=3),
    st.sampled_from(["stop", "length", "tool_calls"]),
)


def frame(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


HEAD = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "served"}
USAGE = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}


def render_stream(a: Answer, *, done: bool = True) -> bytes:
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    deltas += [{"reasoning_content": p} for p in a.reasoning]
    deltas += [{"content": p} for p in a.text]
    for i, (name, _, parts) in enumerate(a.calls):
        for j, part in enumerate(parts):
            call: dict[str, Any] = {"index": i, "function": {"arguments": part}}
            if j == 0:
                call |= {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": part}}
            deltas.append({"tool_calls": [call]})
    out = [frame({**HEAD, "choices": [{"index": 0, "delta": d, "finish_reason": None}]}) for d in deltas]
    out.append(frame({**HEAD, "choices": [{"index": 0, "delta": {}, "finish_reason": a.finish}]}))
    out.append(frame({**HEAD, "choices": [], "usage": USAGE}))
    if done:
        out.append(b"data: [DONE]\n\n")
    return b"".join(out)


def render_body(a: Answer) -> bytes:
    message = {
        "role": "assistant",
        "content": "".join(a.text) or None,
        "reasoning_content": "".join(a.reasoning) or None,
        "tool_calls": [
            {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": raw}}
            for i, (n, raw, _) in enumerate(a.calls)
        ],
    }
    choice = {"index": 0, "message": message, "finish_reason": a.finish}
    return json.dumps({**HEAD, "object": "chat.completion", "choices": [choice], "usage": USAGE}).encode()


def builder() -> ResponseBuilder:
    return ResponseBuilder(to_chat({"model": "m", "input": "hi", "tools": TOOLS}), "m", "resp_1")


def events_of(raw: bytes) -> list[dict[str, Any]]:
    out = []
    for block in raw.decode().split("\n\n")[:-1]:
        name, data = block.split("\n", 1)
        event = json.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}"
        EVENT.validate_python(event)  # as the openai SDK reads it
        out.append(event)
    return out


def translate(raw: bytes, cuts: list[int]) -> tuple[list[dict[str, Any]], ClientView]:
    view = ClientView("responses", b"{}", "resp_1")
    t = StreamTranslator(builder(), view)
    bounds = [0, *sorted(c for c in cuts if 0 < c < len(raw)), len(raw)]
    out = b"".join(t(raw[a:b]) for a, b in itertools.pairwise(bounds)) + t.flush()
    return events_of(out), view


def check_well_formed(events: list[dict[str, Any]]) -> None:
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"]
    added: dict[int, str] = {}
    done: set[int] = set()
    for e in events:
        if e["type"] == "response.output_item.added":
            assert e["output_index"] not in added
            added[e["output_index"]] = e["item"]["id"]
        elif e["type"] == "response.output_item.done":
            assert added[e["output_index"]] == e["item"]["id"]
            done.add(e["output_index"])
        elif "item_id" in e:
            assert added[e["output_index"]] == e["item_id"]
            assert e["output_index"] not in done
    assert done == set(added)


@settings(max_examples=150, deadline=None)
@given(answers, st.lists(st.integers(0, 4000), max_size=8))
def test_any_chunking_gives_a_well_formed_stream_that_adds_up_to_the_whole_response(
    a: Answer, cuts: list[int]
) -> None:
    events, view = translate(render_stream(a), cuts)
    check_well_formed(events)
    final = events[-1]
    assert final["type"] == ("response.incomplete" if a.finish == "length" else "response.completed")
    streamed = Response.model_validate(final["response"])
    whole_view = ClientView("responses", b"{}", "resp_1")
    whole = Response.model_validate(json.loads(response_body(render_body(a), builder(), whole_view)))
    assert view.response == final["response"]

    def essence(r: Response) -> list[Any]:
        return [
            (i.type, getattr(i, "content", None), getattr(i, "arguments", None), getattr(i, "input", None))
            for i in r.output
        ]

    assert essence(streamed) == essence(whole)
    assert (streamed.status, streamed.usage) == (whole.status, whole.usage)
    kinds = [i.type for i in whole.output]
    assert kinds == (["reasoning"] if a.reasoning else []) + (["message"] if a.text else []) + [
        "custom_tool_call" if n == "apply_patch" else "function_call" for n, _, _ in a.calls
    ]
    for item, (name, raw, _) in zip(whole.output[len(kinds) - len(a.calls) :], a.calls, strict=True):
        if item.type == "custom_tool_call":
            assert item.input == json.loads(raw)["input"]  # the freeform input, out of its JSON wrapper
        else:
            assert (item.name, item.arguments) == (name, raw)


def test_a_stream_without_done_fails_and_an_in_band_error_fails_at_once() -> None:
    a = Answer(["x"], ["hello"], [], "stop")
    events, view = translate(render_stream(a, done=False), [])
    assert events[-1]["type"] == "response.failed"
    assert "ended before it finished" in events[-1]["response"]["error"]["message"]
    assert view.response["status"] == "failed"
    raw = render_stream(a).replace(b"data: [DONE]", b'data: {"error": {"message": "boom"}}\n\ndata: [DONE]')
    events, _ = translate(raw, [])
    assert [e["type"] for e in events if e["type"].startswith("response.") and "response" in e][-1] == (
        "response.failed"
    )
    assert events[-1]["response"]["error"] == {"code": "server_error", "message": "boom"}


def test_a_refused_end_fails_the_response_in_place_of_completing_it() -> None:
    """The record could not be committed: the client gets `response.failed`, never `response.completed`."""
    view = ClientView("responses", b"{}", "resp_1")
    t = StreamTranslator(builder(), view)
    head = t(render_stream(Answer([], ["hi"], [], "stop")))
    t.flush()  # (what the core then drops: it refuses the end)
    tail = t.refuse(InsufficientStorage("the store's disk is full"))
    events = events_of(head + tail)
    assert "response.completed" not in [e["type"] for e in events]
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"]["message"] == "the store's disk is full"
