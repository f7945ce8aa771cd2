"""The store's records and state machines (DESIGN.md §4): plain data, no I/O.

Rollouts go `queuing → running → succeeded | failed | cancelled`; attempts go `running → succeeded | failed |
timeout | lost | cancelled`. Anything else is an illegal transition (409). Token ids travel as packed
`array("I")`, never as Python int lists.
"""

from __future__ import annotations

import re
from array import array
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

__all__ = [
    "ATTEMPT_NEXT",
    "LABEL_KEY",
    "MAX_LABELS",
    "MAX_LABEL_VALUE",
    "RESPONSE_ID_PREFIX",
    "ROLLOUT_NEXT",
    "Attempt",
    "AttemptStatus",
    "CallOutcome",
    "ChoiceRecord",
    "Event",
    "LLMCall",
    "ModelRecord",
    "Resource",
    "Rollout",
    "RolloutConfig",
    "RolloutStatus",
    "label_problem",
    "shallow_json",
]


class RolloutStatus(StrEnum):
    QUEUING = "queuing"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in _ROLLOUT_TERMINAL


_ROLLOUT_TERMINAL = frozenset({RolloutStatus.SUCCEEDED, RolloutStatus.FAILED, RolloutStatus.CANCELLED})

ROLLOUT_NEXT: dict[RolloutStatus, frozenset[RolloutStatus]] = {
    RolloutStatus.QUEUING: frozenset({RolloutStatus.RUNNING, RolloutStatus.CANCELLED}),
    RolloutStatus.RUNNING: _ROLLOUT_TERMINAL,
    RolloutStatus.SUCCEEDED: frozenset(),
    RolloutStatus.FAILED: frozenset(),
    RolloutStatus.CANCELLED: frozenset(),
}
"""The legal next states of a rollout."""


