"""The mock vLLM's command-line behaviour (`agl-lite mock-llm --latency ... --fault-rate ...`): a scenario hook that
delays every reply and, for a seeded share of requests, misbehaves the way a real server under trouble does.

It owns only the choice of a scenario per request; what each scenario does is `mock_vllm`'s.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from agl_lite.testing.mock_vllm.scenario import ErrorReply, Scenario, ScenarioHook

__all__ = ["Fault", "Faults"]


class Fault(StrEnum):
    ERROR = "error"
    """A 500 body (vLLM's error shape) instead of the reply."""
    RESET = "reset"
    """The connection reset after the first events (before the reply, not streamed)."""
    STALL = "stall"
    """The reply stops after the first events and never ends."""
    MIDSTREAM = "midstream"
    """An error event in the middle of the stream (a 500 body, not streamed)."""


@dataclass(frozen=True, slots=True)
class Faults:
    latency_s: float = 0.0
    """Before a reply's headers."""
    ttft_s: float = 0.0
    """Before its first event (streams) or its body."""
    chunk_delay_s: float = 0.0
    """Between two events of a stream."""
    fault_rate: float = 0.0
    fault: Fault = Fault.ERROR
    seed: int = 0

    def __post_init__(self) -> None:
        if min(self.latency_s, self.ttft_s, self.chunk_delay_s) < 0:
            raise ValueError("delays must be >= 0")
        if not 0.0 <= self.fault_rate <= 1.0:
            raise ValueError("fault_rate must be within [0, 1]")

    @property
    def active(self) -> bool:
        return bool(self.latency_s or self.ttft_s or self.chunk_delay_s or self.fault_rate)

    def hook(self, inner: ScenarioHook | None = None) -> ScenarioHook:
        """A hook giving `inner`'s scenario (or the default reply) these delays and, `fault_rate` of the time
        (seeded), this fault."""
        rng = random.Random(self.seed)

        def choose(body: dict[str, Any]) -> Scenario | None:
            base = inner(body) if inner is not None else None
            scenario = replace(
                base or Scenario(),
                latency_s=self.latency_s,
                ttft_s=self.ttft_s,
                chunk_delay_s=self.chunk_delay_s,
            )
            if self.fault_rate and rng.random() < self.fault_rate:
                scenario = _with_fault(scenario, self.fault)
            return scenario if base is not None or self.active else None

        return choose


def _with_fault(scenario: Scenario, fault: Fault) -> Scenario:
    faults: dict[Fault, Callable[[Scenario], Scenario]] = {
        Fault.ERROR: lambda s: replace(s, error=ErrorReply(500, "mock upstream failure")),
        Fault.RESET: lambda s: replace(s, reset_after=2),
        Fault.STALL: lambda s: replace(s, stall_after=2),
        Fault.MIDSTREAM: lambda s: replace(s, error_frame_after=2),
    }
    return faults[fault](scenario)
