"""A Responses API request (`POST /v1/responses`) as the chat completions request that asks an OpenAI-compatible
server (vLLM) the same thing, so Responses clients (Codex CLI, the Agents SDK) get their token ids captured like
any chat client. Bad input, and anything a chat template cannot express, raises `BadRequest` naming the field:
nothing is dropped silently, nothing is half-translated. Wire formats only; docs/responses.md has the mapping.

The earlier turns of a `previous_response_id` chain are the caller's to resolve: `to_chat` takes them as chat
messages (`history`) and puts them before this request's input.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agl_lite.errors import BadRequest

__all__ = ["CUSTOM_INPUT", "Translated", "to_chat"]

CUSTOM_INPUT = "input"
"""The one string parameter a custom (freeform) tool becomes as a chat function: chat templates know no grammar."""

_PASSED = {"model", "temperature", "top_p", "top_logprobs", "user", "parallel_tool_calls"}
_ECHOED = {"metadata", "store", "prompt_cache_key", "service_tier", "safety_identifier"}
"""Accepted and given back in the response, never sent upstream (vLLM's prefix cache needs no key)."""
_IGNORED = {"client_metadata"}
"""Accepted and not sent upstream: what a client says about itself (Codex: its session and version)."""
_KNOWN = (
    _PASSED
    | _ECHOED
    | _IGNORED
    | {
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "text",
        "max_output_tokens",
        "include",
        "stream",
        "stream_options",
        "reasoning",
        "truncation",
        "previous_response_id",
        "background",
    }
)
_INCLUDES = {"message.output_text.logprobs", "reasoning.encrypted_content"}
"""What `include` may ask for: logprobs (asked of vLLM), and encrypted reasoning (none is ever made: nothing to
leave out)."""
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


@dataclass(slots=True)
class Translated:
    """The chat body, and what turning the chat answer back into a Response needs of the request."""

    chat: dict[str, Any]
    custom_tools: frozenset[str] = frozenset()
    """Names of the custom (freeform) tools: a call to one is a `custom_tool_call` for the client."""
    logprobs: bool = False
    """The client asked for `message.output_text.logprobs`."""
    echo: dict[str, Any] = field(default_factory=dict)
    """The request's parameters as a Response repeats them (instructions, tools, tool_choice, text, ...)."""
    namespaced: dict[str, tuple[str, str]] = field(default_factory=dict)
    """The chat name (`ns.name`) of each tool of a namespace: its namespace and its own name."""


def to_chat(req: dict[str, Any], history: Sequence[dict[str, Any]] = ()) -> Translated:
    """The chat completions body for a Responses request, after the chat messages of the turns before it."""
    unknown = sorted(set(req) - _KNOWN)
    if unknown:
        raise BadRequest(f"{unknown[0]}: not supported by this gateway's Responses API", param=unknown[0])
    if req.get("background"):
        raise BadRequest("background: background responses are not supported", param="background")
    if req.get("truncation") not in (None, "disabled"):
        raise BadRequest("truncation: only 'disabled' is supported", param="truncation")
    model = req.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("model: required, a non-empty string", param="model")
    messages: list[dict[str, Any]] = []
    instructions = req.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise BadRequest("instructions: must be a string", param="instructions")
        messages.append({"role": "system", "content": instructions})
    messages.extend(history)
    messages.extend(_input(req.get("input")))
    out: dict[str, Any] = {k: req[k] for k in _PASSED if req.get(k) is not None}
    out["messages"] = messages
    tools, custom, namespaced = _tools(req.get("tools"))
    if tools:
        out["tools"] = tools
    if req.get("tool_choice") is not None:
        out["tool_choice"] = _tool_choice(req["tool_choice"])
    limit = req.get("max_output_tokens")
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise BadRequest("max_output_tokens: must be an integer >= 1", param="max_output_tokens")
        out["max_tokens"] = limit
    _text(req.get("text"), out)
    _reasoning(req.get("reasoning"), out)
    logprobs = _include(req.get("include"))
    if logprobs:
        out["logprobs"] = True
    stream = req.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("stream: must be a boolean", param="stream")
    if stream:
        out["stream"] = True
    echo = {
        k: req.get(k) for k in ("instructions", "tool_choice", "temperature", "top_p", "max_output_tokens")
    }
    echo.update(
        {k: req[k] for k in ("metadata", "store", "text", "reasoning", "previous_response_id") if k in req}
    )
    echo["tools"] = req.get("tools") or []
    echo["parallel_tool_calls"] = req.get("parallel_tool_calls", True)
    return Translated(out, custom, logprobs, echo, namespaced)


# --- input items -------------------------------------------------------------------------------------------------


def _input(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise BadRequest("input: required, a string or a non-empty list of items", param="input")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        at = f"input[{i}]"
        if not isinstance(item, dict):
            raise BadRequest(f"{at}: must be an object", param=at)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            out.append(_message(item, at))
        elif kind in ("function_call", "custom_tool_call"):
            _call(out, item, at, custom=kind == "custom_tool_call")
        elif kind in ("function_call_output", "custom_tool_call_output"):
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise BadRequest(f"{at}.call_id: required, a string", param=f"{at}.call_id")
            out.append(
                {"role": "tool", "tool_call_id": call_id, "content": _output_text(item.get("output"), at)}
            )
        elif kind == "reasoning":
            continue  # the model's own reasoning: vLLM's chat templates take none back (docs/responses.md)
        else:
            raise BadRequest(f"{at}.type: {kind!r} items are not supported", param=f"{at}.type")
    return out


_FIELD_OF = {
    "input_text": "text",
    "output_text": "text",
    "text": "text",
    "refusal": "refusal",
    "input_image": "image_url",
}
"""The member that holds each content part's value."""


def _message(item: dict[str, Any], at: str) -> dict[str, Any]:
    role = _ROLES.get(str(item.get("role")))
    if role is None:
        raise BadRequest(f"{at}.role: must be one of {sorted(_ROLES)}", param=f"{at}.role")
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise BadRequest(f"{at}.content: must be a string or a list of parts", param=f"{at}.content")
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        where = f"{at}.content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            parts.append({"type": "text", "text": part["refusal"]})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        elif kind in _FIELD_OF:  # a known part whose value is missing or not a string
            field = _FIELD_OF[kind]
            raise BadRequest(f"{where}.{field}: must be a string", param=f"{where}.{field}")
        else:
            raise BadRequest(
                f"{where}: {kind!r} parts are not supported (text and image URLs are)", param=where
            )
    if role != "user" and any(p["type"] != "text" for p in parts):
        raise BadRequest(f"{at}.content: only user messages may hold images", param=f"{at}.content")
    if all(p["type"] == "text" for p in parts):
        return {"role": role, "content": "".join(p["text"] for p in parts)}
    return {"role": role, "content": parts}


def _call(out: list[dict[str, Any]], item: dict[str, Any], at: str, *, custom: bool) -> None:
    """A call the model made, into the assistant message it belongs to: calls that follow one another (or the
    assistant's text) are one chat message with several tool calls, as the model produced them."""
    name, call_id = item.get("name"), item.get("call_id")
    if not isinstance(name, str) or not name or not isinstance(call_id, str) or not call_id:
        raise BadRequest(f"{at}: name and call_id are required strings", param=at)
    if custom:
        raw = item.get("input")
        if not isinstance(raw, str):
            raise BadRequest(f"{at}.input: must be a string", param=f"{at}.input")
        arguments = json.dumps({CUSTOM_INPUT: raw}, ensure_ascii=False)
    else:
        given = item.get("arguments")
        if not isinstance(given, str):
            raise BadRequest(f"{at}.arguments: must be a string (the call's JSON)", param=f"{at}.arguments")
        arguments = given
    space = item.get("namespace")
    if space is not None:
        if not isinstance(space, str) or not space:
            raise BadRequest(f"{at}.namespace: must be a string", param=f"{at}.namespace")
        name = f"{space}.{name}"
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    last = out[-1] if out else None
    if last is not None and last["role"] == "assistant" and isinstance(last.get("content"), str | None):
        last.setdefault("tool_calls", []).append(call)
    else:
        out.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _output_text(output: Any, at: str) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list) and all(
        isinstance(p, dict) and isinstance(p.get("text"), str) for p in output
    ):
        return "".join(p["text"] for p in output)
    raise BadRequest(f"{at}.output: must be a string or a list of text parts", param=f"{at}.output")


# --- tools and options -------------------------------------------------------------------------------------------


def _tools(value: Any) -> tuple[list[dict[str, Any]], frozenset[str], dict[str, tuple[str, str]]]:
    """The chat tools, the chat names of the custom ones, and the chat name of each tool of a namespace (`ns.name`,
    flattened: a chat template knows no namespaces) with its namespace and own name."""
    if value is None:
        return [], frozenset(), {}
    if not isinstance(value, list):
        raise BadRequest("tools: must be a list", param="tools")
    out: list[dict[str, Any]] = []
    custom: set[str] = set()
    namespaced: dict[str, tuple[str, str]] = {}
    for i, tool in enumerate(value):
        at = f"tools[{i}]"
        if isinstance(tool, dict) and tool.get("type") == "namespace":
            space, inner = tool.get("name"), tool.get("tools")
            if not isinstance(space, str) or not space or not isinstance(inner, list):
                raise BadRequest(f"{at}: a namespace needs a name and a list of tools", param=at)
            for j, member in enumerate(inner):
                function = _tool(member, f"{at}.tools[{j}]", custom, prefix=f"{space}.")
                namespaced[function["function"]["name"]] = (space, member["name"])
                out.append(function)
            continue
        out.append(_tool(tool, at, custom))
    return out, frozenset(custom), namespaced


def _tool(tool: Any, at: str, custom: set[str], prefix: str = "") -> dict[str, Any]:
    kind = tool.get("type") if isinstance(tool, dict) else None
    name = tool.get("name") if isinstance(tool, dict) else None
    if kind not in ("function", "custom"):
        raise BadRequest(
            f"{at}.type: {kind!r} tools cannot be expressed to a chat template (function, custom and namespace "
            "tools can)",
            param=f"{at}.type",
        )
    if not isinstance(name, str) or not name:
        raise BadRequest(f"{at}.name: required, a string", param=f"{at}.name")
    function: dict[str, Any] = {"name": prefix + name}
    description = tool.get("description")
    if kind == "function":
        parameters = tool.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise BadRequest(f"{at}.parameters: must be a JSON schema object", param=f"{at}.parameters")
        function["parameters"] = parameters or {"type": "object", "properties": {}}
        if tool.get("strict") is not None:
            function["strict"] = tool["strict"]
    else:
        custom.add(prefix + name)
        function["parameters"] = {
            "type": "object",
            "properties": {CUSTOM_INPUT: {"type": "string", "description": "The tool's whole input."}},
            "required": [CUSTOM_INPUT],
        }
    if isinstance(description, str):
        function["description"] = description
    return {"type": "function", "function": function}


def _tool_choice(choice: Any) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") in ("function", "custom"):
        name = choice.get("name")
        if isinstance(name, str) and name:
            return {"type": "function", "function": {"name": name}}
    raise BadRequest(
        "tool_choice: must be 'auto', 'none', 'required' or {'type': 'function', 'name': ...}",
        param="tool_choice",
    )


def _text(text: Any, out: dict[str, Any]) -> None:
    if text is None:
        return
    fmt = text.get("format") if isinstance(text, dict) else None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if fmt is None or kind == "text":
        return
    if kind == "json_object":
        out["response_format"] = {"type": "json_object"}
        return
    if kind == "json_schema" and isinstance(fmt.get("schema"), dict):
        schema = {"name": fmt.get("name") or "response", "schema": fmt["schema"]}
        if fmt.get("strict") is not None:
            schema["strict"] = fmt["strict"]
        out["response_format"] = {"type": "json_schema", "json_schema": schema}
        return
    raise BadRequest(
        "text.format: must be {'type': 'text' | 'json_object'} or a json_schema with its schema",
        param="text.format",
    )


def _reasoning(reasoning: Any, out: dict[str, Any]) -> None:
    if reasoning is None:
        return
    if not isinstance(reasoning, dict):
        raise BadRequest("reasoning: must be an object", param="reasoning")
    effort = reasoning.get("effort")
    if effort is not None:
        if effort not in ("minimal", "low", "medium", "high"):
            raise BadRequest(
                "reasoning.effort: must be minimal, low, medium or high", param="reasoning.effort"
            )
        out["reasoning_effort"] = "low" if effort == "minimal" else effort  # (vLLM knows low, medium, high)


def _include(include: Any) -> bool:
    if include is None:
        return False
    if not isinstance(include, list) or not all(isinstance(x, str) for x in include):
        raise BadRequest("include: must be a list of strings", param="include")
    unknown = sorted(set(include) - _INCLUDES)
    if unknown:
        raise BadRequest(f"include: {unknown[0]!r} is not supported", param="include")
    return "message.output_text.logprobs" in include
