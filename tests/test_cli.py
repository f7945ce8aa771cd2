from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
from typer.testing import CliRunner

from agl_lite import __version__
from agl_lite.cli import app
from agl_lite.core.contract import KeyRole, Principal, identify
from tests.conftest import ADMIN_KEY

runner = CliRunner()


def valid_config(tmp_path: Path) -> Path:
    (tmp_path / "routes.toml").write_text(
        '[models.m]\nupstreams = [{ base_url = "http://127.0.0.1:8000/v1" }]\n'
    )
    path = tmp_path / "agl-lite.toml"
    path.write_text("[server]\nport = 8123\n")
    return path


def test_check_config_accepts_a_valid_config(tmp_path: Path) -> None:
    result = runner.invoke(app, ["check-config", str(valid_config(tmp_path))])
    assert result.exit_code == 0, result.output
    assert "ok" in result.output
    assert "store -> auth -> " in result.output


def test_check_config_names_the_bad_key_and_exits_2(tmp_path: Path) -> None:
    path = valid_config(tmp_path)
    path.write_text("[server]\nprot = 1\n")
    result = runner.invoke(app, ["check-config", str(path)])
    assert result.exit_code == 2
    assert "unknown key 'server.prot'" in result.output
    assert "Traceback" not in result.output


def test_check_config_checks_the_routes_file_too(tmp_path: Path) -> None:
    path = valid_config(tmp_path)
    (tmp_path / "routes.toml").write_text("[models.m]\nupstreams = []\n")
    result = runner.invoke(app, ["check-config", str(path)])
    assert result.exit_code == 2
    assert "routes.toml: models.m.upstreams is empty" in result.output


def test_run_with_a_bad_config_exits_2_with_one_line(tmp_path: Path) -> None:
    result = runner.invoke(app, ["run", "--config", str(tmp_path / "missing.toml")])
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0
    assert "config file not found" in result.output


def test_key_prints_the_agent_key_of_a_rollout() -> None:
    result = runner.invoke(app, ["key", "ro-7"])
    assert result.exit_code == 0
    assert identify(ADMIN_KEY, result.output.strip()) == Principal(KeyRole.AGENT, "ro-7")


def test_key_grader_flag() -> None:
    result = runner.invoke(app, ["key", "ro-7", "--grader"])
    assert identify(ADMIN_KEY, result.output.strip()) == Principal(KeyRole.GRADER, "ro-7")


def test_key_rejects_an_unsafe_rollout_id() -> None:
    result = runner.invoke(app, ["key", "../etc"])
    assert result.exit_code == 2
    assert "invalid rollout id" in result.output


def test_key_without_admin_key() -> None:
    result = runner.invoke(app, ["key", "ro-7"], env={"AGL_KEY": ""})
    assert result.exit_code == 2
    assert "AGL_KEY is not set" in result.output


def test_version() -> None:
    result = runner.invoke(app, ["version"])
    assert result.output.strip() == __version__


async def start(*args: str, ready: bytes, stream: str = "stdout") -> asyncio.subprocess.Process:
    """Start `python -m agl_lite ARGS` and wait (bounded) until it prints `ready` on `stream`."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agl_lite",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    pipe = proc.stdout if stream == "stdout" else proc.stderr
    assert pipe is not None
    seen = b""
    while ready not in seen:
        line = await asyncio.wait_for(pipe.readline(), 30)
        if not line:
            raise AssertionError(f"exited before ready: {seen.decode()}")
        seen += line
    return proc


async def stop(proc: asyncio.subprocess.Process) -> int:
    proc.send_signal(signal.SIGTERM)
    return await asyncio.wait_for(proc.wait(), 30)


async def test_mock_llm_and_run_serve_and_stop_on_sigterm(
    tmp_path: Path, unused_tcp_port_factory: Any
) -> None:
    mock_port, gw_port = unused_tcp_port_factory(), unused_tcp_port_factory()
    (tmp_path / "routes.toml").write_text(
        f'[models.smollm2]\nupstreams = [{{ base_url = "http://127.0.0.1:{mock_port}/v1" }}]\n'
    )
    (tmp_path / "agl-lite.toml").write_text(f"[server]\nport = {gw_port}\n")
    reply = await chat_through(
        ("mock-llm", "--port", str(mock_port)), tmp_path / "agl-lite.toml", gw_port, "smollm2"
    )
    assert reply["object"] == "chat.completion"


async def chat_through(mock_args: Sequence[str], config: Path, port: int, model: str) -> dict[str, Any]:
    """Start `agl-lite MOCK_ARGS` and a gateway from `config` listening on `port`, make one chat call with the
    admin key, stop both (the gateway with SIGTERM, which must exit 0); the reply's JSON."""
    mock = await start(*mock_args, ready=b"Running on")
    try:
        gateway = await start("run", "--config", str(config), ready=b"gateway listening", stream="stderr")
        try:
            async with aiohttp.ClientSession() as s:
                body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
                headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
                async with s.post(
                    f"http://127.0.0.1:{port}/v1/chat/completions", json=body, headers=headers
                ) as r:
                    assert r.status == 200, await r.text()
                    reply: dict[str, Any] = await r.json()
        finally:
            assert await stop(gateway) == 0
    finally:
        await stop(mock)
    return reply
