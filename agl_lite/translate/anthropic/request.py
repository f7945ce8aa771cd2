"""An Anthropic Messages request as the chat completions request (or, for `count_tokens`, the `/tokenize`
request) that asks an OpenAI-compatible server the same thing. Bad input raises `BadRequest` naming the field;
nothing is half-translated. Fields with no chat equivalent are ignored, and docs/anthropic.md lists them.
"""

from __future__ import annotations

import json
import re
from typing import Any

from agl_lite.errors import BadRequest

__all__ = ["BILLING_HEADER", "to_chat", "to_tokenize"]

BILLING_HEADER = "x-anthropic-billing-header:"
"""Claude Code's first system block: it changes on every call, so left in it would break prefix sharing."""
_BILLING_LINE = re.compile(r"\Ax-anthropic-billing-header:[^\n]*\n?")
_TOOL_CHOICE = {"auto": "auto", "any": "required", "none": "none"}


def to_chat(req: dict[str, Any], *, strip_billing_header: bool = True) -> dict[str, Any]:
    """The chat completions body for an Anthropic `POST /v1/messages` body."""
    out = _common(req, strip_billing_header)
    max_tokens = req.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise BadRequest("max_tokens: required, an integer >= 1", param="max_tokens")
    out["max_tokens"] = max_tokens
    stream = req.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("stream: must be a boolean", param="stream")
    if stream:
        # The usage event carries the output token count that message_delta must report.
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    stops = req.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise BadRequest("stop_sequences: must be a list of strings", param="stop_sequences")
        if stops:
            out["stop"] = stops
    for key in ("temperature", "top_p"):
        value = req.get(key)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise BadRequest(f"{key}: must be a number", param=key)
            out[key] = value
    top_k = req.get("top_k")
    if top_k is not None:
        if not _is_int(top_k):
            raise BadRequest("top_k: must be an integer", param="top_k")
        out["top_k"] = top_k
    return out


def to_tokenize(req: dict[str, Any], *, strip_billing_header: bool = True) -> dict[str, Any]:
    """The `/tokenize` body counting the prompt tokens of an Anthropic `count_tokens` body."""
    out = _common(req, strip_billing_header)
    out.pop("tool_choice", None)
    out.pop("parallel_tool_calls", None)
    out.setdefault("add_generation_prompt", True)
    return out


def _common(req: dict[str, Any], strip: bool) -> dict[str, Any]:
    model = req.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("model: required, a non-empty string", param="model")
    messages = req.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: required, a non-empty list", param="messages")
    chat = _system(req.get("system"), strip)
    for i, msg in enumerate(messages):
        chat += _message(msg, f"messages.{i}")
    out: dict[str, Any] = {"model": model, "messages": chat}
    last = messages[-1]
    if isinstance(last, dict) and last.get("role") == "assistant":
        # A prefilled answer: Anthropic continues it; vLLM does when told so (a vLLM extension of chat).
        out["add_generation_prompt"] = False
        out["continue_final_message"] = True
    tools = req.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise BadRequest("tools: must be a list", param="tools")
        chat_tools = [_tool(t, f"tools.{i}") for i, t in enumerate(tools) if not _server_tool(t)]
        if chat_tools:
            out["tools"] = chat_tools
    choice = req.get("tool_choice")
    if choice is not None:
        _tool_choice(choice, out)
    return out


# --- messages -------------------------------------------------------------------------------------------------


def _system(system: Any, strip: bool) -> list[dict[str, Any]]:
    if system is None:
        return []
    if isinstance(system, str):
        text = _BILLING_LINE.sub("", system) if strip else system
        return [{"role": "system", "content": text}] if text else []
    if not isinstance(system, list):
        raise BadRequest("system: must be a string or a list of text blocks", param="system")
    parts = []
    for i, block in enumerate(system):
        part = _text(block, f"system.{i}")
        if not (strip and part["text"].startswith(BILLING_HEADER)):
            parts.append(part)
    return [{"role": "system", "content": _content(parts)}] if parts else []


