"""What client calls return beyond the store's own records: the gateway's pause state, a started attempt with
its environment, the outcome of `wait`. Plain data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agl_lite.store.records import Attempt, Rollout, shallow_json

__all__ = ["AttemptEnv", "GatewayState", "StartedAttempt", "WaitResult"]


@dataclass(frozen=True, slots=True)
class GatewayState:
    paused: bool
    mode: str | None
    """`hold` or `reject` while paused."""
    hold_timeout_s: float | None
    in_flight: int
    """LLM calls admitted and not finished (held calls are not in flight)."""
    held: int
    """LLM calls waiting for resume."""
    paused_since: float | None
    others_drained: bool | None = None
    """Under a pause shared through the store (PostgreSQL, several gateways): whether every other gateway held it
    with no call in flight when this answer was given; None where no other gateway shares the store."""

    @property
    def drained(self) -> bool:
        """No LLM call in flight here, nor in any other gateway on the store."""
        return self.in_flight == 0 and self.others_drained is not False

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> GatewayState:
        return cls(
            paused=bool(d["paused"]),
            mode=d.get("mode"),
            hold_timeout_s=d.get("hold_timeout_s"),
            in_flight=int(d.get("in_flight", 0)),
            held=int(d.get("held", 0)),
            paused_since=d.get("paused_since"),
            others_drained=d.get("others_drained"),
        )

    def to_json(self) -> dict[str, Any]:
        return shallow_json(self)


@dataclass(slots=True)
class StartedAttempt(Attempt):
    """An attempt (what the store's `start_attempt` returns) plus the environment to start the agent with."""

    env: dict[str, str] = field(default_factory=dict)
    """The agent contract (DESIGN.md §2): OPENAI_BASE_URL, OPENAI_API_KEY, AGL_TASK_INPUT..."""
    grader_env: dict[str, str] | None = None
    """The grading step's environment (grader key), when the rollout has a grading step; never give it to the agent."""


@dataclass(frozen=True, slots=True)
class AttemptEnv:
    """An env template for Kubernetes: `$(AGL_ATTEMPT_ID)` in it is expanded with the pod UID."""

    env: dict[str, str]
    grader_env: dict[str, str] | None


@dataclass(frozen=True, slots=True)
class WaitResult:
    """What `wait` saw: the terminal rollouts (in the order asked), the ids still pending, and the cursor to
    continue from."""

    rollouts: list[Rollout]
    pending: list[str]
    cursor: int

    @property
    def done(self) -> bool:
        """Whether every rollout asked for is terminal."""
        return not self.pending
