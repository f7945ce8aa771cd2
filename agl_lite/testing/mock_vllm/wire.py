"""vLLM 0.32 wire shapes for the mock server: chat and completions bodies and SSE frames, field for field.

It owns key names, order, nesting and null-vs-absent (see tests/fixtures/vllm-0.32-cpu); it must not decide
what the model says.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agl_lite.testing.mock_vllm.generate import ChoiceOutput

__all__ = [
    "DONE_FRAME",
    "Envelope",
    "chat_body",
    "chat_frames",
    "completion_body",
    "completion_frames",
    "frame",
]

DONE_FRAME = b"data: [DONE]\n\n"


@dataclass(frozen=True, slots=True)
class Envelope:
    id: str
    created: int
    model: str
    fingerprint: str
    prompt_ids: Sequence[int]
    return_ids: bool
    logprobs: bool
    top_k: int


def frame(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def _usage(prompt: int, completion: int, details: bool) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    }
    if details:
        usage |= {"prompt_tokens_details": None, "completion_tokens_details": None}
    return usage


def _chat_lp(token: str, lp: float) -> dict[str, Any]:
    return {"token": token, "logprob": lp, "bytes": list(token.encode("utf-8"))}


def _chat_lp_entries(out: ChoiceOutput, env: Envelope, lo: int, hi: int) -> list[dict[str, Any]]:
    entries = []
    for i in range(lo, hi):
        top = [_chat_lp(out.token_strs[i], out.logprobs[i])] if env.top_k else []
        top += [_chat_lp(t, lp) for t, lp in out.alternates[i][: max(env.top_k - 1, 0)]]
        entries.append(_chat_lp(out.token_strs[i], out.logprobs[i]) | {"top_logprobs": top})
    return entries


def _tool_calls(out: ChoiceOutput) -> list[dict[str, Any]]:
    return [
        {"id": t.call_id, "type": "function", "function": {"name": t.name, "arguments": t.arguments}}
        for t in out.tools
    ]


def chat_body(env: Envelope, outs: Sequence[ChoiceOutput]) -> dict[str, Any]:
    choices = []
    for out in outs:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": None if out.tool_complete else out.text,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
        }
        if out.tool_complete:
            message["tool_calls"] = _tool_calls(out)
        message["reasoning"] = None
        lp = {"content": _chat_lp_entries(out, env, 0, len(out.token_ids))} if env.logprobs else None
        choices.append(
            {
                "index": out.index,
                "message": message,
                "logprobs": lp,
                "finish_reason": out.finish_reason,
                "stop_reason": out.stop_reason,
                "token_ids": out.token_ids if env.return_ids else None,
                "routed_experts": None,
            }
        )
    return {
        "id": env.id,
        "object": "chat.completion",
        "created": env.created,
        "model": env.model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": env.fingerprint,
        "usage": _usage(len(env.prompt_ids), sum(len(o.token_ids) for o in outs), True),
        "prompt_logprobs": None,
        "prompt_token_ids": list(env.prompt_ids) if env.return_ids else None,
        "prompt_text": None,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }


def _chat_deltas(out: ChoiceOutput) -> list[dict[str, Any]]:
    """The delta each token produces; tool calls stream like vLLM's hermes parser (text held back as {}): each call
    by its index, named once its name is whole, then its arguments as they come."""
    deltas: list[dict[str, Any]] = []
    pos, named = 0, [False] * len(out.tools)
    for text in out.texts:
        start, pos = pos, pos + len(text)
        if not text:
            deltas.append({})
        elif not out.tools:
            deltas.append({"content": text})
        else:
            calls = []
            for i, plan in enumerate(out.tools):
                piece = out.text[max(start, plan.args_start) : min(pos, plan.args_end)]
                fn: dict[str, Any] = {}
                call: dict[str, Any] = {}
                if not named[i] and pos >= plan.name_end:
                    named[i], fn["name"] = True, plan.name
                    call = {"id": plan.call_id, "type": "function"}
                if piece and named[i]:
                    fn["arguments"] = piece
                if fn:
                    calls.append(call | {"index": i, "function": fn})
            deltas.append({"content": None, "tool_calls": calls} if calls else {})
    return deltas


def _chat_choice_chunks(out: ChoiceOutput, env: Envelope) -> list[dict[str, Any]]:
    chunks: list[dict[str, Any]] = []
    deltas = _chat_deltas(out) or [{}]
    last = len(deltas) - 1
    for i, delta in enumerate(deltas):
        finish = out.finish_reason if i == last else None
        has_token = i < len(out.token_ids)
        # vLLM drops a chunk the parser left empty unless the client wants every token's id, or its logprob
        # (real vLLM sends `"delta":{}` with the logprobs of the tokens its tool parser holds back).
        if not delta and finish is None and not env.return_ids and not (env.logprobs and has_token):
            continue
        choice: dict[str, Any] = {
            "index": out.index,
            "delta": delta,
            "logprobs": {"content": _chat_lp_entries(out, env, i, i + 1)}
            if env.logprobs and has_token
            else None,
            "finish_reason": finish,
        }
        if finish is not None:
            choice["stop_reason"] = out.stop_reason
        choice["token_ids"] = (out.token_ids[i : i + 1] if has_token else []) if env.return_ids else None
        chunks.append(choice)
    return chunks


def _interleave(per_choice: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    merged: list[dict[str, Any]] = []
    for step in range(max((len(c) for c in per_choice), default=0)):
        merged += [c[step] for c in per_choice if step < len(c)]
    return merged


def _finish_frames(env: Envelope, chunks: list[dict[str, Any]], usage: dict[str, Any] | None) -> list[bytes]:
    if usage is not None:
        head = {k: chunks[0][k] for k in ("id", "object", "created", "model")}
        chunks.append(head | {"choices": [], "usage": usage})
    if chunks:
        chunks[-1]["system_fingerprint"] = env.fingerprint  # only the stream's last chunk carries it
    return [*(frame(c) for c in chunks), DONE_FRAME]


def chat_frames(env: Envelope, outs: Sequence[ChoiceOutput], include_usage: bool) -> list[bytes]:
    head = {"id": env.id, "object": "chat.completion.chunk", "created": env.created, "model": env.model}
    prompt = list(env.prompt_ids) if env.return_ids else None
    chunks = [
        head
        | {
            "choices": [
                {
                    "index": o.index,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
            "prompt_token_ids": prompt,
            "prompt_text": None,
        }
        for o in outs
    ]
    chunks += [head | {"choices": [c]} for c in _interleave([_chat_choice_chunks(o, env) for o in outs])]
    usage = _usage(len(env.prompt_ids), sum(len(o.token_ids) for o in outs), False) if include_usage else None
    return _finish_frames(env, chunks, usage)


def _completion_lp(out: ChoiceOutput, lo: int, hi: int) -> dict[str, Any]:
    offsets, off = [], sum(len(t) for t in out.texts[:lo])
    for t in out.texts[lo:hi]:
        offsets.append(off)
        off += len(t)
    tops = [{out.token_strs[i]: out.logprobs[i], **dict(out.alternates[i])} for i in range(lo, hi)]
    return {
        "text_offset": offsets,
        "token_logprobs": out.logprobs[lo:hi],
        "tokens": out.token_strs[lo:hi],
        "top_logprobs": tops,
    }


def completion_body(
    env: Envelope, outs: Sequence[ChoiceOutput], prompts: Sequence[Sequence[int]]
) -> dict[str, Any]:
    choices = [
        {
            "index": out.index,
            "text": out.text,
            "logprobs": _completion_lp(out, 0, len(out.token_ids)) if env.logprobs else None,
            "finish_reason": out.finish_reason,
            "stop_reason": out.stop_reason,
            "token_ids": out.token_ids if env.return_ids else None,
            "prompt_logprobs": None,
            "prompt_token_ids": list(prompt) if env.return_ids else None,
            "routed_experts": None,
        }
        for out, prompt in zip(outs, prompts, strict=True)
    ]
    return {
        "id": env.id,
        "object": "text_completion",
        "created": env.created,
        "model": env.model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": env.fingerprint,
        "usage": _usage(sum(len(p) for p in prompts), sum(len(o.token_ids) for o in outs), True),
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }


def completion_frames(
    env: Envelope, outs: Sequence[ChoiceOutput], prompts: Sequence[Sequence[int]], include_usage: bool
) -> list[bytes]:
    head = {"id": env.id, "object": "text_completion", "created": env.created, "model": env.model}
    per_choice: list[list[dict[str, Any]]] = []
    for out, prompt in zip(outs, prompts, strict=True):
        last = max(len(out.token_ids) - 1, 0)
        per_choice.append(
            [
                {
                    "index": out.index,
                    "text": out.texts[i] if out.texts else "",
                    "logprobs": _completion_lp(out, i, i + 1) if env.logprobs and out.texts else None,
                    "finish_reason": out.finish_reason if i == last else None,
                    "stop_reason": out.stop_reason if i == last else None,
                    "prompt_token_ids": list(prompt) if env.return_ids and i == 0 else None,
                    "token_ids": out.token_ids[i : i + 1] if env.return_ids else None,
                }
                for i in range(last + 1)
            ]
        )
    chunks = [head | {"choices": [c]} for c in _interleave(per_choice)]
    prompt_total = sum(len(p) for p in prompts)
    usage = _usage(prompt_total, sum(len(o.token_ids) for o in outs), False) if include_usage else None
    return _finish_frames(env, chunks, usage)