def _message(msg: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(msg, dict):
        raise BadRequest(f"{where}: must be an object with role and content")
    role, content = msg.get("role"), msg.get("content")
    if role not in ("user", "assistant", "system"):
        raise BadRequest(f"{where}.role: must be 'user' or 'assistant' (or 'system'), got {role!r}")
    if not isinstance(content, str | list):
        raise BadRequest(f"{where}.content: must be a string or a list of content blocks")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if role == "assistant":
        return [_assistant(content, where)]
    if role == "system":  # mid-conversation system turns (a beta Claude Code uses): kept in place
        if not content:
            raise BadRequest(f"{where}.content: must not be empty")
        return [
            {
                "role": "system",
                "content": _content([_text(b, f"{where}.content.{i}") for i, b in enumerate(content)]),
            }
        ]
    return _user(content, where)


def _user(blocks: list[Any], where: str) -> list[dict[str, Any]]:
    # Chat wants each tool result as a `tool` message right after the assistant's call, and the rest of the
    # user's turn after those (Anthropic, likewise, wants tool_result blocks first in their message).
    tools: list[dict[str, Any]] = []
    images: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for i, block in enumerate(blocks):
        at = f"{where}.content.{i}"
        kind = _kind(block, at)
        if kind == "text":
            parts.append(_text(block, at))
        elif kind == "image":
            parts.append(_image(block, at))
        elif kind == "document":
            parts.append(_document(block, at))
        elif kind == "tool_result":
            message, tool_images = _tool_result(block, at)
            tools.append(message)
            images += tool_images
        else:
            raise BadRequest(f"{at}: content block type {kind!r} is not supported in a user message here")
    rest = images + parts
    if not tools and not rest:
        raise BadRequest(f"{where}.content: must not be empty")
    return tools + ([{"role": "user", "content": _content(rest)}] if rest else [])


def _assistant(blocks: list[Any], where: str) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for i, block in enumerate(blocks):
        at = f"{where}.content.{i}"
        kind = _kind(block, at)
        if kind == "text":
            parts.append(_text(block, at))
        elif kind == "thinking":
            thinking = block.get("thinking")
            if not isinstance(thinking, str):
                raise BadRequest(f"{at}.thinking: must be a string")
            reasoning.append(thinking)
        elif kind == "redacted_thinking":
            continue  # opaque to anyone but Anthropic: nothing to give the model
        elif kind == "tool_use":
            calls.append(_tool_use(block, at))
        else:
            raise BadRequest(
                f"{at}: content block type {kind!r} is not supported in an assistant message here"
            )
    # As vLLM answers a tool call: no text is `null` content, which the next prompt must render alike.
    out: dict[str, Any] = {
        "role": "assistant",
        "content": _content(parts) if parts else None if calls else "",
    }
    if calls:
        out["tool_calls"] = calls
    if reasoning:
        out["reasoning"] = "".join(reasoning)
    return out


def _tool_use(block: dict[str, Any], at: str) -> dict[str, Any]:
    call_id, name, args = block.get("id"), block.get("name"), block.get("input", {})
    if not isinstance(call_id, str) or not call_id:
        raise BadRequest(f"{at}.id: required, a string")
    if not isinstance(name, str) or not name:
        raise BadRequest(f"{at}.name: required, a string")
    if not isinstance(args, dict):
        raise BadRequest(f"{at}.input: must be an object")
    # json.dumps' spacing and raw UTF-8 are how vLLM's tool parsers print arguments, so an echoed call
    # re-renders as the model wrote it.
    arguments = json.dumps(args, ensure_ascii=False)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _tool_result(block: dict[str, Any], at: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    call_id, content = block.get("tool_use_id"), block.get("content")
    if not isinstance(call_id, str) or not call_id:
        raise BadRequest(f"{at}.tool_use_id: required, a string")
    texts: list[dict[str, Any]] = []
    images: list[dict[str, Any]] = []
    if isinstance(content, str):
        texts.append({"type": "text", "text": content})
    elif isinstance(content, list):
        for j, item in enumerate(content):
            kind = _kind(item, f"{at}.content.{j}")
            if kind == "text":
                texts.append(_text(item, f"{at}.content.{j}"))
            elif kind == "image":
                images.append(_image(item, f"{at}.content.{j}"))  # chat tool messages hold text only
            elif kind == "document":
                texts.append(_document(item, f"{at}.content.{j}"))
            else:
                raise BadRequest(
                    f"{at}.content.{j}: content block type {kind!r} is not supported in a tool_result"
                )
    elif content is not None:
        raise BadRequest(f"{at}.content: must be a string or a list of content blocks")
    return {"role": "tool", "tool_call_id": call_id, "content": _content(texts) if texts else ""}, images


# --- blocks ---------------------------------------------------------------------------------------------------


def _kind(block: Any, at: str) -> str:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise BadRequest(f"{at}: must be a content block object with a type")
    kind: str = block["type"]
    return kind


def _text(block: Any, at: str) -> dict[str, Any]:
    if _kind(block, at) != "text" or not isinstance(block.get("text"), str):
        raise BadRequest(f"{at}: must be a text block with a string 'text'")
    return {"type": "text", "text": block["text"]}


def _image(block: dict[str, Any], at: str) -> dict[str, Any]:
    src = block.get("source")
    kind = src.get("type") if isinstance(src, dict) else None
    if kind == "base64" and isinstance(src, dict):
        media, data = src.get("media_type"), src.get("data")
        if not isinstance(media, str) or not isinstance(data, str):
            raise BadRequest(f"{at}.source: a base64 source needs string media_type and data")
        url = f"data:{media};base64,{data}"
    elif kind == "url" and isinstance(src, dict) and isinstance(src.get("url"), str):
        url = src["url"]
    else:
        raise BadRequest(f"{at}.source: only base64 and url image sources are supported here")
    return {"type": "image_url", "image_url": {"url": url}}


def _document(block: dict[str, Any], at: str) -> dict[str, Any]:
    src = block.get("source")
    if isinstance(src, dict) and src.get("type") == "text" and isinstance(src.get("data"), str):
        return {"type": "text", "text": src["data"]}
    raise BadRequest(f"{at}.source: only plain-text documents are supported here (send a PDF's text instead)")


def _content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """A lone text part as a plain string (what most chat templates expect), anything else as parts."""
    if len(parts) == 1 and parts[0]["type"] == "text":
        text: str = parts[0]["text"]
        return text
    return parts


# --- tools ----------------------------------------------------------------------------------------------------


def _server_tool(tool: Any) -> bool:
    """A tool Anthropic runs itself (web search, code execution, ...): no upstream here can, so it is left out."""
    return isinstance(tool, dict) and tool.get("type") not in (None, "custom")


def _tool(tool: Any, at: str) -> dict[str, Any]:
    if not isinstance(tool, dict):
        raise BadRequest(f"{at}: must be a tool object", param="tools")
    name, schema = tool.get("name"), tool.get("input_schema")
    if not isinstance(name, str) or not name:
        raise BadRequest(f"{at}.name: required, a string", param="tools")
    if not isinstance(schema, dict):
        raise BadRequest(f"{at}.input_schema: must be a JSON schema object", param="tools")
    fn: dict[str, Any] = {"name": name}
    if isinstance(tool.get("description"), str):
        fn["description"] = tool["description"]
    fn["parameters"] = schema
    return {"type": "function", "function": fn}


def _tool_choice(choice: Any, out: dict[str, Any]) -> None:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if not isinstance(kind, str):  # a list or an object cannot be looked up (it was a TypeError: a 500)
        kind = None
    if kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str) or not name:
            raise BadRequest("tool_choice.name: required for type 'tool'", param="tool_choice")
        out["tool_choice"] = {"type": "function", "function": {"name": name}}
    elif kind in _TOOL_CHOICE:
        out["tool_choice"] = _TOOL_CHOICE[kind]
    else:
        raise BadRequest("tool_choice.type: must be one of auto, any, tool, none", param="tool_choice")
    if choice.get("disable_parallel_tool_use") is True:
        out["parallel_tool_calls"] = False


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
