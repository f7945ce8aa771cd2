"""What capture asks vLLM for, and the strip that hides it again: exactly what the client did not ask for."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from agl_lite.capture.plan import NOTHING, asked, plan
from agl_lite.capture.strip import Strip


@pytest.mark.parametrize(
    ("body", "added", "strip"),
    [
        ({}, {"return_token_ids": True}, Strip(token_ids=True)),
        (
            {"stream": True},
            {"return_token_ids": True, "stream_options": {"include_usage": True}},
            Strip(token_ids=True, usage=True),
        ),
        (
            # Continuous usage comes only with include_usage (vLLM): asked without it, the client gets no usage,
            # and so it must stay off when capture asks for the final usage.
            {"stream": True, "stream_options": {"continuous_usage_stats": True}},
            {
                "return_token_ids": True,
                "stream_options": {"continuous_usage_stats": False, "include_usage": True},
            },
            Strip(token_ids=True, usage=True),
        ),
        ({"return_token_ids": "true", "stream": True, "stream_options": {"include_usage": 1}}, {}, NOTHING),
    ],
)
def test_the_plan_adds_only_what_the_client_did_not_ask_and_strips_only_that(
    body: dict[str, Any], added: dict[str, Any], strip: Strip
) -> None:
    assert plan(body, "chat", logprobs=False, top_logprobs=0) == (added, strip)


def test_injected_logprobs_are_stripped_and_the_clients_own_are_not() -> None:
    added, strip = plan({}, "chat", logprobs=True, top_logprobs=2)
    assert added == {"return_token_ids": True, "logprobs": True, "top_logprobs": 2}
    assert strip == Strip(token_ids=True, logprobs=True)
    added, strip = plan({"logprobs": True}, "chat", logprobs=True, top_logprobs=2)
    assert added == {"return_token_ids": True}
    assert not strip.logprobs
    assert plan({"logprobs": 0}, "completions", logprobs=True, top_logprobs=2)[0] == {
        "return_token_ids": True
    }


@pytest.mark.parametrize(
    "value",
    [
        True,
        1,
        1.0,
        "1",
        "TRUE",
        "yes",
        "On",
        "t",
        "Y",
        " TRUE ",
        False,
        0,
        0.0,
        None,
        2,
        0.5,
        "2",
        "nope",
        [],
        {},
    ],
)
def test_a_boolean_option_is_read_as_vllms_lax_parsing_reads_it(value: Any) -> None:
    """vLLM reads its request with pydantic (lax): `"yes"` streams, `2` is refused (then vLLM answers 400)."""
    try:
        on = TypeAdapter(bool).validate_python(value)
    except ValidationError:
        on = False
    assert asked(value) is on


def test_a_stream_asked_for_in_vllms_lax_way_gets_its_usage_asked_for_too() -> None:
    added, strip = plan({"stream": "yes"}, "chat", logprobs=False, top_logprobs=0)
    assert added["stream_options"] == {"include_usage": True}
    assert strip.usage
