"""Scripted behaviours ("scenarios") for the mock vLLM server and the queue that picks one per request.

It owns what a test can ask the mock to do and how requests are matched to it; it must not build wire bodies.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ErrorReply",
    "RequestPredicate",
    "Scenario",
    "ScenarioHook",
    "ScenarioQueue",
    "ToolCallSpec",
    "last_user_text",
]

RequestPredicate = Callable[[dict[str, Any]], bool]

_ERROR_TYPES = {
    400: "BadRequestError",
    401: "UnauthorizedError",
    404: "NotFoundError",
    429: "TooManyRequestsError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


@dataclass(frozen=True, slots=True)
class ToolCallSpec:
    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """An HTTP error in vLLM's body shape; `body` replaces the whole body when given."""

    status: int = 500
    message: str = "mock upstream failure"
    type: str | None = None
    param: str | None = None
    body: Mapping[str, Any] | None = None

    def to_body(self) -> dict[str, Any]:
        if self.body is not None:
            return dict(self.body)
        err_type = self.type or _ERROR_TYPES.get(self.status, "InternalServerError")
        return {
            "error": {"message": self.message, "type": err_type, "param": self.param, "code": self.status}
        }


@dataclass(frozen=True, slots=True)
class Scenario:
    """What to answer and how to misbehave. At most one of content / tool_call (or tool_calls) / error / text_fn.

    Fault counts are SSE data events sent before the fault (role chunks count; 0 means before the first). For a
    non-streamed request, reset and stall happen before the response and an error frame becomes a 500 body.
    """

    content: str | None = None
    tool_call: ToolCallSpec | None = None
    tool_calls: tuple[ToolCallSpec, ...] = ()
    """Several calls in one reply (parallel tool calls), in order; `tool_call` is the one-call spelling."""
    error: ErrorReply | None = None
    text_fn: Callable[[dict[str, Any]], str] | None = None
    latency_s: float = 0.0
    ttft_s: float = 0.0
    chunk_delay_s: float = 0.0
    error_frame_after: int | None = None
    error_frame_message: str = "mock mid-stream failure"
    reset_after: int | None = None
    stall_after: int | None = None

    @property
    def calls(self) -> tuple[ToolCallSpec, ...]:
        """The tool calls to make, however they were given."""
        return self.tool_calls or ((self.tool_call,) if self.tool_call is not None else ())

    def reply_text(self, request: dict[str, Any]) -> str | None:
        if self.text_fn is not None:
            return self.text_fn(request)
        return self.content

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Scenario:
        """Build from the HTTP API's JSON; unknown keys are rejected so typos fail loudly."""
        names = {f.name for f in dataclasses.fields(cls)} - {"text_fn", "tool_call", "tool_calls", "error"}
        extra = set(data) - names - {"tool_call", "tool_calls", "error"}
        if extra:
            raise ValueError(f"unknown scenario keys: {sorted(extra)}")
        kwargs: dict[str, Any] = {k: v for k, v in data.items() if k in names}
        if (tc := data.get("tool_call")) is not None:
            kwargs["tool_call"] = ToolCallSpec(str(tc["name"]), dict(tc.get("arguments") or {}))
        if (tcs := data.get("tool_calls")) is not None:
            kwargs["tool_calls"] = tuple(
                ToolCallSpec(str(t["name"]), dict(t.get("arguments") or {})) for t in tcs
            )
        if (err := data.get("error")) is not None:
            kwargs["error"] = ErrorReply(**err)
        return cls(**kwargs)


ScenarioHook = Callable[[dict[str, Any]], Scenario | None]


def last_user_text(request: Mapping[str, Any]) -> str:
    """The last user message's text (chat) or the prompt (completions), for substring matching."""
    prompt = request.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        return str(prompt[-1])
    for m in reversed(request.get("messages") or []):
        if isinstance(m, dict) and m.get("role") == "user":
            c = m.get("content")
            if isinstance(c, list):
                return "".join(str(p.get("text", "")) for p in c if isinstance(p, dict))
            return "" if c is None else str(c)
    return ""


@dataclass(slots=True)
class _Entry:
    scenario: Scenario
    match: str | None
    when: RequestPredicate | None
    times: int | None

    def matches(self, request: dict[str, Any]) -> bool:
        if self.match is not None and self.match not in last_user_text(request):
            return False
        return self.when is None or self.when(request)


class ScenarioQueue:
    """FIFO of scenarios; the first entry that matches a request serves it and uses up one of its `times`."""

    def __init__(self) -> None:
        self._entries: list[_Entry] = []

    def __len__(self) -> int:
        return len(self._entries)

    def add(
        self,
        scenario: Scenario,
        *,
        match: str | None = None,
        when: RequestPredicate | None = None,
        times: int | None = 1,
    ) -> None:
        if times is not None and times < 1:
            raise ValueError("times must be >= 1 or None (forever)")
        self._entries.append(_Entry(scenario, match, when, times))

    def clear(self) -> None:
        self._entries.clear()

    def take(self, request: dict[str, Any]) -> Scenario | None:
        for i, entry in enumerate(self._entries):
            if entry.matches(request):
                if entry.times is not None:
                    entry.times -= 1
                    if entry.times == 0:
                        del self._entries[i]
                return entry.scenario
        return None
