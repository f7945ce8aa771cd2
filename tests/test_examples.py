"""What examples/ and the docs' runnable sketches promise, run for real."""

from __future__ import annotations

import ast
import asyncio
import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
from typer.testing import CliRunner

from agl_lite.addons import DEFAULT_CHAIN
from agl_lite.cli import app
from agl_lite.client import AglLiteClient
from agl_lite.service import running_gateway
from agl_lite.store.records import AttemptStatus, Rollout, RolloutStatus
from agl_lite.store.rules import Store
from agl_lite.testing import MockVLLM, Scenario, running_mock
from agl_lite.testing.gateway import write_config
from tests.client.conftest import FAST, sqlite_options, store_of
from tests.conftest import ADMIN_KEY, GatewayFactory, gateway_url

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


@pytest.mark.usefixtures("custom_addon_on_path")
async def test_custom_addon_runs_as_an_instance_with_its_default_options(tmp_path: Path) -> None:
    """The README's `running_gateway(config, extra_addons=[Audit()])`: configured with its `Options` defaults
    (it used to get `None` and crash on `options.path`)."""
    from audit import Audit  # type: ignore[import-not-found]

    async with running_mock(MockVLLM(("smollm2",))) as url:
        config = write_config(tmp_path, {"smollm2": [url]})
        async with running_gateway(config, extra_addons=[Audit()]) as gw:
            client = openai.AsyncOpenAI(base_url=gateway_url(gw) + "/v1", api_key=ADMIN_KEY, max_retries=0)
            await client.chat.completions.create(
                model="smollm2", messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
    (line,) = (tmp_path / "audit.jsonl").read_text().splitlines()  # the default path, beside the config
    assert json.loads(line)["status"] == 200


@pytest.mark.usefixtures("custom_addon_on_path")
async def test_custom_addon_joins_the_default_chain_before_the_sink(tmp_path: Path) -> None:
    """`[addons] extra = ["audit:Audit"]`: the default chain plus the user's addon, placed before `sink`."""
    async with running_mock(MockVLLM(("smollm2",))) as url:
        config = write_config(
            tmp_path,
            {"smollm2": [url]},
            chain=DEFAULT_CHAIN,
            addons={"audit:Audit": {"path": "calls.jsonl"}},
            extra={"addons": {"extra": ["audit:Audit"]}},
        )
        assert config.full_chain == (*DEFAULT_CHAIN[:-1], "audit:Audit", "sink")
        async with running_gateway(config) as gw:
            client = openai.AsyncOpenAI(base_url=gateway_url(gw) + "/v1", api_key=ADMIN_KEY, max_retries=0)
            await client.chat.completions.create(
                model="smollm2", messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
    (line,) = (tmp_path / "calls.jsonl").read_text().splitlines()
    assert json.loads(line)["model"] == "smollm2"


def test_the_custom_addon_imports_one_module_of_agl_lite() -> None:
    """An addon written from the docs needs `agl_lite.addon` and nothing else of agl-lite."""
    tree = ast.parse((EXAMPLES / "custom_addon" / "audit.py").read_text())
    modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    modules |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert {m for m in modules if m.split(".")[0] == "agl_lite"} == {"agl_lite.addon"}


# --- docs/client.md: the training-loop sketch ---------------------------------------------------------------

DOC = Path(__file__).resolve().parent.parent / "docs" / "client.md"


def sketch() -> str:
    """The fenced Python block after the `tested:` marker."""
    found = re.search(
        r"<!-- tested: tests/test_examples.py -->\n```python\n(.*?)\n```", DOC.read_text(), re.S
    )
    assert found, "docs/client.md lost its tested training-loop sketch"
    return found.group(1)


def answer(request: dict[str, Any]) -> Scenario:
    """The mock model knows 2+3 and nothing else: half the groups earn reward 1."""
    question = request["messages"][0]["content"]
    return Scenario(content="The answer is 5." if "2+3" in question else "I do not know.")


async def agent(env: dict[str, str]) -> None:
    task = json.loads(env["AGL_TASK_INPUT"])
    async with openai.AsyncOpenAI(
        base_url=env["OPENAI_BASE_URL"], api_key=env["OPENAI_API_KEY"], max_retries=0
    ) as llm:
        messages: list[Any] = [{"role": "user", "content": task["question"]}]
        first = await llm.chat.completions.create(model="smollm2", messages=messages, max_tokens=8)
        messages += [{"role": "assistant", "content": first.choices[0].message.content}]
        messages += [{"role": "user", "content": "So, your final answer?"}]
        await llm.chat.completions.create(model="smollm2", messages=messages, max_tokens=8)


async def run_one(client: AglLiteClient, rollout: Rollout) -> None:
    attempt = await client.start_attempt(rollout.id)
    await agent(attempt.env)
    await client.update_attempt(rollout.id, attempt.id, AttemptStatus.SUCCEEDED, exit_code=0)
    await client.finish(rollout.id, RolloutStatus.SUCCEEDED)


async def runner(client: AglLiteClient, stop: asyncio.Event) -> None:
    while not stop.is_set():
        claimed = await client.claim("docs-runner", 100)
        if claimed:
            await asyncio.gather(*(run_one(client, r) for r in claimed))
        else:
            await asyncio.sleep(0.01)  # a runner's poll interval, not a synchronisation


@dataclass
class Setup:
    url: str
    store: Store
    upstream: str


@pytest.fixture
async def setup(gateway_factory: GatewayFactory, tmp_path: Path) -> AsyncIterator[Setup]:
    async with (
        running_mock(MockVLLM(("smollm2",), hook=answer)) as upstream,
        gateway_factory(
            {"smollm2": [upstream]},
            chain=tuple(n for n in DEFAULT_CHAIN if n != "metrics"),
            addons=sqlite_options(tmp_path / "s.db"),
        ) as gw,
    ):
        yield Setup(gateway_url(gw), store_of(gw), upstream)


async def test_the_training_loop_sketch_runs(
    setup: Setup, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AGL_URL", setup.url)
    monkeypatch.setenv("VLLM_URL", setup.upstream)  # the weight sync registers the endpoint it keeps serving
    namespace: dict[str, Any] = {"__name__": "docs_client_sketch"}
    exec(compile(sketch(), str(DOC), "exec"), namespace)
    stop = asyncio.Event()
    async with AglLiteClient(setup.url, ADMIN_KEY, retry=FAST) as client:
        agents = asyncio.ensure_future(runner(client, stop))
        try:
            await asyncio.wait_for(namespace["main"](), 60)
        finally:
            stop.set()
            await agents
        assert ast.literal_eval(capsys.readouterr().out.strip()) == [0.5, 0.5]
        rollouts = [r async for r in client.iter_rollouts()]
        assert len(rollouts) == 2 * 2 * 4
        assert sorted({r.reward for r in rollouts}) == [0.0, 1.0]
        assert [(m.name, m.version) for m in await client.models()] == [("smollm2", "step-2")]
        assert not (await client.gateway_state()).paused
    calls = await setup.store.calls(rollouts[0].id)
    assert len(calls) == 2
    versions = {c.model_version for r in rollouts for c in await setup.store.calls(r.id)}
    assert versions == {None, "step-1"}  # step 2's calls ran after the first sync
    assert calls[1].prompt_token_ids is not None
    assert len(calls[1].choices[0].token_ids) > 0


def _run_sh_config(tmp_path: Path, env_file: str | None, **env: str) -> tuple[int, str]:
    """`examples/math-poc/run.sh --print-config` (the seed's quick start, --runner k8s): what it would use."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("AGL_", "VLLM_"))}
    full |= {"AGL_DEMO_PYTHON": sys.executable, **env}
    if env_file is not None:
        (tmp_path / "deploy.env").write_text(env_file)
        full["AGL_DEMO_ENV_FILE"] = str(tmp_path / "deploy.env")
    else:
        full["AGL_DEMO_ENV_FILE"] = str(tmp_path / "missing.env")
    done = subprocess.run(
        [str(EXAMPLES / "math-poc" / "run.sh"), "--print-config"],
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr


def test_the_quick_starts_env_file_keeps_the_exported_key_and_sets_the_port_before_it_is_used(
    tmp_path: Path,
) -> None:
    example = (EXAMPLES / "math-poc" / ".env.vllm.example").read_text()
    assert "\nAGL_KEY=\n" in example  # the example leaves the key to the shell
    code, out = _run_sh_config(tmp_path, example, AGL_KEY="exported-key")
    assert code == 0, out
    assert "key=given" in out  # the file's empty AGL_KEY= did not wipe the exported one
    assert (
        "port=8100 public_url=http://host.minikube.internal:8100" in out
    )  # the file's port, read before use
    code, out = _run_sh_config(tmp_path, example, AGL_DEMO_PORT="8100", VLLM_MODEL="mine")
    assert code == 0, out
    assert "vllm_model=mine" in out  # the environment wins over the file
    assert "key=generated" in out


def test_the_quick_start_refuses_a_public_url_on_another_port_and_a_missing_env_file(tmp_path: Path) -> None:
    code, out = _run_sh_config(
        tmp_path, "AGL_PUBLIC_URL=http://host.minikube.internal:8100\n", AGL_DEMO_PORT="9000"
    )
    assert code == 2
    assert "says port 8100, but the gateway would listen on 9000" in out
    code, out = _run_sh_config(tmp_path, None)
    assert code == 2
    assert "copy examples/math-poc/.env.vllm.example to deploy/.env first" in out
    code, out = _run_sh_config(tmp_path, "AGL_PUBLIC_URL=http://host.minikube.internal:8200\n")
    assert code == 0, out
    assert "port=8200" in out  # no AGL_DEMO_PORT: the public URL's port is the one to listen on
