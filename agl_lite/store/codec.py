"""Records to and from JSON-able dicts, for backends that store rows as documents and for the HTTP API.

Token ids and logprobs are not JSON here: backends store them packed (see `packed_ids.py`).
"""

from __future__ import annotations

import dataclasses
from array import array
from typing import Any

from agl_lite.store.records import (
    Attempt,
    AttemptStatus,
    CallOutcome,
    ChoiceRecord,
    Event,
    LLMCall,
    ModelRecord,
    Resource,
    Rollout,
    RolloutConfig,
    RolloutStatus,
)

__all__ = [
    "attempt_from_json",
    "call_from_json",
    "call_to_json",
    "event_from_json",
    "model_from_json",
    "resource_from_json",
    "rollout_from_json",
]


def rollout_from_json(d: dict[str, Any]) -> Rollout:
    d = dict(d)
    d["status"] = RolloutStatus(d["status"])
    d["config"] = RolloutConfig(**d["config"])
    return Rollout(**d)


def attempt_from_json(d: dict[str, Any]) -> Attempt:
    return Attempt(**{**d, "status": AttemptStatus(d["status"])})


def event_from_json(d: dict[str, Any]) -> Event:
    return Event(**d)


def resource_from_json(d: dict[str, Any]) -> Resource:
    return Resource(**d)


_MODEL_FIELDS = frozenset(f.name for f in dataclasses.fields(ModelRecord))


def model_from_json(d: dict[str, Any]) -> ModelRecord:
    """Fields this version knows (a newer replica's record may have more)."""
    return ModelRecord(**{k: v for k, v in d.items() if k in _MODEL_FIELDS})


def call_to_json(call: LLMCall) -> dict[str, Any]:
    """Everything but the token ids and logprobs (stored packed, beside)."""
    return call.to_json(with_ids=False)


def call_from_json(
    d: dict[str, Any],
    prompt_ids: array[int] | None,
    choice_ids: list[array[int]],
    choice_logprobs: list[array[float] | None],
) -> LLMCall:
    d = dict(d)
    choices = [
        ChoiceRecord(
            index=c["index"],
            text=c["text"],
            tool_calls=c["tool_calls"],
            finish_reason=c["finish_reason"],
            token_ids=ids,
            logprobs=lps,
        )
        for c, ids, lps in zip(d.pop("choices"), choice_ids, choice_logprobs, strict=True)
    ]
    d["outcome"] = CallOutcome(d["outcome"])
    return LLMCall(**d, prompt_token_ids=prompt_ids, choices=choices)
