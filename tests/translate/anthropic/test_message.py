"""The message builder: chat deltas → Anthropic events and the whole message; stop reasons; whole bodies."""

from __future__ import annotations

import json
from typing import Any

import pytest
from anthropic.types import Message

from agl_lite.capture.client_view import ClientView
from agl_lite.core.flow import BodyRefused
from agl_lite.translate.anthropic.message import MessageBuilder, new_message_id, stop_reason
from agl_lite.translate.anthropic.stream import message_body


def events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in raw.decode().split("\n\n")[:-1]:
        name_line, data_line = block.split("\n")
        out.append((name_line.removeprefix("event: "), json.loads(data_line.removeprefix("data: "))))
    return out


def test_events_for_thinking_text_and_a_tool_call_in_order() -> None:
    b = MessageBuilder("msg_1", "m")
    b.start(input_tokens=7)
    b.thinking("Hm.")
    b.text("Sum: ")
    b.tool(0, "call_1", "add", '{"a": ')
    b.tool(0, None, None, "2}")
    b.finished("tool_calls")
    b.usage(7, 9)
    b.end()
    assert [
        (n, d.get("index"), (d.get("delta") or d.get("content_block") or {}).get("type"))
        for n, d in events(b.take())
    ] == [
        ("message_start", None, None),
        ("ping", None, None),
        ("content_block_start", 0, "thinking"),
        ("content_block_delta", 0, "thinking_delta"),
        ("content_block_stop", 0, None),
        ("content_block_start", 1, "text"),
        ("content_block_delta", 1, "text_delta"),
        ("content_block_stop", 1, None),
        ("content_block_start", 2, "tool_use"),
        ("content_block_delta", 2, "input_json_delta"),  # the arguments, once whole (held: see `tool`)
        ("content_block_stop", 2, None),
        ("message_delta", None, None),
        ("message_stop", None, None),
    ]


def test_message_start_and_message_delta_carry_the_usage_known_then() -> None:
    b = MessageBuilder("msg_1", "m")
    b.start(input_tokens=7)
    b.text("x")
    b.finished("stop")
    b.usage(7, 3)
    b.end()
    evs = dict(events(b.take()))
    assert evs["message_start"]["message"]["usage"] == {"input_tokens": 7, "output_tokens": 0}
    assert evs["message_start"]["message"]["content"] == []
    assert evs["message_start"]["message"]["stop_reason"] is None
    assert evs["message_delta"] == {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": None},
        "usage": {"input_tokens": 7, "output_tokens": 3},
    }


def test_the_whole_message_is_what_the_events_say_and_validates_with_the_sdk() -> None:
    b = MessageBuilder("msg_1", "m")
    b.thinking("think")
    b.text("a")
    b.text("b")
    b.tool(0, "call_1", "add", '{"a": 1}')
    b.finished("tool_calls")
    b.usage(4, 6)
    b.end()
    message = b.message()
    assert message["content"] == [
        {"type": "thinking", "thinking": "think", "signature": ""},
        {"type": "text", "text": "ab"},
        {"type": "tool_use", "id": "call_1", "name": "add", "input": {"a": 1}},
    ]
    assert (message["stop_reason"], message["usage"]) == ("tool_use", {"input_tokens": 4, "output_tokens": 6})
    Message.model_validate(message)


def test_empty_pieces_open_no_block() -> None:
    b = MessageBuilder("msg_1", "m")
    b.text("")
    b.thinking("")
    b.finished("stop")
    b.end()
    assert b.message()["content"] == []
    assert [n for n, _ in events(b.take())] == ["message_start", "ping", "message_delta", "message_stop"]


def test_a_tool_call_without_an_id_gets_one() -> None:
    b = MessageBuilder("msg_1", "m", emit=False)
    b.tool(0, None, "f", "{}")
    b.end()
    assert b.message()["content"][0]["id"].startswith("toolu_")
    assert b.take() == b""  # emit=False encodes nothing


