"""examples/agents-sdk/agent.py, the OpenAI Agents SDK unchanged, as a rollout's agent under the local runner.

The mock vLLM is scripted as a model would act: it calls the agent's `calculate` tool, then answers with what the
tool returned. The rollout must succeed with the tool's result as its answer event, both turns must be captured
as Responses calls with the upstream's token ids, and they must merge into one training row.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from agl_lite.addons import DEFAULT_CHAIN
from agl_lite.client import AglLiteClient
from agl_lite.integrations.trajectory import merge_trajectories
from agl_lite.service import running_gateway
from agl_lite.store.records import AttemptStatus, CallOutcome, RolloutConfig, RolloutStatus
from agl_lite.store.rules import RolloutSpec
from agl_lite.testing import MockVLLM, Scenario, ToolCallSpec, running_mock
from agl_lite.testing.gateway import write_config
from tests.conftest import ADMIN_KEY, gateway_url

AGENT = Path(__file__).resolve().parents[2] / "examples" / "agents-sdk" / "agent.py"


def calculate_then_answer(request: dict[str, Any]) -> Scenario:
    """A model's two turns: call `calculate`, then (its result in the conversation) answer with it."""
    results = [m["content"] for m in request["messages"] if m.get("role") == "tool"]
    if results:
        return Scenario(content=str(results[-1]))
    return Scenario(tool_call=ToolCallSpec("calculate", {"expression": "15 * 7 * 3"}))


async def test_the_agents_sdk_example_runs_as_a_rollout_agent(tmp_path: Path) -> None:
    runner = {"command": [sys.executable, str(AGENT)], "timeout_s": 60.0, "grace_s": 1.0}
    async with running_mock(MockVLLM(("smollm2",), hook=calculate_then_answer)) as url:
        config = write_config(
            tmp_path,
            {"smollm2": [url]},
            aliases={"smollm2": ["gpt-4.1"]},
            chain=(*DEFAULT_CHAIN, "runner"),
            addons={"store": {"backend": "sqlite", "path": "agl.db"}, "runner": runner},
        )
        async with running_gateway(config) as gw, AglLiteClient(gateway_url(gw), ADMIN_KEY) as client:
            spec = RolloutSpec(
                {"question": "How many pages are 15 a day for 3 weeks?"}, config=RolloutConfig()
            )
            (rollout,) = await client.enqueue([spec])
            done = await client.wait([rollout.id], 60.0, poll_s=60.0)
            assert done.pending == [], "the agent's rollout did not finish in time"
            (attempt,) = await client.attempts(rollout.id)
            calls = await client.calls(rollout.id)
            answers = await client.events(rollout.id, "answer")
            triplets = (await client.triplets(rollout.id)).triplets
    assert (done.rollouts[0].status, attempt.status) == (RolloutStatus.SUCCEEDED, AttemptStatus.SUCCEEDED), (
        attempt.message
    )
    assert [e.data for e in answers] == [{"text": "315"}]
    assert [(c.api, c.outcome, c.complete) for c in calls] == [("responses", CallOutcome.OK, True)] * 2
    assert all(c.prompt_token_ids and c.choices[0].token_ids for c in calls)
    assert calls[1].upstream_request["messages"][-1]["role"] == "tool"
    (row,), stats = merge_trajectories(triplets)
    assert (len(row.spans), stats.rows) == (2, 1)
