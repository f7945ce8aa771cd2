"""agl-client against a real gateway (in a thread of its own): each command's output, `--json` that parses, one-line
usage errors with exit 2, a clear exit 3 when the server is unreachable."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner, Result

from agl_lite.client.cli import EXIT_FAILED, EXIT_UNREACHABLE, EXIT_USAGE, app
from agl_lite.store.records import RolloutStatus
from agl_lite.store.rules import EventSpec
from tests.client.conftest import BackgroundGateway, finished, make_call, running

runner = CliRunner()


def cli(gw: BackgroundGateway, *args: str, stdin: str | None = None) -> Result:
    return runner.invoke(app, ["--url", gw.url, "--retries", "0", *args], input=stdin)


def as_json(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return orjson.loads(result.stdout)


def one_line_error(result: Result) -> str:
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_health(background_gateway: BackgroundGateway) -> None:
    result = cli(background_gateway, "health")
    assert (result.exit_code, result.stdout.split()[:2]) == (0, ["ok", background_gateway.url])
    assert as_json(cli(background_gateway, "health", "--json"))["status"] == "ok"


def test_rollouts_add_prints_ids_table_or_json(background_gateway: BackgroundGateway) -> None:
    quiet = cli(background_gateway, "rollouts", "add", "-i", '{"q": 1}', "-n", "2", "-q")
    ids = quiet.stdout.split()
    assert (quiet.exit_code, len(ids)) == (0, 2)
    created = as_json(
        cli(background_gateway, "rollouts", "add", "-i", '{"q": 2}', "--metadata", '{"a": 1}', "--json")
    )
    assert [(r["input"], r["metadata"], r["status"]) for r in created] == [({"q": 2}, {"a": 1}, "queuing")]
    table = cli(background_gateway, "rollouts", "add", "-i", '{"q": 3}', "--mode", "val")
    assert "queuing" in table.stdout
    assert "val" in table.stdout


def test_rollouts_add_from_a_jsonl_file(background_gateway: BackgroundGateway, tmp_path: Path) -> None:
    (tmp_path / "tasks.jsonl").write_text('{"q": 1}\n\n{"q": 2}\n')
    created = as_json(
        cli(background_gateway, "rollouts", "add", "-f", str(tmp_path / "tasks.jsonl"), "--json")
    )
    assert [r["input"] for r in created] == [{"q": 1}, {"q": 2}]


def test_rollouts_ls_filters(background_gateway: BackgroundGateway) -> None:
    background_gateway.run(finished(background_gateway.store, "done-1"))
    background_gateway.run(running(background_gateway.store, "run-1"))
    listed = as_json(cli(background_gateway, "rollouts", "ls", "--status", "running", "--json"))
    assert [r["id"] for r in listed] == ["run-1"]
    table = cli(background_gateway, "rollouts", "ls")
    assert "done-1" in table.stdout
    assert "run-1" in table.stdout
    assert len(as_json(cli(background_gateway, "rollouts", "ls", "--limit", "1", "--json"))) == 1
    background_gateway.run(background_gateway.store.add_events("run-1", [EventSpec("reward", 0.5)]))
    rewarded = as_json(cli(background_gateway, "rollouts", "ls", "--reward-min", "0.25", "--json"))
    assert [r["id"] for r in rewarded] == ["run-1"]
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(rewarded[0]["created_at"] + 3600))
    assert as_json(cli(background_gateway, "rollouts", "ls", "--since", since, "--json")) == []
    assert len(as_json(cli(background_gateway, "rollouts", "ls", "--until", since, "--json"))) == 2


def test_rollouts_show_with_attempts(background_gateway: BackgroundGateway) -> None:
    gw = background_gateway
    gw.run(running(gw.store, "r1"))
    gw.run(gw.store.start_attempt("r1", "pod-1"))
    shown = as_json(cli(gw, "rollouts", "show", "r1", "--json"))
    assert (shown["id"], [a["id"] for a in shown["attempts"]]) == ("r1", ["pod-1"])
    table = cli(gw, "rollouts", "show", "r1")
    assert "pod-1" in table.stdout
    assert "running" in table.stdout


def test_rollouts_cancel_then_again_fails_with_one_line(background_gateway: BackgroundGateway) -> None:
    background_gateway.run(running(background_gateway.store, "r1"))
    assert cli(background_gateway, "rollouts", "cancel", "r1").stdout.strip() == "r1: cancelled"
    again = cli(background_gateway, "rollouts", "cancel", "r1")
    assert again.exit_code == EXIT_FAILED
    assert "conflict (409)" in one_line_error(again)


def test_rollouts_wait_for_terminal_rollouts(background_gateway: BackgroundGateway) -> None:
    background_gateway.run(finished(background_gateway.store, "a", "b", status=RolloutStatus.FAILED))
    result = cli(background_gateway, "rollouts", "wait", "a", "b", "--timeout", "10")
    assert (result.exit_code, result.stdout.strip()) == (0, "2/2 terminal: 2 failed (cursor 2)")
    from_stdin = as_json(cli(background_gateway, "rollouts", "wait", "-", "--json", stdin="a\nb\n"))
    assert ([r["id"] for r in from_stdin["rollouts"]], from_stdin["pending"]) == (["a", "b"], [])


def test_rollouts_wait_timeout_exits_1(background_gateway: BackgroundGateway) -> None:
    background_gateway.run(running(background_gateway.store, "slow"))
    result = cli(background_gateway, "rollouts", "wait", "slow", "--timeout", "0.1")
    assert result.exit_code == EXIT_FAILED
    assert "still pending after 0.1 s: slow" in result.stderr


def test_events_ls_and_tail(background_gateway: BackgroundGateway) -> None:
    gw = background_gateway
    gw.run(running(gw.store, "r1"))
    gw.run(gw.store.add_events("r1", [EventSpec("note", {"k": 1}), EventSpec("reward", {"value": 1.0})]))
    listed = as_json(cli(gw, "events", "ls", "r1", "--kind", "reward", "--json"))
    assert [(e["seq"], e["data"]) for e in listed] == [(2, {"value": 1.0})]
    assert "note" in cli(gw, "events", "ls", "r1").stdout
    gw.run(gw.store.finish("r1", RolloutStatus.SUCCEEDED))
    tail = cli(gw, "events", "tail", "r1", "--json", "--interval", "0.01")
    assert [orjson.loads(line)["kind"] for line in tail.stdout.splitlines()] == ["note", "reward"]


def test_models_set_and_ls(background_gateway: BackgroundGateway) -> None:
    set_ = cli(
        background_gateway, "models", "set", "qwen", "--version", "step-3", "-e", "http://10.0.0.5:8000/v1"
    )
    assert set_.stdout.strip() == "qwen: version step-3"
    assert [
        (m["name"], m["version"]) for m in as_json(cli(background_gateway, "models", "ls", "--json"))
    ] == [("qwen", "step-3")]
    assert "step-3" in cli(background_gateway, "models", "ls").stdout


def test_gateway_pause_status_resume(background_gateway: BackgroundGateway) -> None:
    paused = as_json(
        cli(background_gateway, "gateway", "pause", "--mode", "reject", "--drain", "1", "--json")
    )
    assert (paused["paused"], paused["mode"], paused["in_flight"]) == (True, "reject", 0)
    assert "reject" in cli(background_gateway, "gateway", "status").stdout
    assert as_json(cli(background_gateway, "gateway", "resume", "--json"))["paused"] is False
    assert as_json(cli(background_gateway, "gateway", "status", "--json"))["paused"] is False


def test_export_writes_jsonl_and_a_summary(background_gateway: BackgroundGateway, tmp_path: Path) -> None:
    gw = background_gateway
    gw.run(running(gw.store, "r1"))
    gw.run(gw.store.add_call(make_call("r1", "a1", 0, [1, 2], [[3, 4]])))
    gw.run(gw.store.finish("r1", RolloutStatus.SUCCEEDED))
    summary = as_json(cli(gw, "export", str(tmp_path / "out.jsonl"), "--json"))
    assert (summary["rows"], summary["rollouts"], summary["format"]) == (1, 1, "jsonl")
    (row,) = [orjson.loads(line) for line in (tmp_path / "out.jsonl").read_bytes().splitlines()]
    assert (row["prompt_ids"], row["response_ids"]) == ([1, 2], [3, 4])


def test_export_rows_trajectories_writes_the_merged_rows(
    background_gateway: BackgroundGateway, tmp_path: Path
) -> None:
    gw = background_gateway
    gw.run(running(gw.store, "r1"))
    gw.run(gw.store.add_call(make_call("r1", "a1", 0, [1, 2], [[3, 4]])))
    gw.run(gw.store.add_call(make_call("r1", "a1", 1, [1, 2, 3, 4, 9], [[5]])))
    gw.run(gw.store.finish("r1", RolloutStatus.SUCCEEDED))
    out = tmp_path / "rows.jsonl"
    summary = as_json(cli(gw, "export", str(out), "--rows", "trajectories", "--json"))
    assert (summary["rows"], summary["rollouts"], summary["groups"]) == (1, 1, 1)
    (row,) = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert (row["prompt_ids"], row["response_ids"], row["response_mask"]) == (
        [1, 2],
        [3, 4, 9, 5],
        [1, 1, 0, 1],
    )


def test_rollouts_calls_and_trajectory_show_one_rollout(background_gateway: BackgroundGateway) -> None:
    gw = background_gateway
    gw.run(running(gw.store, "r1"))
    gw.run(gw.store.add_call(make_call("r1", "a1", 0, [1, 2], [[3, 4]])))
    gw.run(gw.store.add_call(make_call("r1", "a1", 1, [1, 2, 3, 4, 9], [[5]])))
    gw.run(gw.store.finish("r1", RolloutStatus.SUCCEEDED))
    calls = as_json(cli(gw, "rollouts", "calls", "r1", "--json"))
    assert [c["response_id"] for c in calls] == ["chatcmpl-r1-0", "chatcmpl-r1-1"]
    table = cli(gw, "rollouts", "calls", "r1")
    assert table.exit_code == 0
    assert "chatcmpl" not in table.output  # the table: counts and text, not the ids
    assert table.output.count(" ok ") == 2
    (row,) = as_json(cli(gw, "rollouts", "trajectory", "r1", "--json"))["rows"]
    assert (row["prompt_ids"], row["response_ids"], row["response_mask"]) == (
        [1, 2],
        [3, 4, 9, 5],
        [1, 1, 0, 1],
    )
    assert row["calls"] == ["chatcmpl-r1-0", "chatcmpl-r1-1"]
    unknown = cli(gw, "rollouts", "calls", "nope")
    assert unknown.exit_code != 0
    assert "nope" in unknown.output


@pytest.mark.parametrize(
    "args",
    [
        ["rollouts", "ls", "--limit", "x"],
        ["rollouts", "ls", "--status", "sleeping"],
        ["rollouts", "add"],
        ["rollouts", "add", "-i", "{not json"],
        ["rollouts", "add", "-i", "1", "--metadata", "[1]"],
        ["rollouts", "show"],
        ["rollouts", "wait"],
        ["gateway", "pause", "--mode", "sideways"],
        ["export", "out.csv", "--format", "csv"],
        ["models", "set", "m", "--version", "1"],
        ["no-such-command"],
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(
    background_gateway: BackgroundGateway, args: list[str]
) -> None:
    result = cli(background_gateway, *args)
    assert result.exit_code == EXIT_USAGE
    assert one_line_error(result).startswith("agl-client: error: ")


def test_a_request_the_server_refuses_as_invalid_exits_2(background_gateway: BackgroundGateway) -> None:
    result = cli(background_gateway, "rollouts", "add", "-i", "1", "--mode", "Bad Mode")
    assert result.exit_code == EXIT_USAGE
    assert "invalid_request (400)" in one_line_error(result)


@pytest.mark.parametrize("args", [["health"], ["rollouts", "ls", "--json"], ["export", "out.jsonl"]])
def test_an_unreachable_server_is_a_clear_message_and_exit_3(
    args: list[str], unused_tcp_port: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["--url", f"http://127.0.0.1:{unused_tcp_port}", "--retries", "0", *args])
    assert result.exit_code == EXIT_UNREACHABLE
    assert "cannot reach" in one_line_error(result)
    assert "is the gateway running?" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_no_key_is_a_usage_error(
    background_gateway: BackgroundGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AGL_KEY")
    result = cli(background_gateway, "models", "ls")
    assert result.exit_code == EXIT_USAGE
    assert one_line_error(result) == "agl-client: no admin key: set AGL_KEY or pass --key"


def test_a_wrong_key_fails_with_a_hint(background_gateway: BackgroundGateway) -> None:
    result = cli(background_gateway, "--key", "wrong", "models", "ls")
    assert result.exit_code == EXIT_FAILED
    assert "check AGL_KEY" in one_line_error(result)


def test_an_invalid_url_is_a_usage_error() -> None:
    result = runner.invoke(app, ["--url", "localhost:8100", "models", "ls"])
    assert result.exit_code == EXIT_USAGE
    assert "invalid gateway URL" in one_line_error(result)


def commands() -> list[list[str]]:
    from typer.main import get_command

    root = get_command(app)
    out = []
    for name, command in root.commands.items():  # type: ignore[attr-defined]
        subs = getattr(command, "commands", None)
        out += [[name, sub] for sub in subs] if subs else [[name]]
    return out


@pytest.mark.parametrize("command", commands(), ids=" ".join)
def test_every_command_explains_itself_with_an_example(command: list[str]) -> None:
    result = runner.invoke(app, [*command, "--help"])
    assert result.exit_code == 0
    assert "Example: agl-client" in result.stdout


def test_export_into_a_missing_directory_is_one_line_exit_1(
    background_gateway: BackgroundGateway, tmp_path: Path
) -> None:
    result = cli(background_gateway, "export", str(tmp_path / "nope" / "out.jsonl"))
    assert result.exit_code == EXIT_FAILED
    assert "No such file or directory" in one_line_error(result)


def test_parquet_without_pyarrow_names_the_extra(
    background_gateway: BackgroundGateway, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    (tmp_path / "out").mkdir()
    result = cli(background_gateway, "export", str(tmp_path / "out" / "calls.parquet"))
    assert result.exit_code == EXIT_FAILED
    assert "pip install 'agl-lite[parquet]'" in one_line_error(result)
    assert list((tmp_path / "out").iterdir()) == []


def test_version() -> None:
    from agl_lite import __version__

    assert runner.invoke(app, ["version"]).stdout.strip() == __version__
