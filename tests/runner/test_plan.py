"""A rollout's config overrides the runner's settings; malformed overrides are a clear error."""

from __future__ import annotations

from typing import Any

import pytest

from agl_lite.runner.plan import PlanError, resolve
from agl_lite.runner.seams import RunnerSettings
from agl_lite.store.records import Rollout, RolloutConfig

SETTINGS = RunnerSettings(
    runner_id="r1",
    public_url="http://gw",
    command=("python", "agent.py"),
    timeout_s=60.0,
    env={"A": "runner", "B": "runner"},
    grader_timeout_s=30.0,
)


def plan_for(settings: RunnerSettings = SETTINGS, **config: Any) -> Any:
    return resolve(settings, Rollout("ro-1", {}, config=RolloutConfig(**config)))


def test_without_overrides_the_runners_settings_apply() -> None:
    plan = plan_for()
    assert (plan.command, plan.timeout_s, plan.max_attempts) == (("python", "agent.py"), 60.0, 1)
    assert (plan.grading, plan.grader_command, plan.grader) == (False, (), None)
    assert plan.env == {"A": "runner", "B": "runner"}


def test_the_rollouts_command_timeout_and_env_win() -> None:
    plan = plan_for(timeout_s=5.0, runner={"command": ["sh", "x y.sh"], "env": {"B": "rollout", "C": "c"}})
    assert (plan.command, plan.timeout_s) == (("sh", "x y.sh"), 5.0)
    assert plan.env == {"A": "runner", "B": "rollout", "C": "c"}


def test_a_command_string_is_split_like_a_shell_would() -> None:
    assert plan_for(runner={"command": "python 'my agent.py' --fast"}).command == (
        "python",
        "my agent.py",
        "--fast",
    )


def test_backend_specific_overrides_are_passed_on() -> None:
    assert plan_for(runner={"k8s": {"image": "a:1"}}).overrides == {"k8s": {"image": "a:1"}}


def test_the_runners_max_attempts_caps_the_rollouts() -> None:
    assert plan_for(max_attempts=5).max_attempts == 5
    capped = RunnerSettings(runner_id="r", public_url="u", max_attempts=2)
    assert plan_for(capped, max_attempts=5).max_attempts == 2
    assert plan_for(capped, max_attempts=1).max_attempts == 1


def test_a_grading_step_comes_from_the_rollout_or_the_runner() -> None:
    own = plan_for(grader={"command": ["grade"]})
    assert (own.grading, own.grader_command, own.grader_timeout_s) == (True, ("grade",), 30.0)
    runner_wide = RunnerSettings(runner_id="r", public_url="u", grader_command=("check",))
    assert (plan_for(runner_wide).grading, plan_for(runner_wide).grader_command) == (True, ("check",))
    assert plan_for(runner_wide, grader={}).grader_command == ("check",)
    assert plan_for(grader={}).grader_command == ()  # graded, but no command: the local backend says so


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"runner": {"command": 5}}, "config.runner.command must be a list of strings or a string"),
        ({"runner": {"command": ["a", 1]}}, "config.runner.command must be a list of strings"),
        ({"runner": {"command": []}}, "config.runner.command is empty"),
        ({"runner": {"command": "a 'b"}}, "config.runner.command: cannot split"),
        ({"runner": {"env": {"A": 1}}}, "config.runner.env must be a table of string values"),
        ({"runner": {"env": ["A"]}}, "config.runner.env must be a table of string values"),
        ({"runner": {"env": {"AGL_KEY": "x"}}}, "must not set AGL_KEY"),
        ({"grader": {"command": 3}}, "config.grader.command must be a list of strings"),
    ],
)
def test_malformed_overrides_are_a_plan_error_naming_the_key(config: dict[str, Any], message: str) -> None:
    with pytest.raises(PlanError, match=message.replace("(", r"\(")):
        plan_for(**config)
