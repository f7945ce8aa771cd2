"""One Response from chat deltas: usage counted the Responses way, items in the order the model made them, the
status of an answer cut at max tokens, logprobs only when asked for, and ids of its own."""

from __future__ import annotations

from typing import Any

from openai.types.responses import Response

from agl_lite.translate.responses import ResponseBuilder, new_response_id, to_chat, usage_of


def chat(message: dict[str, Any], finish: str = "stop", logprobs: Any = None) -> dict[str, Any]:
    usage = {
        "prompt_tokens": 10,
        "completion_tokens": 4,
        "total_tokens": 14,
        "prompt_tokens_details": {"cached_tokens": 6},
        "completion_tokens_details": {"reasoning_tokens": 2},
    }
    choice = {"index": 0, "message": message, "finish_reason": finish, "logprobs": logprobs}
    return {"choices": [choice], "usage": usage}


def test_usage_is_counted_as_the_responses_api_counts_it() -> None:
    assert usage_of(chat({})["usage"]) == {
        "input_tokens": 10,
        "input_tokens_details": {"cached_tokens": 6, "cache_write_tokens": 0},
        "output_tokens": 4,
        "output_tokens_details": {"reasoning_tokens": 2},
        "total_tokens": 14,
    }
    assert usage_of({"prompt_tokens": 3, "completion_tokens": 2})["total_tokens"] == 5  # type: ignore[index]
    assert usage_of(None) is None


def test_items_come_in_the_order_the_model_made_them_and_the_request_is_echoed() -> None:
    request = to_chat(
        {"model": "m", "input": "x", "instructions": "I.", "metadata": {"a": "b"}, "temperature": 0.1}
    )
    body = ResponseBuilder(request, "alias", "resp_x").whole(
        chat(
            {
                "reasoning_content": "think",
                "content": "answer",
                "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}],
            }
        )
    )
    r = Response.model_validate(body)
    assert [i.type for i in r.output] == ["reasoning", "message", "function_call"]
    assert (r.id, r.model, r.instructions, r.metadata, r.temperature) == (
        "resp_x",
        "alias",
        "I.",
        {"a": "b"},
        0.1,
    )
    assert r.output[0].content[0].text == "think"  # type: ignore[union-attr]
    assert r.output[2].call_id == "c"  # type: ignore[union-attr]


def test_an_answer_cut_at_max_tokens_is_incomplete_and_says_why() -> None:
    body = ResponseBuilder(to_chat({"model": "m", "input": "x"}), "m").whole(
        chat({"content": "cut"}, "length")
    )
    r = Response.model_validate(body)
    assert (r.status, r.incomplete_details and r.incomplete_details.reason) == (
        "incomplete",
        "max_output_tokens",
    )
    assert r.output[0].status == "incomplete"  # type: ignore[union-attr]


def test_logprobs_reach_the_client_only_when_it_asked() -> None:
    lp = [{"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": []}]
    for include, want in (([], []), (["message.output_text.logprobs"], lp)):
        b = ResponseBuilder(to_chat({"model": "m", "input": "x", "include": include}), "m")
        b.start()
        (delta,) = [e for e in b.delta({"content": "a"}, lp) if e["type"] == "response.output_text.delta"]
        assert delta["logprobs"] == want


def test_ids_are_unique() -> None:
    assert len({new_response_id() for _ in range(1000)}) == 1000


def test_a_call_to_a_namespaced_tool_comes_back_with_its_namespace() -> None:
    ns = {
        "type": "namespace",
        "name": "agents",
        "description": "Sub-agents.",
        "tools": [{"type": "function", "name": "spawn"}],
    }
    request = to_chat({"model": "m", "input": "x", "tools": [ns]})
    call = {"id": "c", "function": {"name": "agents.spawn", "arguments": "{}"}}
    r = Response.model_validate(ResponseBuilder(request, "m").whole(chat({"tool_calls": [call]})))
    (item,) = r.output
    assert item.type == "function_call"
    assert (item.name, item.namespace) == ("spawn", "agents")
