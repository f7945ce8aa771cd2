"""HTTP plumbing shared by the mock vLLM's handlers: JSON replies, vLLM error bodies, body reading and checks.

It owns how the mock reads requests and writes non-streamed replies; it must not hold mock state.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from agl_lite.testing.mock_vllm.generate import GenParams
from agl_lite.testing.mock_vllm.scenario import ErrorReply

__all__ = [
    "ApiError",
    "RecordedRequest",
    "chat_messages",
    "check_model",
    "choice_count",
    "error_response",
    "gen_params",
    "int_field",
    "json_response",
    "model_card",
    "read_json",
]

_JSON_HEADERS = {"Content-Type": "application/json"}


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    path: str
    headers: dict[str, str]
    body: Any
    """Parsed JSON, or the raw text when it was not JSON."""


class ApiError(Exception):
    """A request vLLM would refuse; answered with its error body."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.reply = ErrorReply(status=status, message=message, param=param)


def json_response(body: Any, status: int = 200) -> web.Response:
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":"))  # vLLM's compact, UTF-8 bodies
    return web.Response(status=status, text=text, headers=_JSON_HEADERS)


def error_response(reply: ErrorReply) -> web.Response:
    return json_response(reply.to_body(), reply.status)


def int_field(body: dict[str, Any], key: str, default: int | None) -> int | None:
    value = body.get(key, default)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise ApiError(400, f"{key} must be an integer, got {value!r}", key)
    return value


async def read_json(request: web.Request, record: Callable[[RecordedRequest], None]) -> dict[str, Any]:
    """The request's JSON object, recorded first (raw text when malformed) so tests see what was sent."""
    raw = await request.read()
    headers = dict(request.headers)
    try:
        body = json.loads(raw)
    except ValueError as exc:
        record(RecordedRequest(request.path, headers, raw.decode("utf-8", "replace")))
        raise ApiError(400, f"JSON decode error: {exc}") from None
    record(RecordedRequest(request.path, headers, body))
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    return body


def choice_count(body: dict[str, Any]) -> int:
    n = int_field(body, "n", None)
    n = 1 if n is None else n
    if n < 1:
        raise ApiError(400, f"n must be at least 1, got {n}.", "n")
    if n > MAX_N:  # (a mock answers at once, in memory: n = 10**22 took 17 GB before it was bounded)
        raise ApiError(400, f"n must be at most {MAX_N}, got {n}.", "n")
    return n


MAX_N = 256
"""The most choices the mock makes for one request."""


def chat_messages(body: dict[str, Any]) -> tuple[list[dict[str, Any]], bool]:
    """A chat request's messages and whether the template adds the generation prompt."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise ApiError(400, "messages must be a list of message objects", "messages")
    return messages, body.get("add_generation_prompt", True) is not False


def gen_params(
    body: dict[str, Any], prompt_ids: Sequence[int], endpoint: str, *, max_model_len: int, seed: int = 0
) -> GenParams:
    """The sampling parameters of one prompt, or the ApiError vLLM answers for them (`max_tokens` out of range,
    a prompt that fills the context)."""
    max_tokens = int_field(body, "max_completion_tokens", None) or int_field(body, "max_tokens", None)
    if max_tokens is not None and max_tokens > max_model_len:
        raise ApiError(
            400,
            f"max_tokens={max_tokens} cannot be greater than max_model_len={max_model_len}. Please "
            f"request fewer output tokens. (parameter=max_tokens, value={max_tokens})",
            "max_tokens",
        )
    if max_tokens is not None and max_tokens < 1:
        raise ApiError(400, f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens")
    room, n_in = max_model_len - len(prompt_ids), len(prompt_ids)
    if room < 1:
        raise ApiError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, your request has "
            f"{n_in} input tokens. Please reduce the length of the input messages. "
            f"(parameter=input_tokens, value={n_in})",
            "input_tokens",
        )
    if max_tokens is not None and max_tokens > room:
        raise ApiError(
            400,
            f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum context "
            f"length is {max_model_len} tokens and your request has {n_in} input tokens "
            f"({max_tokens} > {max_model_len} - {n_in}). (parameter=max_tokens, value={max_tokens})",
            "max_tokens",
        )
    stop = body.get("stop") or []
    stops = [stop] if isinstance(stop, str) else [str(s) for s in stop]
    if endpoint == "chat":
        want_lp, top_k = bool(body.get("logprobs")), int_field(body, "top_logprobs", 0) or 0
    else:
        k = int_field(body, "logprobs", None)
        want_lp, top_k = k is not None, k or 0
    tools = body.get("tools") or []
    return GenParams(
        prompt_ids=prompt_ids,
        max_tokens=max_tokens or room,
        stop=stops,
        mock_seed=seed,
        request_seed=int_field(body, "seed", None),
        greedy=body.get("temperature") == 0,
        logprobs=want_lp,
        top_k=top_k,
        tools=tools if isinstance(tools, list) else [],
        tool_choice=body.get("tool_choice"),
        endpoint=endpoint,
    )


def check_model(served: Sequence[str], body: dict[str, Any]) -> str:
    model = body.get("model") or served[0]
    if model not in served:
        aliases = ", ".join(served)
        raise ApiError(404, f"The model `{model}` does not exist. Valid aliases: {aliases}.", "model")
    return str(model)


def model_card(name: str, root: str, max_model_len: int, created: int) -> dict[str, Any]:
    """One entry of `GET /v1/models`, as vLLM 0.32 writes it."""
    permission = {
        "id": f"modelperm-{secrets.token_hex(16)}",
        "object": "model_permission",
        "created": created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
    return {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": root,
        "parent": None,
        "max_model_len": max_model_len,
        "permission": [permission],
    }
