"""A Responses request as the chat request that asks vLLM the same thing: every supported field maps, everything
else is a 400 naming the field (nothing dropped silently)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agl_lite.errors import BadRequest
from agl_lite.translate.responses import CUSTOM_INPUT, to_chat


def test_a_string_input_with_instructions_and_sampling() -> None:
    t = to_chat(
        {
            "model": "m",
            "instructions": "Be brief.",
            "input": "hi",
            "temperature": 0.5,
            "top_p": 0.9,
            "max_output_tokens": 64,
            "metadata": {"k": "v"},
            "store": False,
            "stream": True,
        }
    )
    assert t.chat == {
        "model": "m",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        "temperature": 0.5,
        "top_p": 0.9,
        "max_tokens": 64,
        "stream": True,
    }
    assert t.echo["metadata"] == {"k": "v"}
    assert t.echo["store"] is False


def test_the_items_of_a_conversation_become_its_chat_messages() -> None:
    """As Codex and the Agents SDK resend a conversation: typed parts, the model's calls (consecutive ones in one
    assistant message, after its text), their outputs, reasoning left out, developer as system."""
    items: list[Any] = [
        {"role": "developer", "content": [{"type": "input_text", "text": "Rules."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix it."}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "On it.", "annotations": []}],
        },
        {"type": "function_call", "call_id": "c1", "name": "bash", "arguments": '{"cmd": "ls"}'},
        {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** Begin Patch"},
        {"type": "function_call_output", "call_id": "c1", "output": "a.py"},
        {
            "type": "custom_tool_call_output",
            "call_id": "c2",
            "output": [{"type": "input_text", "text": "ok"}],
        },
        {"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AA"}]},
    ]
    messages = to_chat({"model": "m", "input": items}).chat["messages"]
    assert messages == [
        {"role": "system", "content": "Rules."},
        {"role": "user", "content": "Fix it."},
        {
            "role": "assistant",
            "content": "On it.",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}},
                {
                    "id": "c2",
                    "type": "function",
                    "function": {
                        "name": "apply_patch",
                        "arguments": json.dumps({CUSTOM_INPUT: "*** Begin Patch"}),
                    },
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.py"},
        {"role": "tool", "tool_call_id": "c2", "content": "ok"},
        {
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}],
        },
    ]


def test_function_and_custom_tools_tool_choice_and_history() -> None:
    t = to_chat(
        {
            "model": "m",
            "input": "go",
            "tools": [
                {
                    "type": "function",
                    "name": "add",
                    "description": "Add.",
                    "parameters": {"type": "object"},
                    "strict": True,
                },
                {
                    "type": "custom",
                    "name": "apply_patch",
                    "description": "Patch.",
                    "format": {"type": "grammar"},
                },
            ],
            "tool_choice": {"type": "function", "name": "add"},
            "parallel_tool_calls": False,
        },
        history=[{"role": "user", "content": "earlier"}],
    )
    assert t.chat["tools"][0] == {
        "type": "function",
        "function": {"name": "add", "description": "Add.", "parameters": {"type": "object"}, "strict": True},
    }
    custom = t.chat["tools"][1]["function"]
    assert (custom["name"], custom["parameters"]["required"]) == ("apply_patch", [CUSTOM_INPUT])
    assert t.custom_tools == frozenset({"apply_patch"})
    assert t.chat["tool_choice"] == {"type": "function", "function": {"name": "add"}}
    assert t.chat["parallel_tool_calls"] is False
    assert t.chat["messages"][0] == {"role": "user", "content": "earlier"}  # the earlier turns come first


def test_output_format_reasoning_and_logprobs() -> None:
    schema = {"type": "object"}
    t = to_chat(
        {
            "model": "m",
            "input": "x",
            "text": {"format": {"type": "json_schema", "name": "out", "schema": schema, "strict": True}},
            "reasoning": {"effort": "minimal"},
            "include": ["message.output_text.logprobs", "reasoning.encrypted_content"],
            "top_logprobs": 3,
        }
    )
    assert t.chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "out", "schema": schema, "strict": True},
    }
    assert t.chat["reasoning_effort"] == "low"
    assert (t.chat["logprobs"], t.chat["top_logprobs"], t.logprobs) == (True, 3, True)
    assert (
        "response_format"
        not in to_chat({"model": "m", "input": "x", "text": {"format": {"type": "text"}}}).chat
    )


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "x"}, "model"),
        ({"model": "m"}, "input"),
        ({"model": "m", "input": []}, "input"),
        ({"model": "m", "input": [{"type": "item_reference", "id": "i"}]}, "input[0].type"),
        ({"model": "m", "input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        (
            {"model": "m", "input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input[0].content[0]",
        ),
        (  # a supported part with a value of the wrong type names that value, not the part as unsupported
            {"model": "m", "input": [{"role": "user", "content": [{"type": "input_text", "text": 5}]}]},
            "input[0].content[0].text",
        ),
        (
            {
                "model": "m",
                "input": [{"type": "function_call", "name": "f", "call_id": "c", "arguments": {}}],
            },
            "input[0].arguments",
        ),
        ({"model": "m", "input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"model": "m", "input": "x", "tools": [{"type": "local_shell"}]}, "tools[0].type"),
        ({"model": "m", "input": "x", "tool_choice": {"type": "allowed_tools"}}, "tool_choice"),
        ({"model": "m", "input": "x", "text": {"format": {"type": "json_schema"}}}, "text.format"),
        ({"model": "m", "input": "x", "include": ["file_search_call.results"]}, "include"),
        ({"model": "m", "input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"model": "m", "input": "x", "stream": "yes"}, "stream"),
        ({"model": "m", "input": "x", "truncation": "auto"}, "truncation"),
        ({"model": "m", "input": "x", "background": True}, "background"),
        ({"model": "m", "input": "x", "conversation": "c"}, "conversation"),
    ],
)
def test_what_a_chat_template_cannot_express_is_a_400_naming_it(body: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequest) as caught:
        to_chat(body)
    assert caught.value.extra["param"] == param


def test_what_codex_sends_a_namespace_of_tools_and_its_client_metadata() -> None:
    """Codex groups tools in namespaces and says who it is in `client_metadata` (not sent upstream)."""
    ns = {
        "type": "namespace",
        "name": "agents",
        "description": "Sub-agents.",
        "tools": [{"type": "function", "name": "spawn", "parameters": {"type": "object"}}],
    }
    t = to_chat(
        {
            "model": "m",
            "input": [
                {
                    "type": "function_call",
                    "namespace": "agents",
                    "name": "spawn",
                    "call_id": "c",
                    "arguments": "{}",
                }
            ],
            "tools": [ns],
            "client_metadata": {"session_id": "s"},
            "reasoning": {"summary": "auto"},
        }
    )
    assert [tool["function"]["name"] for tool in t.chat["tools"]] == ["agents.spawn"]
    assert t.namespaced == {"agents.spawn": ("agents", "spawn")}
    assert t.chat["messages"][0]["tool_calls"][0]["function"]["name"] == "agents.spawn"
    assert "client_metadata" not in t.chat
    assert "reasoning_effort" not in t.chat
