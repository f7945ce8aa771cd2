"""`agl-lite mock-llm`'s delay and fault options: the scenario each request gets, what the client then sees, the
context length Claude Code needs, and a clear error for a fault that does not exist."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from typer.testing import CliRunner

from agl_lite.cli import app
from agl_lite.testing.mock_vllm import MockVLLM, running_mock
from agl_lite.testing.mock_vllm.faults import Fault, Faults
from agl_lite.testing.mock_vllm.scenario import Scenario

BODY: dict[str, Any] = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def test_every_request_gets_the_delays_and_a_seeded_share_gets_the_fault() -> None:
    hook = Faults(latency_s=0.5, chunk_delay_s=0.01, fault_rate=0.25, fault=Fault.RESET, seed=3).hook()
    chosen = [hook(BODY) for _ in range(400)]
    assert all(s is not None and (s.latency_s, s.chunk_delay_s) == (0.5, 0.01) for s in chosen)
    faulty = sum(1 for s in chosen if s is not None and s.reset_after is not None)
    assert 60 < faulty < 140  # a quarter of 400, give or take the draw
    again = Faults(latency_s=0.5, chunk_delay_s=0.01, fault_rate=0.25, fault=Fault.RESET, seed=3).hook()
    assert [s.reset_after if s else None for s in (again(BODY) for _ in range(400))] == [
        s.reset_after if s else None for s in chosen
    ]
    assert Faults().hook()(BODY) is None  # nothing asked: the mock's default reply


def test_an_inner_hooks_reply_keeps_its_content_under_the_faults() -> None:
    hook = Faults(ttft_s=0.1).hook(lambda body: Scenario(content="from the tutor"))
    scenario = hook(BODY)
    assert scenario is not None
    assert (scenario.content, scenario.ttft_s) == ("from the tutor", 0.1)


@pytest.mark.parametrize(("fault", "status"), [(Fault.ERROR, 500), (Fault.MIDSTREAM, 500)])
async def test_a_faulty_reply_is_what_a_failing_vllm_sends(fault: Fault, status: int) -> None:
    mock = MockVLLM(hook=Faults(fault_rate=1.0, fault=fault).hook())
    async with running_mock(mock) as url, aiohttp.ClientSession() as http:
        async with http.post(f"{url}/chat/completions", json=BODY) as reply:
            assert reply.status == status
            assert "error" in await reply.json()


async def test_claude_codes_32000_output_tokens_need_the_longer_context() -> None:
    body = {**BODY, "max_tokens": 32000}
    for max_model_len, status in ((2048, 400), (65536, 200)):
        async with (
            running_mock(MockVLLM(max_model_len=max_model_len)) as url,
            aiohttp.ClientSession() as http,
            http.post(f"{url}/chat/completions", json=body) as reply,
        ):
            assert reply.status == status, await reply.text()


def test_an_unknown_fault_is_one_clear_line() -> None:
    result = CliRunner().invoke(app, ["mock-llm", "--fault", "meltdown"])
    assert result.exit_code != 0
    assert "--fault 'meltdown': use one of error, reset, stall, midstream" in result.output
