"""The runner addon: its options are checked at start-up, it picks the in-process store or a remote one, and it
starts and stops the runner with the gateway."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from agl_lite.addons.runner import AgentRunner
from agl_lite.client import AglLiteClient
from agl_lite.core.config import GatewayConfig
from agl_lite.errors import ConfigError
from agl_lite.runner.local import LocalBackend
from agl_lite.service import build_gateway, check_config, running_gateway
from agl_lite.store.records import AttemptStatus, RolloutConfig, RolloutStatus
from agl_lite.store.rules import STORE, RolloutSpec
from agl_lite.testing.gateway import write_config
from tests.runner.probe import exited, marked_pids, running_probe

CHAIN = ("store", "runner")


def config(tmp_path: Path, chain: tuple[str, ...] = CHAIN, **runner: Any) -> GatewayConfig:
    addons: dict[str, Any] = {"runner": runner} if "runner" in chain else {}
    if "store" in chain:
        addons["store"] = {"backend": "memory"}
    return write_config(tmp_path, {}, chain=chain, addons=addons)


async def configured(cfg: GatewayConfig) -> AgentRunner:
    gateway = build_gateway(cfg)
    await gateway.addons.load()
    await gateway.addons.configure(cfg)
    (addon,) = [a.addon for a in gateway.addons.addons if isinstance(a.addon, AgentRunner)]
    return addon


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"concurrency": 0}, "concurrency must be between 1 and 10000"),
        ({"timeout_s": -1}, "timeout_s must not be negative"),
        ({"max_attempts": -1}, "max_attempts must not be negative"),
        ({"grace_s": -0.5}, "grace_s must not be negative"),
        ({"poll_s": 0}, "poll_s must be positive"),
        ({"resync_s": 0}, "resync_s must be positive"),
        ({"output_tail_bytes": 100_000}, "output_tail_bytes must be between 0 and 16384"),
        ({"runner_id": "no spaces"}, "runner_id: use 1-128"),
        ({"pass_env": ["PATH", "AGL_KEY"]}, "pass_env must not name AGL_KEY"),
        ({"env": {"AGL_KEY": "x"}}, "env must not set AGL_KEY"),
        ({"store_url": "gateway:8100"}, "store_url must be http"),
        ({"k8s": {"image": "a:1"}}, "k8s options are set but backend is not 'k8s'"),
        ({"backend": "docker"}, "backend must be one of 'local', 'k8s'"),
        ({"concurency": 2}, "unknown key 'addons.runner.concurency' \\(did you mean 'concurrency'\\?\\)"),
    ],
)
async def test_a_bad_option_stops_start_up_naming_it(
    tmp_path: Path, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        await check_config(config(tmp_path, **options))


async def test_a_local_command_that_cannot_start_stops_start_up(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "agent").write_text("#!/bin/sh\n")  # not executable
    with pytest.raises(ConfigError, match=r"addons.runner.command: 'bin/agent' is not an executable file"):
        await check_config(config(tmp_path, command=["bin/agent"], workdir="."))
    with pytest.raises(ConfigError, match=r"addons.runner.grader_command: 'no-such-grader' is not found"):
        await check_config(config(tmp_path, grader_command=["no-such-grader"]))
    (tmp_path / "bin" / "agent").chmod(0o755)
    await check_config(config(tmp_path, command=["bin/agent"], grader_command=["sh"], workdir="."))


async def test_the_admin_key_is_required(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGL_KEY")
    with pytest.raises(ConfigError, match="admin key is not set: export AGL_KEY"):
        await check_config(config(tmp_path))


async def test_without_a_store_url_the_chain_needs_the_store(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="addon 'runner' needs the service 'store'"):
        await check_config(config(tmp_path, chain=("runner",)))


async def test_agents_run_where_agl_lite_was_started_unless_workdir_says_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "conf").mkdir()
    default = await configured(config(tmp_path / "conf"))
    assert default.runner is not None
    assert default.runner.settings.workdir == tmp_path


async def test_a_preloaded_warm_up_script_is_relative_to_the_config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "conf").mkdir()
    addon = await configured(config(tmp_path / "conf", preload=["openai", "warm/up.py"]))
    assert addon.runner is not None
    assert addon.runner.settings.preload == ("openai", str(tmp_path / "conf" / "warm" / "up.py"))


async def test_the_in_process_runner_uses_the_stores_service_and_the_gateways_url(tmp_path: Path) -> None:
    addon = await configured(config(tmp_path, command=["sh", "agent.sh"], workdir="agents"))
    assert addon.runner is not None
    settings = addon.runner.settings
    assert addon.runner.store is addon._ctx.services.get(STORE)
    assert isinstance(addon.runner.backend, LocalBackend)
    assert settings.public_url == "http://127.0.0.1:0"  # the real port once the gateway has bound
    assert settings.runner_id == "local-" + socket.gethostname().replace(".", "-")
    assert (settings.command, settings.workdir) == (("sh", "agent.sh"), (tmp_path / "agents").resolve())
    assert (settings.timeout_s, settings.grader_timeout_s) == (None, 600.0)


async def test_a_runner_only_process_reaches_the_store_over_http(tmp_path: Path) -> None:
    cfg = config(tmp_path, chain=("runner",), store_url="http://gateway:8100/", runner_id="ctl", timeout_s=9)
    addon = await configured(cfg)
    assert addon.runner is not None
    assert isinstance(addon.runner.store, AglLiteClient)
    assert addon.runner.store.url == "http://gateway:8100"
    assert (addon.runner.settings.public_url, addon.runner.settings.runner_id) == (
        "http://gateway:8100",
        "ctl",
    )
    assert addon.runner.settings.timeout_s == 9.0
    await addon.shutdown()  # never started: stopping is still clean


async def test_the_gateway_starts_and_stops_the_runner(tmp_path: Path) -> None:
    async with running_probe() as probe:
        script = f'sleep {probe.marker} & curl -sf "{probe.url}/started/$AGL_ROLLOUT_ID" >/dev/null; wait'
        cfg = config(tmp_path, command=["/bin/sh", "-c", script], grace_s=0.2)
        async with running_gateway(cfg) as gw:
            store = gw.addons.ctx.services.require(STORE, by="test")
            await store.enqueue([RolloutSpec({"q": 1}, config=RolloutConfig(max_attempts=2), id="ro-1")])
            await probe.wait_started("ro-1")
            pids = marked_pids(probe.marker)
            assert len(pids) >= 2
        for pid in pids:  # stopped with the gateway
            await exited(pid)
    assert (
        await store.get_rollout("ro-1")
    ).status is RolloutStatus.RUNNING  # for the next runner to take back
    (attempt,) = await store.attempts("ro-1")
    assert attempt.status is AttemptStatus.LOST
    assert "the runner stopped" in (attempt.message or "")
