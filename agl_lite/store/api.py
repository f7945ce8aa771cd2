"""The store's HTTP payloads, validated with pydantic (the endpoints that take them declare them, and the OpenAPI
document is generated from the same models). No I/O here.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from agl_lite.core.api import NO_NUL
from agl_lite.core.contract import ATTEMPT_FROM_POD
from agl_lite.core.upstream_urls import ENDPOINT_PATTERN, endpoint_problem
from agl_lite.errors import BadRequest
from agl_lite.store.records import AttemptStatus, RolloutConfig
from agl_lite.store.rules import LLM_CALL_KIND, EventSpec, RolloutSpec

__all__ = [
    "AgentEventIn",
    "AttemptIn",
    "AttemptPatchIn",
    "CancelIn",
    "ClaimIn",
    "EnqueueIn",
    "EventsIn",
    "FinishIn",
    "ModelIn",
    "ResourceIn",
    "TripletsIn",
]

ID = r"^[A-Za-z0-9_-]{1,128}$"
KIND = r"^[a-z][a-z0-9_.-]{0,63}$"


def _json_number(value: Any) -> Any:
    """A number as JSON Schema has it: 5 or 5.0 for an integer, never "5" or true (pydantic's lax mode takes both;
    its strict mode refuses 5.0)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be a number")
    return value


_NUMBER = BeforeValidator(_json_number)
"""Goes after the field's bounds in its `Annotated`, or the OpenAPI document loses them."""


TEXT = NO_NUL
"""Free text the store keeps as text (a model's name and version, a step's response id): anything but NUL, which
no backend's text holds (PostgreSQL refuses it), as for every string query parameter."""


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False)


class RolloutConfigIn(_In):
    # Numbers and booleans are taken as JSON Schema reads them (no "5" for 5, no false for 0.0): what the
    # OpenAPI document says is all that is taken, so a request that breaks it is refused, not reinterpreted.
    max_attempts: Annotated[int, Field(ge=1, le=100), _NUMBER] = Field(
        1, description="Attempts allowed (local retries / Job pods)."
    )
    timeout_s: float | None = Field(
        None, gt=0, strict=True, description="Per-attempt wall-clock limit in seconds."
    )
    trust_agent_rewards: bool = Field(
        False, strict=True, description="Whether rewards the agent posts count."
    )
    token_budget: Annotated[int, Field(ge=1, le=2**62), _NUMBER] | None = Field(
        None, description="Tokens the rollout's LLM calls may use in all."
    )
    runner: dict[str, Any] = Field(
        default_factory=dict, description="Runner overrides (command, env, Job fields)."
    )
    grader: dict[str, Any] | None = Field(None, description="The grading step (command or container).")


class RolloutIn(_In):
    input: Any = Field(description="The task, as JSON; the agent reads it from AGL_TASK_INPUT.")
    mode: Annotated[str, Field(pattern=KIND)] = "train"
    config: RolloutConfigIn = Field(default_factory=lambda: RolloutConfigIn.model_validate({}))
    metadata: dict[str, Any] = Field(
        default_factory=dict, description="Yours (reference answers...); agents cannot read it."
    )
    group_id: Annotated[str, Field(pattern=ID)] | None = None
    resources_version: Annotated[int, Field(ge=1, le=2**62), _NUMBER] | None = None
    rollout_id: Annotated[str, Field(pattern=ID)] | None = Field(
        None, description="Makes the create idempotent."
    )

    def spec(self) -> RolloutSpec:
        return RolloutSpec(
            input=self.input,
            mode=self.mode,
            config=RolloutConfig(**self.config.model_dump()),
            metadata=self.metadata,
            group_id=self.group_id,
            resources_version=self.resources_version,
            id=self.rollout_id,
        )


class EnqueueIn(_In):
    rollouts: list[RolloutIn] = Field(min_length=1, max_length=1000)


class ClaimIn(_In):
    runner_id: Annotated[str, Field(pattern=ID)]
    limit: Annotated[int, Field(ge=1, le=1000), _NUMBER] = 1


class AttemptIn(_In):
    attempt_id: str | None = Field(
        None,
        description=f"A pod UID or any id; `{ATTEMPT_FROM_POD}` for a Kubernetes env template.",
        pattern=r"^([A-Za-z0-9_-]{1,128}|\$\(AGL_ATTEMPT_ID\))$",
    )


