"""The store API's JSON to and from the store's record dataclasses (built with `agl_lite.store.codec`).

Token ids and logprobs come back as packed arrays, as the in-process store returns them. Keys this client does
not know (a newer server) are dropped rather than refused. No I/O here.
"""

from __future__ import annotations

import dataclasses
from array import array
from typing import Any

from agl_lite.store import codec
from agl_lite.store.records import (
    Attempt,
    Event,
    LLMCall,
    ModelRecord,
    Resource,
    Rollout,
    RolloutConfig,
)
from agl_lite.store.rules import EventSpec, RolloutSpec

__all__ = [
    "attempt",
    "call",
    "event",
    "event_to_json",
    "model",
    "resource",
    "rollout",
    "spec_to_json",
]


def _known(cls: type[Any], d: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in d.items() if k in names}


def spec_to_json(spec: RolloutSpec) -> dict[str, Any]:
    return {
        "input": spec.input,
        "mode": spec.mode,
        "config": dataclasses.asdict(spec.config),
        "metadata": spec.metadata,
        "group_id": spec.group_id,
        "resources_version": spec.resources_version,
        "rollout_id": spec.id,
    }


def event_to_json(spec: EventSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": spec.kind, "data": spec.data}
    if spec.attempt_id is not None:
        out["attempt_id"] = spec.attempt_id
    return out


def rollout(d: dict[str, Any]) -> Rollout:
    d = _known(Rollout, d)
    d["config"] = dataclasses.asdict(RolloutConfig(**_known(RolloutConfig, d["config"])))
    return codec.rollout_from_json(d)


def attempt(d: dict[str, Any]) -> Attempt:
    return codec.attempt_from_json(_known(Attempt, d))


def event(d: dict[str, Any]) -> Event:
    return codec.event_from_json(_known(Event, d))


def resource(d: dict[str, Any]) -> Resource:
    return codec.resource_from_json(_known(Resource, d))


def model(d: dict[str, Any]) -> ModelRecord:
    return codec.model_from_json(_known(ModelRecord, d))


def call(d: dict[str, Any]) -> LLMCall:
    d = _known(LLMCall, d)
    raw_prompt = d.pop("prompt_token_ids", None)
    prompt = None if raw_prompt is None else array("I", raw_prompt)
    ids: list[array[int]] = []
    logprobs: list[array[float] | None] = []
    choices = []
    for c in d.get("choices") or []:
        ids.append(array("I", c.get("token_ids") or ()))
        lps = c.get("logprobs")
        logprobs.append(None if lps is None else array("f", lps))
        choices.append({k: c.get(k) for k in ("index", "text", "tool_calls", "finish_reason")})
    d["choices"] = choices
    return codec.call_from_json(d, prompt, ids, logprobs)
