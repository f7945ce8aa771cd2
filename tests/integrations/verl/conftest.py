"""A real gateway (full capture chain, SQLite) in front of the mock vLLM, and a client whose enqueues are run by
real agents: each claimed rollout gets an attempt, and an agent that talks to the gateway with the real `openai`
SDK through its own `OPENAI_BASE_URL`, two turns; then the admin posts its reward and the runner its verdict."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

from agl_lite.addons import DEFAULT_CHAIN
from agl_lite.client import AglLiteClient, ClientError
from agl_lite.core.server import Gateway
from agl_lite.store.records import AttemptStatus, Rollout, RolloutStatus
from agl_lite.testing import MockVLLM, Scenario, running_mock
from agl_lite.testing.mock_vllm.scenario import last_user_text
from tests.client.conftest import FAST, sqlite_options
from tests.conftest import ADMIN_KEY, GatewayFactory, gateway_url

MODEL = "smollm2"


def reply_to(question: str) -> str:
    return f"Answer to {question}"


async def two_turns(env: dict[str, str], task: Any) -> None:
    """The agent: ask, then ask again with the model's answer in the conversation."""
    async with openai.AsyncOpenAI(
        base_url=env["OPENAI_BASE_URL"], api_key=env["OPENAI_API_KEY"], max_retries=0
    ) as sdk:
        messages: list[dict[str, Any]] = [{"role": "user", "content": task["q"]}]
        first = await sdk.chat.completions.create(model=MODEL, messages=messages)  # type: ignore[arg-type]
        messages += [
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "and then?"},
        ]
        await sdk.chat.completions.create(model=MODEL, messages=messages)  # type: ignore[arg-type]


class Agents(AglLiteClient):
    """A client whose `enqueue_group` also runs the rollouts it created, like a runner would."""

    def __init__(self, url: str) -> None:
        super().__init__(url, ADMIN_KEY, retry=FAST)
        self.held: set[str] = set()
        """Inputs (`q`) whose agents wait for `release` before finishing (stragglers)."""
        self.release = asyncio.Event()
        self.failing: set[str] = set()
        """Inputs (`q`) whose second rollout the runner gives up on (`failed`: the agent crashed)."""
        self.tasks: list[asyncio.Task[None]] = []
        self.reward_of: Callable[[Rollout, int], float | None] = lambda rollout, index: (
            1.0 if index == 0 else 0.0
        )

    async def enqueue_group(self, inputs: Sequence[Any], **kwargs: Any) -> list[list[Rollout]]:
        groups = await super().enqueue_group(inputs, **kwargs)
        claimed = await self.claim("test-runner", sum(len(g) for g in groups))
        assert {r.id for r in claimed} == {r.id for g in groups for r in g}
        for group in groups:
            for index, rollout in enumerate(group):
                self.tasks.append(asyncio.ensure_future(self._run(rollout, index)))
        return groups

    async def _run(self, rollout: Rollout, index: int) -> None:
        attempt = await self.start_attempt(rollout.id)
        await two_turns(attempt.env, rollout.input)
        if rollout.input["q"] in self.held:
            await self.release.wait()
        with contextlib.suppress(ClientError):  # a straggler's rollout was cancelled meanwhile
            reward = self.reward_of(rollout, index)
            if reward is not None:
                await self.reward(rollout.id, reward)
            if rollout.input["q"] in self.failing and index == 1:
                await self.update_attempt(rollout.id, attempt.id, AttemptStatus.FAILED, exit_code=1)
                await self.finish(rollout.id, RolloutStatus.FAILED)
                return
            await self.update_attempt(rollout.id, attempt.id, AttemptStatus.SUCCEEDED, exit_code=0)
            await self.finish(rollout.id, RolloutStatus.SUCCEEDED)

    async def drain(self) -> None:
        self.release.set()
        await asyncio.wait_for(asyncio.gather(*self.tasks), 30)


@dataclass
class Bench:
    gateway: Gateway
    mock: MockVLLM
    agents: Agents


@pytest.fixture
async def bench(gateway_factory: GatewayFactory, tmp_path: Path) -> AsyncIterator[Bench]:
    mock = MockVLLM((MODEL,), hook=lambda body: Scenario(content=reply_to(last_user_text(body))))
    async with (
        running_mock(mock) as url,
        gateway_factory(
            {MODEL: [url]},
            chain=tuple(n for n in DEFAULT_CHAIN if n != "metrics"),
            addons={**sqlite_options(tmp_path / "s.db"), "capture": {"logprobs": True}},
        ) as gw,
    ):
        agents = Agents(gateway_url(gw))
        try:
            yield Bench(gw, mock, agents)
        finally:
            await agents.drain()
            await agents.close()
