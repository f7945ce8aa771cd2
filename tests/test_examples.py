"""What examples/ promises, run for real."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest
from typer.testing import CliRunner

from agl_lite.cli import app
from agl_lite.service import running_gateway
from agl_lite.testing import MockVLLM, running_mock
from agl_lite.testing.gateway import write_config
from tests.conftest import ADMIN_KEY, gateway_url

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture
def custom_addon_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES / "custom_addon"))


@pytest.mark.usefixtures("custom_addon_on_path")
def test_custom_addon_example_config_is_valid() -> None:
    result = CliRunner().invoke(app, ["check-config", str(EXAMPLES / "custom_addon" / "agl-lite.toml")])
    assert result.exit_code == 0, result.output
    assert "audit:Audit" in result.output


@pytest.mark.usefixtures("custom_addon_on_path")
async def test_custom_addon_writes_one_line_per_llm_call(tmp_path: Path) -> None:
    async with running_mock(MockVLLM(("smollm2",))) as url:
        config = write_config(
            tmp_path,
            {"smollm2": [url]},
            aliases={"smollm2": ["gpt-4.1"]},
            chain=("auth", "route", "audit:Audit"),
            addons={"audit:Audit": {"path": "calls.jsonl"}},
        )
        async with running_gateway(config) as gw:
            client = openai.AsyncOpenAI(base_url=gateway_url(gw) + "/v1", api_key=ADMIN_KEY, max_retries=0)
            messages = [{"role": "user", "content": "hi"}]
            await client.chat.completions.create(model="gpt-4.1", messages=messages, max_tokens=4)  # type: ignore[arg-type]
            stream = await client.chat.completions.create(
                model="gpt-4.1", messages=messages, max_tokens=4, stream=True
            )  # type: ignore[arg-type]
            chunks = [c async for c in stream]
            await client.models.list()  # not an LLM call: no line
    lines = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert [(line["model"], line["status"]) for line in lines] == [("gpt-4.1", 200), ("gpt-4.1", 200)]
    assert lines[0]["stream_events"] is None
    assert lines[1]["stream_events"] == len(chunks) + 1  # every chunk the SDK saw, plus [DONE]