def test_arguments_that_are_not_a_json_object_become_an_empty_input() -> None:
    b = MessageBuilder("msg_1", "m")
    b.tool(0, "c", "f", '{"a": ')
    b.tool(1, "d", "g", "[1, 2]")
    assert [c["input"] for c in b.message()["content"]] == [{}, {}]


def test_an_error_ends_the_stream_and_nothing_follows_it() -> None:
    b = MessageBuilder("msg_1", "m")
    b.start()
    b.fail(503, "busy")
    b.end()
    evs = events(b.take())
    assert evs[-1] == ("error", {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}})
    assert [n for n, _ in evs] == ["message_start", "ping", "error"]
    assert b.message()["stop_reason"] is None


@pytest.mark.parametrize(
    ("finish", "matched", "tools", "want"),
    [
        ("stop", None, False, ("end_turn", None)),
        ("stop", 2, False, ("end_turn", None)),  # a stop token id, not one of the client's sequences
        ("stop", "END", False, ("stop_sequence", "END")),
        ("length", None, False, ("max_tokens", None)),
        ("length", None, True, ("max_tokens", None)),
        ("tool_calls", None, True, ("tool_use", None)),
        ("stop", None, True, ("tool_use", None)),
        ("abort", None, False, ("end_turn", None)),
    ],
)
def test_stop_reasons(finish: str, matched: Any, tools: bool, want: tuple[str, str | None]) -> None:
    assert stop_reason(finish, matched, tools) == want


def test_message_ids_are_unique_and_anthropic_shaped() -> None:
    ids = {new_message_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(i.startswith("msg_") for i in ids)


def chat_completion(message: dict[str, Any], finish: str, stop: Any = None) -> bytes:
    return json.dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": "served",
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "stop_reason": stop}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16},
        }
    ).encode()


def test_whole_chat_completion_with_reasoning_text_and_tool_calls() -> None:
    message = {
        "role": "assistant",
        "content": "I will add.",
        "reasoning": "2 and 3.",
        "tool_calls": [
            {"id": "call_9", "type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}}
        ],
    }
    view = ClientView("messages", b"{}", "msg_7")
    body = json.loads(
        message_body(
            chat_completion(message, "tool_calls"), MessageBuilder("msg_7", "asked", emit=False), view
        )
    )
    assert body == {
        "id": "msg_7",
        "type": "message",
        "role": "assistant",
        "model": "served",
        "content": [
            {"type": "thinking", "thinking": "2 and 3.", "signature": ""},
            {"type": "text", "text": "I will add."},
            {"type": "tool_use", "id": "call_9", "name": "add", "input": {"a": 2}},
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 11, "output_tokens": 5},
    }
    assert view.response == body
    Message.model_validate(body)


def test_whole_chat_completion_stopped_by_a_stop_sequence_and_old_reasoning_name() -> None:
    message = {"role": "assistant", "content": "1, 2", "reasoning_content": "count"}
    view = ClientView("messages", b"{}", "msg_7")
    body = json.loads(
        message_body(chat_completion(message, "stop", ", 3"), MessageBuilder("msg_7", "m", emit=False), view)
    )
    assert (body["stop_reason"], body["stop_sequence"]) == ("stop_sequence", ", 3")
    assert body["content"][0] == {"type": "thinking", "thinking": "count", "signature": ""}


def test_a_body_that_is_no_chat_completion_becomes_an_api_error_object() -> None:
    view = ClientView("messages", b"{}", "msg_7")
    with pytest.raises(
        BodyRefused
    ) as refused:  # the client gets a 502, not the upstream's status and headers
        message_body(b"<html>", MessageBuilder("msg_7", "m", emit=False), view)
    assert refused.value.status == 502
    body = json.loads(refused.value.body)
    assert body["type"] == "error"
    assert body["error"]["type"] == "api_error"
    assert view.response is None