class AttemptPatchIn(_In):
    status: AttemptStatus
    exit_code: Annotated[int, Field(ge=-(2**31), le=2**31 - 1), _NUMBER] | None = None
    message: str | None = Field(None, max_length=65536)


class FinishIn(_In):
    status: Literal["succeeded", "failed"]
    message: str | None = Field(None, max_length=65536)


class CancelIn(_In):
    message: str | None = Field(None, max_length=65536)


class EventIn(_In):
    kind: Annotated[str, Field(pattern=KIND)]
    data: Any = None
    attempt_id: Annotated[str, Field(pattern=ID)] | None = None

    def spec(self) -> EventSpec:
        return EventSpec(self.kind, self.data, self.attempt_id)


class EventsIn(_In):
    events: list[EventIn] = Field(min_length=1, max_length=1000)


class AgentEventIn(_In):
    """What an agent (AGL_EVENT_URL) or grader posts: a custom event, or `{"kind": "reward", "value": ...}`."""

    # `llm_call` events are the gateway's record of captured calls: an agent must not forge one.
    kind: Annotated[str, Field(pattern=KIND, json_schema_extra={"not": {"enum": [LLM_CALL_KIND]}})]
    value: float | None = Field(None, strict=True, description="The reward, for kind `reward`.")
    data: Any = None
    response_id: str | None = Field(
        None, max_length=256, pattern=TEXT, description="Rewards one step: the call's response id."
    )
    choice: Annotated[int, Field(ge=0, le=2**31 - 1), _NUMBER] | None = Field(
        None, description="...and its choice index."
    )

    @field_validator("kind")
    @classmethod
    def _not_the_gateways(cls, kind: str) -> str:
        if kind == LLM_CALL_KIND:
            raise ValueError(f"'{LLM_CALL_KIND}' events are the gateway's own records of captured calls")
        return kind

    def spec(self, attempt_id: str) -> EventSpec:
        if self.kind == "reward":
            if self.value is None:
                raise BadRequest("a reward needs a numeric 'value'")
            data: dict[str, Any] = {"value": self.value}
            if self.response_id is not None:
                data["response_id"] = self.response_id
                data["choice"] = self.choice or 0
            if self.data is not None:
                data["data"] = self.data
            return EventSpec("reward", data, attempt_id)
        return EventSpec(self.kind, self.data, attempt_id)


class ResourceIn(_In):
    name: Annotated[str, Field(pattern=ID)]
    value: Any


class ModelIn(_In):
    name: Annotated[str, Field(min_length=1, max_length=256, pattern=TEXT)]
    endpoints: list[Annotated[str, Field(pattern=ENDPOINT_PATTERN, max_length=2048)]] = Field(
        min_length=1, max_length=64
    )
    version: Annotated[str, Field(min_length=1, max_length=256, pattern=TEXT)]
    served_model: Annotated[str, Field(min_length=1, max_length=256, pattern=TEXT)] | None = None
    """The name the endpoints serve the model under; absent: the route's own."""

    @field_validator("endpoints")
    @classmethod
    def _endpoints(cls, endpoints: list[str]) -> list[str]:
        for i, endpoint in enumerate(endpoints):
            problem = endpoint_problem(endpoint)
            if problem is not None:
                raise ValueError(f"endpoints[{i}] is no upstream base URL: {problem}")
        return endpoints


class ModelRemoveIn(_In):
    name: Annotated[str, Field(min_length=1, max_length=256, pattern=TEXT)]


class TripletsIn(_In):
    """Triplets of many rollouts, as NDJSON (one line per rollout, in this order) up to `max_bytes` a response."""

    rollout_ids: list[Annotated[str, Field(pattern=ID)]] = Field(min_length=1, max_length=1000)
    attempts: Literal["final", "all"] = Field("final", description="The final attempt's calls only, or all.")
    reward_policy: Literal["last", "broadcast"] = Field("last", description="Reward the last step or all.")
    missing_reward: float = Field(
        0.0, allow_inf_nan=False, strict=True, description="Reward of a rollout without one."
    )
    max_bytes: Annotated[int, Field(ge=1024, le=256 * 1024 * 1024), _NUMBER] = Field(
        8 * 1024 * 1024, description="Stop adding rollouts past this size."
    )
