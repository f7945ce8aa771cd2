"""The k8s options table and the per-rollout overrides: checked, with errors that name the key."""

from __future__ import annotations

import pytest

from agl_lite.errors import ConfigError
from agl_lite.runner.k8s.options import K8sOptions, grader_template, job_template, parse_k8s_options

BASE = {"job": {"image": "agent:1.0", "command": ["python", "agent.py"]}}


def test_a_minimal_table_parses_with_defaults() -> None:
    opts = parse_k8s_options(BASE, file="agl-lite.toml")
    assert opts.job.image == "agent:1.0"
    assert opts.job.command == ("python", "agent.py")
    assert opts.namespace == "default"
    assert opts.job.image_pull_policy == "IfNotPresent"


def test_the_image_is_required() -> None:
    with pytest.raises(ConfigError, match=r"k8s\.job\.image is required"):
        parse_k8s_options({}, file="agl-lite.toml")


def test_an_unknown_key_is_named() -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'k8s\.job\.imag'"):
        parse_k8s_options({"job": {"imag": "x"}}, file="agl-lite.toml")


@pytest.mark.parametrize("codes", [[0], [256], [-1]])
def test_exit_codes_outside_1_to_255_are_refused(codes: list[int]) -> None:
    with pytest.raises(ConfigError, match="non_retryable_exit_codes"):
        parse_k8s_options({**BASE, "non_retryable_exit_codes": codes}, file="agl-lite.toml")


@pytest.mark.parametrize("bad", [{"qps": 0}, {"burst": 0}, {"resync_s": 0}, {"result_dir": "rel"}])
def test_bad_limits_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        parse_k8s_options({**BASE, **bad}, file="agl-lite.toml")


def test_a_rollout_overrides_only_the_fields_it_sets() -> None:
    opts = parse_k8s_options({**BASE, "job": {**BASE["job"], "node_selector": {"pool": "cpu"}}}, file="f")
    template = job_template(opts, {"k8s": {"image": "agent:2.0", "args": ["--fast"]}})
    assert template.image == "agent:2.0"
    assert template.args == ("--fast",)
    assert template.command == ("python", "agent.py")
    assert dict(template.node_selector) == {"pool": "cpu"}


def test_no_override_returns_the_configured_template() -> None:
    opts = parse_k8s_options(BASE, file="f")
    assert job_template(opts, {}) is opts.job


@pytest.mark.parametrize("override", [{"imagePullPolicy": "Always"}, {"image_pull_policy": "Sometimes"}, "x"])
def test_a_bad_rollout_override_is_a_config_error(override: object) -> None:
    with pytest.raises(ConfigError, match=r"runner\.k8s"):
        job_template(parse_k8s_options(BASE, file="f"), {"k8s": override})


def test_the_plans_grader_command_wins_over_the_configured_one() -> None:
    opts = parse_k8s_options({**BASE, "grader": {"command": ["configured"]}}, file="f")
    assert grader_template(opts, {}, ("python", "grade.py")).command == ("python", "grade.py")
    assert grader_template(opts, None).command == ("configured",)


def test_a_rollout_overrides_the_grader_image() -> None:
    grader = grader_template(K8sOptions(), {"k8s": {"image": "grader:1"}}, ("grade",))
    assert (grader.command, grader.image) == (("grade",), "grader:1")


def test_a_grading_step_without_any_command_is_refused() -> None:
    with pytest.raises(ConfigError, match="grader command"):
        grader_template(K8sOptions(), {})


def test_a_bad_grader_override_names_its_key() -> None:
    with pytest.raises(ConfigError, match=r"grader\.k8s"):
        grader_template(K8sOptions(), {"k8s": {"bogus": 1}}, ("grade",))
