"""Deterministic fake sampling for the mock vLLM server: what each choice says, its token ids and logprobs.

It owns the text, ids, finish reasons and logprob numbers of a reply; it must not know the wire format.
"""

from __future__ import annotations

import hashlib
import json
import random
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agl_lite.testing.mock_vllm.scenario import Scenario, ToolCallSpec
from agl_lite.testing.mock_vllm.tokenizer import EOS_ID, EOS_TEXT, FakeTokenizer, hermes_tool_text

__all__ = ["ChoiceOutput", "GenParams", "ToolPlan", "generate_choice"]

_WORDS = (
    "the",
    "number",
    "we",
    "want",
    "is",
    "answer",
    "so",
    "first",
    "then",
    "add",
    "sum",
    "of",
    "total",
    "step",
)
_ALT_PIECES = (" the", " a", " is", ".", ",", " and", "1", "2", " answer", " so", "\n", " of")


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """One hermes tool call inside a choice's text, with the char spans a streaming parser reacts to."""

    call_id: str
    name: str
    arguments: str
    name_end: int
    args_start: int
    args_end: int


@dataclass(slots=True)
class ChoiceOutput:
    index: int
    token_ids: list[int]
    texts: list[str]
    """Visible text each token adds ("" for EOS)."""
    token_strs: list[str]
    """Token strings as logprobs name them (EOS is `<|im_end|>`)."""
    text: str
    finish_reason: str
    stop_reason: str | None
    tools: list[ToolPlan] = field(default_factory=list)
    """Set when the tool parser is active and the output is tool calls (one or several), whole or cut."""
    tool_complete: bool = False
    logprobs: list[float] = field(default_factory=list)
    alternates: list[list[tuple[str, float]]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class GenParams:
    prompt_ids: Sequence[int]
    max_tokens: int
    stop: Sequence[str] = ()
    mock_seed: int = 0
    request_seed: int | None = None
    greedy: bool = False
    logprobs: bool = False
    top_k: int = 0
    tools: Sequence[Mapping[str, Any]] = ()
    tool_choice: Any = None
    endpoint: str = "chat"


def _rng(params: GenParams, index: int, salt: str) -> random.Random:
    # The choice index only matters when sampling; greedy choices all say the same thing, as in vLLM.
    key = (
        f"{params.mock_seed}|{params.request_seed}|{params.endpoint}|{salt}|{0 if params.greedy else index}|"
    )
    key += ",".join(map(str, params.prompt_ids))
    return random.Random(int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big"))


def _sentence(rng: random.Random) -> str:
    words = [
        rng.choice(_WORDS) if rng.random() < 0.8 else str(rng.randint(0, 99))
        for _ in range(rng.randint(4, 12))
    ]
    return " ".join(words).capitalize() + "."


def _tool_functions(tools: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    out: dict[str, Mapping[str, Any]] = {}
    for t in tools:
        fn = t.get("function") if isinstance(t, Mapping) else None
        if isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
            out[fn["name"]] = fn
    return out


def _forced_tool_name(params: GenParams, functions: Mapping[str, Mapping[str, Any]]) -> str | None:
    choice = params.tool_choice
    if isinstance(choice, Mapping):
        fn = choice.get("function")
        return str(fn.get("name")) if isinstance(fn, Mapping) else None
    if choice == "required" and functions:
        return next(iter(functions))
    return None


def _fake_arguments(fn: Mapping[str, Any] | None, rng: random.Random) -> dict[str, Any]:
    props = ((fn or {}).get("parameters") or {}).get("properties") or {}
    args: dict[str, Any] = {}
    for key, schema in props.items():
        kind = schema.get("type") if isinstance(schema, Mapping) else None
        if kind == "integer":
            args[key] = rng.randint(0, 9)
        elif kind == "number":
            args[key] = round(rng.uniform(0, 10), 2)
        elif kind == "boolean":
            args[key] = rng.random() < 0.5
        else:
            args[key] = rng.choice(_WORDS)
    return args


def _plan_tools(specs: Sequence[ToolCallSpec]) -> tuple[list[ToolPlan], str]:
    """Hermes blocks for the calls, one per line (as a chat template renders several calls back), with the char
    spans of each call's name and arguments in the whole text."""
    plans, blocks, at = [], [], 0
    for spec in specs:
        args = json.dumps(dict(spec.arguments))
        text = hermes_tool_text(spec.name, args)
        head = '<tool_call>\n{"name": ' + json.dumps(spec.name)
        args_start = at + len(head) + len(', "arguments": ')
        plans.append(
            ToolPlan(
                f"chatcmpl-tool-{secrets.token_hex(8)}",
                spec.name,
                args,
                at + len(head),
                args_start,
                args_start + len(args),
            )
        )
        blocks.append(text)
        at += len(text) + 1  # the "\n" between blocks
    return plans, "\n".join(blocks)


def generate_choice(
    tok: FakeTokenizer, params: GenParams, index: int, scenario: Scenario | None, request: dict[str, Any]
) -> ChoiceOutput:
    rng = _rng(params, index, "text")
    functions = _tool_functions(params.tools)
    parse_tools = bool(functions) and params.tool_choice != "none" and params.endpoint == "chat"
    specs = scenario.calls if scenario else ()
    reply = scenario.reply_text(request) if scenario else None
    if not specs and reply is None and parse_tools and (forced := _forced_tool_name(params, functions)):
        specs = (ToolCallSpec(forced, _fake_arguments(functions.get(forced), rng)),)
    plans: list[ToolPlan] = []
    if specs:
        plans, text = _plan_tools(specs)
        plans = plans if parse_tools else []
    else:
        text = reply if reply is not None else _sentence(rng)

    stop_reason: str | None = None
    cut = min(((text.find(s), s) for s in params.stop if s and s in text), default=None)
    if cut is not None:
        text, stop_reason = text[: cut[0]], cut[1]
    texts = tok.split(text)
    ids = [tok.piece_id(p) for p in texts]
    strs = list(texts)
    finish = "stop"
    if stop_reason is None:
        ids.append(EOS_ID)
        texts.append("")
        strs.append(EOS_TEXT)
    if len(ids) > params.max_tokens:
        del ids[params.max_tokens :], texts[params.max_tokens :], strs[params.max_tokens :]
        finish, stop_reason = "length", None
    complete = bool(plans) and finish == "stop" and stop_reason is None
    out = ChoiceOutput(
        index, ids, texts, strs, "".join(texts), "tool_calls" if complete else finish, stop_reason
    )
    out.tools, out.tool_complete = plans, complete
    if params.logprobs:
        _add_logprobs(out, params, index)
    return out


def _add_logprobs(out: ChoiceOutput, params: GenParams, index: int) -> None:
    # A separate stream of numbers, so asking for logprobs never changes what the model says.
    rng = _rng(params, index, "logprobs")
    for s in out.token_strs:
        out.logprobs.append(-round(rng.expovariate(1.5), 6))
        pool = [p for p in _ALT_PIECES if p != s]
        picks = rng.sample(pool, min(params.top_k, len(pool)))
        out.alternates.append([(p, -round(rng.uniform(0.05, 8.0), 6)) for p in picks])