class AttemptStatus(StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMEOUT = "timeout"
    LOST = "lost"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self is not AttemptStatus.RUNNING


ATTEMPT_NEXT: dict[AttemptStatus, frozenset[AttemptStatus]] = {
    AttemptStatus.RUNNING: frozenset(s for s in AttemptStatus if s is not AttemptStatus.RUNNING),
    **{s: frozenset() for s in AttemptStatus if s is not AttemptStatus.RUNNING},
}
"""The legal next states of an attempt."""


class CallOutcome(StrEnum):
    OK = "ok"
    """The whole response reached the client."""
    UPSTREAM_ERROR = "upstream_error"
    """The upstream failed (unreachable, an error status, or an error mid-stream)."""
    CLIENT_DISCONNECTED = "client_disconnected"
    """The client went away before the end; the upstream was closed at once."""
    TRUNCATED = "truncated"
    """The stream ended without `[DONE]`."""
    REJECTED = "rejected"
    """The gateway answered itself (unknown model, budget, pause) and never called upstream."""
    ABORTED = "aborted"
    """The gateway cut the call before its end (it shut down, or the call's rollout ended); the upstream was
    closed."""


def shallow_json(obj: Any, cls: Any = None, **values: Any) -> dict[str, Any]:
    """A dataclass's fields as JSON-able data, in declaration order (`cls`: only its fields, not a subclass's), with
    `values` in place of some. Shallow: `dataclasses.asdict` deep-copies every nested value, which showed in the
    profiles."""
    names = (cls or type(obj)).__dataclass_fields__  # (`dataclasses.fields` costs twice as much)
    out = {name: getattr(obj, name) for name in names}
    if values:
        out.update(values)
    return out


@dataclass(slots=True)
class RolloutConfig:
    max_attempts: int = 1
    """Attempts the runner may start (local) or pods the Job may run (Kubernetes: backoffLimit + 1)."""
    timeout_s: float | None = None
    """Per-attempt wall-clock limit, in seconds."""
    trust_agent_rewards: bool = False
    """Whether rewards the agent posts count (otherwise only the admin or grader key may reward)."""
    token_budget: int | None = None
    """Total tokens (prompt + completion) the rollout's LLM calls may use; past it, calls get 429."""
    runner: dict[str, Any] = field(default_factory=dict)
    """Overrides for the runner (command, env, Job template fields)."""
    grader: dict[str, Any] | None = None
    """The grading step, if any (command or container); it runs with the grader key after the agent."""


@dataclass(slots=True)
class Rollout:
    id: str
    input: Any
    mode: str = "train"
    status: RolloutStatus = RolloutStatus.QUEUING
    config: RolloutConfig = field(default_factory=RolloutConfig)
    metadata: dict[str, Any] = field(default_factory=dict)
    """The caller's data (reference answers, group id...); agent keys cannot read it."""
    group_id: str | None = None
    resources_version: int | None = None
    created_at: float = 0.0
    started_at: float | None = None
    ended_at: float | None = None
    reward: float | None = None
    completion_seq: int | None = None
    """Position on the completion cursor, set when the rollout turns terminal."""
    runner_id: str | None = None
    attempt_count: int = 0
    message: str | None = None
    enqueue_seq: int = 0
    """FIFO order of claims."""

    def to_json(self, *, with_metadata: bool = True) -> dict[str, Any]:
        out = shallow_json(self, Rollout, config=shallow_json(self.config))
        if not with_metadata:
            del out["metadata"]
        return out


@dataclass(slots=True)
class Attempt:
    id: str
    rollout_id: str
    seq: int
    """1 for the first attempt of its rollout, 2 for the next..."""
    status: AttemptStatus = AttemptStatus.RUNNING
    exit_code: int | None = None
    message: str | None = None
    started_at: float = 0.0
    ended_at: float | None = None
    deadline: float | None = None
    """Wall-clock time after which the runner should stop it (started_at + the rollout's timeout_s)."""

    def to_json(self) -> dict[str, Any]:
        # (not a subclass's fields: the client's StartedAttempt adds its env)
        return shallow_json(self, Attempt)


@dataclass(slots=True)
class Event:
    rollout_id: str
    seq: int
    """Per-rollout, from 1, in commit order."""
    kind: str
    data: Any
    attempt_id: str | None = None
    source: str = "admin"
    """Which key posted it: admin, agent, grader, or gateway (captured calls)."""
    created_at: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return shallow_json(self)


@dataclass(slots=True)
class Resource:
    name: str
    version: int
    value: Any
    created_at: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class ModelRecord:
    name: str
    endpoints: list[str]
    version: str
    updated_at: float = 0.0
    served_model: str | None = None
    """The name the endpoints serve the model under (vLLM's --served-model-name); None: the route's own (its
    routes-file entry's, else `name`)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True, eq=False)
class ChoiceRecord:
    index: int
    text: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    token_ids: array[int] = field(default_factory=lambda: array("I"))
    logprobs: array[float] | None = None
    """One float per completion token when logprobs were requested."""

    def to_json(self, *, with_ids: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "index": self.index,
            "text": self.text,
            "tool_calls": self.tool_calls,
            "finish_reason": self.finish_reason,
        }
        if with_ids:
            out["token_ids"] = self.token_ids.tolist()
            out["logprobs"] = None if self.logprobs is None else self.logprobs.tolist()
        return out

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ChoiceRecord) and self.to_json() == other.to_json()


RESPONSE_ID_PREFIX = "resp_"
"""How a Responses API call's id (its response id, `resp_…`) starts: the store indexes only those ids, so that
finding one costs one index search while a chat call's insert pays for no index of random ids."""
LABEL_KEY = re.compile(r"[A-Za-z0-9_.-]{1,64}", re.ASCII)
"""What a label's key may be (a call's `labels`): also what `?label=KEY:VALUE` splits on safely."""
MAX_LABELS = 32
MAX_LABEL_VALUE = 256


def label_problem(labels: Any) -> str | None:
    """Why `labels` cannot be stored (a dict of `LABEL_KEY` keys to short strings), or None."""
    if not isinstance(labels, dict):
        return f"labels must be a dict of strings, not {type(labels).__name__}"
    if len(labels) > MAX_LABELS:
        return f"{len(labels)} labels, more than {MAX_LABELS}"
    for key, value in labels.items():
        if not isinstance(key, str) or not LABEL_KEY.fullmatch(key):
            return f"label key {key!r} is not 1-64 of A-Z a-z 0-9 _ . -"
        if not isinstance(value, str) or len(value) > MAX_LABEL_VALUE:
            return f"label {key!r}: the value must be a string of at most {MAX_LABEL_VALUE} characters"
    return None


@dataclass(slots=True, eq=False)
class LLMCall:
    """One captured LLM exchange: all choices, exact token ids, what was sent and what came back."""

    id: str
    order_key: int
    """Taken at request start, so calls sort as issued, not as committed."""
    outcome: CallOutcome
    api: str
    """`chat` or `completions` (or `messages` for Anthropic clients)."""
    rollout_id: str | None = None
    attempt_id: str | None = None
    status: int = 0
    requested_model: str | None = None
    model: str | None = None
    """The route's model name (what the requested name or alias resolved to)."""
    served_model: str | None = None
    upstream: str | None = None
    model_version: str | None = None
    response_id: str | None = None
    client_id: str | None = None
    """The id the client saw (an Anthropic client sees `msg_...`); equals response_id for OpenAI clients."""
    stream: bool = False
    request: Any = None
    """The client's request body as it sent it."""
    upstream_request: Any = None
    """The request as translated for the upstream (an Anthropic call's chat completions body, before capture's
    injections); None when the gateway forwarded the client's own API."""
    client_response: Any = None
    """The response as the client received it when translated (an Anthropic message, also for a stream); None
    otherwise. `choices` and `usage` are always the upstream's view."""
    sampling: dict[str, Any] = field(default_factory=dict)
    """The sampling parameters actually sent upstream (after injection)."""
    prompt_token_ids: array[int] | None = None
    choices: list[ChoiceRecord] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    complete: bool | None = None
    """Completion ids per choice add up to usage.completion_tokens (None when there was nothing to check)."""
    error: str | None = None
    t_start: float = 0.0
    t_first_byte: float | None = None
    t_end: float | None = None
    late: bool = False
    """Committed after its rollout had ended (cancelled or finished while the call was in flight): kept, since the
    upstream was reached, but no part of the rollout's trajectory (no `llm_call` event, no triplet)."""
    labels: dict[str, str] = field(default_factory=dict)
    """Set by addons before the sink commits the call (`flow.metadata["capture.record"].labels["k"] = "v"`):
    stored with it, a filter of the calls API (`?label=k:v`), a column of `agl-client export`. Keys match
    `LABEL_KEY`, values are strings of at most `MAX_LABEL_VALUE` characters, at most `MAX_LABELS` of them."""

    def tokens(self) -> tuple[int, int]:
        """(prompt, completion) tokens: the upstream's usage, else the ids received (a stream cut before its usage
        arrived)."""
        usage = self.usage or {}
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if type(prompt) is int and type(completion) is int:
            return prompt, completion
        return len(self.prompt_token_ids or ()), sum(len(c.token_ids) for c in self.choices)

    def to_json(self, *, with_request: bool = True, with_ids: bool = True) -> dict[str, Any]:
        """The record as JSON-able data; `with_ids=False` leaves out token ids and logprobs (stored packed)."""
        out: dict[str, Any] = {
            "id": self.id,
            "order_key": self.order_key,
            "outcome": self.outcome.value,
            "api": self.api,
            "rollout_id": self.rollout_id,
            "attempt_id": self.attempt_id,
            "status": self.status,
            "requested_model": self.requested_model,
            "model": self.model,
            "served_model": self.served_model,
            "upstream": self.upstream,
            "model_version": self.model_version,
            "response_id": self.response_id,
            "client_id": self.client_id,
            "stream": self.stream,
            "sampling": self.sampling,
            "choices": [c.to_json(with_ids=with_ids) for c in self.choices],
            "usage": self.usage,
            "complete": self.complete,
            "error": self.error,
            "t_start": self.t_start,
            "t_first_byte": self.t_first_byte,
            "t_end": self.t_end,
            "late": self.late,
            "labels": self.labels,
        }
        if with_ids:
            out["prompt_token_ids"] = (
                None if self.prompt_token_ids is None else self.prompt_token_ids.tolist()
            )
        if with_request:
            out["request"] = self.request
            out["upstream_request"] = self.upstream_request
            out["client_response"] = self.client_response
        return out

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LLMCall) and self.to_json() == other.to_json()
