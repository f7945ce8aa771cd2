from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from agl_lite import __version__
from agl_lite.cli import app
from agl_lite.core.keys import KeyRole, Principal, identify
from tests.conftest import ADMIN_KEY

runner = CliRunner()


def valid_config(tmp_path: Path) -> Path:
    (tmp_path / "routes.toml").write_text('[models.m]\nupstreams = [{ base_url = "http://127.0.0.1:8000/v1" }]\n')
    path = tmp_path / "agl-lite.toml"
    path.write_text("[server]\nport = 8123\n")
    return path


def test_check_config_accepts_a_valid_config(tmp_path: Path) -> None:
    result = runner.invoke(app, ["check-config", str(valid_config(tmp_path))])
    assert result.exit_code == 0, result.output
    assert "ok" in result.output
    assert "auth -> route" in result.output


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
