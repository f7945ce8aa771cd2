"""What the SQLite store's tests share: a captured call of one attempt, built from its prompt and completion."""

from __future__ import annotations

from array import array
from collections.abc import Callable

import pytest

from agl_lite.store.records import CallOutcome, ChoiceRecord, LLMCall

TurnCall = Callable[[int, list[int], list[int]], LLMCall]


def _turn_call(i: int, prompt: list[int], completion: list[int]) -> LLMCall:
    return LLMCall(
        id=f"c{i}",
        order_key=i,
        outcome=CallOutcome.OK,
        api="chat",
        rollout_id="r",
        attempt_id="a",
        prompt_token_ids=array("I", prompt),
        choices=[ChoiceRecord(index=0, token_ids=array("I", completion))],
    )


@pytest.fixture
def turn_call() -> TurnCall:
    """`turn_call(i, prompt, completion)`: call `c{i}` of rollout `r`, attempt `a`, in order `i`."""
    return _turn_call
