"""Anthropic request → chat completions request: one test per translation rule, and bad input as a clear 400."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agl_lite.errors import BadRequest
from agl_lite.translate.anthropic.request import to_chat, to_tokenize

USER = {"role": "user", "content": "hi"}


def chat(**fields: Any) -> dict[str, Any]:
    return to_chat({"model": "m", "max_tokens": 16, "messages": [USER], **fields})


def test_minimal_request_keeps_model_max_tokens_and_a_string_message() -> None:
    assert chat() == {"model": "m", "messages": [USER], "max_tokens": 16}


def test_stream_asks_the_upstream_for_usage() -> None:
    out = chat(stream=True)
    assert (out["stream"], out["stream_options"]) == (True, {"include_usage": True})
    assert "stream" not in chat(stream=False)


def test_sampling_fields_and_stop_sequences() -> None:
    out = chat(temperature=0.2, top_p=0.9, top_k=40, stop_sequences=["\n\nHuman:", "END"])
    assert (out["temperature"], out["top_p"], out["top_k"]) == (0.2, 0.9, 40)
    assert out["stop"] == ["\n\nHuman:", "END"]


def test_system_string_becomes_the_first_message() -> None:
    assert chat(system="Be brief.")["messages"] == [{"role": "system", "content": "Be brief."}, USER]


def test_system_blocks_become_text_parts_and_a_lone_block_a_string() -> None:
    one = chat(system=[{"type": "text", "text": "A", "cache_control": {"type": "ephemeral"}}])
    assert one["messages"][0] == {"role": "system", "content": "A"}
    two = chat(system=[{"type": "text", "text": "A"}, {"type": "text", "text": "B"}])
    assert two["messages"][0]["content"] == [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]


def test_claude_codes_billing_header_block_is_left_out_unless_asked_to_keep_it() -> None:
    header = {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.1.abc; cch=1f2e3;"}
    body = {
        "model": "m",
        "max_tokens": 4,
        "messages": [USER],
        "system": [header, {"type": "text", "text": "S"}],
    }
    assert to_chat(body)["messages"][0] == {"role": "system", "content": "S"}
    kept = to_chat(body, strip_billing_header=False)["messages"][0]["content"]
    assert [p["text"] for p in kept] == [header["text"], "S"]
    as_string = to_chat({**body, "system": header["text"] + "\nS"})
    assert as_string["messages"][0] == {"role": "system", "content": "S"}


def test_user_text_and_image_blocks_become_content_parts() -> None:
    blocks = [
        {"type": "text", "text": "What is this?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"}},
        {"type": "image", "source": {"type": "url", "url": "https://example.invalid/cat.png"}},
    ]
    (msg,) = chat(messages=[{"role": "user", "content": blocks}])["messages"]
    assert msg == {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBOR"}},
            {"type": "image_url", "image_url": {"url": "https://example.invalid/cat.png"}},
        ],
    }


def test_a_plain_text_document_is_text() -> None:
    doc = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "notes"}}
    (msg,) = chat(messages=[{"role": "user", "content": [doc]}])["messages"]
    assert msg == {"role": "user", "content": "notes"}


def test_assistant_tool_use_becomes_a_tool_call_with_json_arguments() -> None:
    turn = {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Let me add."},
            {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 2, "b": "é"}},
        ],
    }
    (msg,) = chat(messages=[USER, turn])["messages"][1:]
    assert msg == {
        "role": "assistant",
        "content": "Let me add.",
        "tool_calls": [
            {
                "id": "toolu_1",
                "type": "function",
                "function": {"name": "add", "arguments": '{"a": 2, "b": "é"}'},
            }
        ],
    }


def test_assistant_with_only_a_tool_call_has_null_content_as_vllm_answers_it() -> None:
    turn = {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}
    (msg,) = chat(messages=[USER, turn])["messages"][1:]
    assert msg["content"] is None
    assert msg["tool_calls"][0]["function"]["arguments"] == "{}"


def test_thinking_blocks_become_reasoning_and_redacted_thinking_is_dropped() -> None:
    turn = {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "Two plus ", "signature": "sig"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "thinking", "thinking": "three.", "signature": "sig"},
            {"type": "text", "text": "5"},
        ],
    }
    (msg,) = chat(messages=[USER, turn])["messages"][1:]
    assert msg == {"role": "assistant", "content": "5", "reasoning": "Two plus three."}


def test_tool_results_become_tool_messages_before_the_rest_of_the_user_turn() -> None:
    turn = {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "5"},
            {
                "type": "tool_result",
                "tool_use_id": "t2",
                "content": [{"type": "text", "text": "ok"}],
                "is_error": True,
            },
            {"type": "text", "text": "Thanks."},
        ],
    }
    assert chat(messages=[turn])["messages"] == [
        {"role": "tool", "tool_call_id": "t1", "content": "5"},
        {"role": "tool", "tool_call_id": "t2", "content": "ok"},
        {"role": "user", "content": "Thanks."},
    ]


def test_a_tool_results_images_follow_it_in_a_user_message() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "AA"}}
    result = {
        "type": "tool_result",
        "tool_use_id": "t1",
        "content": [{"type": "text", "text": "shot"}, image],
    }
    assert chat(messages=[{"role": "user", "content": [result]}])["messages"] == [
        {"role": "tool", "tool_call_id": "t1", "content": "shot"},
        {
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,AA"}}],
        },
    ]


def test_an_empty_tool_result_is_an_empty_tool_message() -> None:
    result = {"type": "tool_result", "tool_use_id": "t1"}
    assert chat(messages=[{"role": "user", "content": [result]}])["messages"] == [
        {"role": "tool", "tool_call_id": "t1", "content": ""}
    ]


def test_tools_become_functions() -> None:
    tool = {"name": "add", "description": "Adds.", "input_schema": {"type": "object"}, "cache_control": {}}
    assert chat(tools=[tool])["tools"] == [
        {
            "type": "function",
            "function": {"name": "add", "description": "Adds.", "parameters": {"type": "object"}},
        }
    ]


def test_server_tools_are_left_out_as_no_upstream_here_can_run_them() -> None:
    search = {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}
    custom = {"type": "custom", "name": "add", "input_schema": {"type": "object"}}
    assert [t["function"]["name"] for t in chat(tools=[search, custom])["tools"]] == ["add"]
    assert "tools" not in chat(tools=[search])


@pytest.mark.parametrize(
    ("choice", "want"),
    [
        ({"type": "auto"}, "auto"),
        ({"type": "any"}, "required"),
        ({"type": "none"}, "none"),
        ({"type": "tool", "name": "add"}, {"type": "function", "function": {"name": "add"}}),
    ],
)
def test_tool_choice(choice: dict[str, Any], want: Any) -> None:
    assert chat(tool_choice=choice)["tool_choice"] == want


def test_disable_parallel_tool_use_turns_parallel_tool_calls_off() -> None:
    assert (
        chat(tool_choice={"type": "auto", "disable_parallel_tool_use": True})["parallel_tool_calls"] is False
    )


def test_a_prefilled_assistant_turn_is_continued_not_answered() -> None:
    out = chat(messages=[USER, {"role": "assistant", "content": "The answer is ("}])
    assert out["messages"][-1] == {"role": "assistant", "content": "The answer is ("}
    assert (out["add_generation_prompt"], out["continue_final_message"]) == (False, True)
    assert "continue_final_message" not in chat()


def test_a_system_turn_inside_the_conversation_stays_in_place() -> None:
    turn = {"role": "system", "content": [{"type": "text", "text": "Now be terse."}]}
    assert chat(messages=[USER, turn, USER])["messages"] == [
        USER,
        {"role": "system", "content": "Now be terse."},
        USER,
    ]


def test_fields_without_a_chat_equivalent_are_ignored() -> None:
    out = chat(
        metadata={"user_id": "u"}, thinking={"type": "enabled", "budget_tokens": 1024}, service_tier="auto"
    )
    assert set(out) == {"model", "messages", "max_tokens"}


def test_token_count_request_renders_the_prompt_with_tools_and_no_max_tokens() -> None:
    tool = {"name": "add", "input_schema": {"type": "object"}}
    out = to_tokenize(
        {"model": "m", "messages": [USER], "system": "S", "tools": [tool], "tool_choice": {"type": "any"}}
    )
    assert out == {
        "model": "m",
        "messages": [{"role": "system", "content": "S"}, USER],
        "tools": [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}],
        "add_generation_prompt": True,
    }


BAD: list[tuple[dict[str, Any], str]] = [
    ({"max_tokens": 4, "messages": [USER]}, "model"),
    ({"model": "m", "messages": [USER]}, "max_tokens"),
    ({"model": "m", "max_tokens": 0, "messages": [USER]}, "max_tokens"),
    ({"model": "m", "max_tokens": True, "messages": [USER]}, "max_tokens"),
    ({"model": "m", "max_tokens": 4, "messages": []}, "messages"),
    ({"model": "m", "max_tokens": 4, "messages": [{"role": "bot", "content": "x"}]}, "messages.0.role"),
    ({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": 3}]}, "messages.0.content"),
    ({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": []}]}, "messages.0.content"),
    (
        {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "video"}]}]},
        "video",
    ),
    ({"model": "m", "max_tokens": 4, "messages": [USER], "stream": "yes"}, "stream"),
    ({"model": "m", "max_tokens": 4, "messages": [USER], "temperature": "hot"}, "temperature"),
    ({"model": "m", "max_tokens": 4, "messages": [USER], "stop_sequences": "END"}, "stop_sequences"),
    ({"model": "m", "max_tokens": 4, "messages": [USER], "tools": [{"name": "f"}]}, "tools.0.input_schema"),
    ({"model": "m", "max_tokens": 4, "messages": [USER], "tool_choice": {"type": "some"}}, "tool_choice"),
    ({"model": "m", "max_tokens": 4, "messages": [USER], "system": 5}, "system"),
]


@pytest.mark.parametrize(("body", "names"), BAD, ids=[n for _, n in BAD])
def test_bad_input_is_a_bad_request_naming_the_field(body: dict[str, Any], names: str) -> None:
    with pytest.raises(BadRequest, match=names.replace(".", r"\.")):
        to_chat(body)


def test_bad_image_and_tool_use_blocks_name_where_they_are() -> None:
    image = {"type": "image", "source": {"type": "file", "file_id": "f"}}
    with pytest.raises(BadRequest, match=r"messages\.0\.content\.0\.source"):
        to_chat({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": [image]}]})
    bad_call = {"type": "tool_use", "id": "t", "name": "f", "input": "not an object"}
    with pytest.raises(BadRequest, match=r"messages\.1\.content\.0\.input"):
        to_chat(
            {"model": "m", "max_tokens": 4, "messages": [USER, {"role": "assistant", "content": [bad_call]}]}
        )


def test_translation_does_not_touch_the_clients_body() -> None:
    body = {"model": "m", "max_tokens": 4, "messages": [USER], "system": "S", "stream": True}
    before = json.dumps(body)
    to_chat(body)
    assert json.dumps(body) == before


RICH = {
    "model": "m",
    "max_tokens": 16,
    "system": [{"type": "text", "text": "S"}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]},
    ],
    "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}],
    "tool_choice": {"type": "tool", "name": "f", "disable_parallel_tool_use": True},
    "stop_sequences": ["END"],
    "temperature": 0.5,
    "stream": True,
}


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _leaves(v, (*path, k))] or [path]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _leaves(v, (*path, i))] or [path]
    return [path]


def _replaced(path: tuple[Any, ...], new: Any) -> dict[str, Any]:
    body = json.loads(json.dumps(RICH))
    node = body
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = new
    return body


@pytest.mark.parametrize("new", [[], {}, ["x"], {"a": 1}, None, 7, "x"], ids=repr)
def test_any_field_of_any_json_type_is_translated_or_a_bad_request(new: Any) -> None:
    """Issue #15 M2 (`tool_choice.type` as a list was a 500 and a traceback): a value of the wrong JSON type
    anywhere in the request is a 400, never another exception."""
    refused = 0
    for path in _leaves(RICH):
        try:
            to_chat(_replaced(path, new))
        except BadRequest:
            refused += 1
    assert refused > 0  # no value is right everywhere: the wrong ones were seen and refused
