"""One rollout's run settings: the runner's, overridden by what the rollout's config says. Pure functions.

A rollout may set `config.timeout_s`, `config.max_attempts`, `config.runner.command` (argv list, or a string
split like a shell would), `config.runner.env` (extra env) and `config.grader` (`{"command": ...}`, or `{}` for the
runner's grader command). Other keys of `config.runner` belong to backends (`k8s`) and are passed on untouched.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from agl_lite.runner.seams import Plan, RunnerSettings
from agl_lite.store.records import Rollout

__all__ = ["PlanError", "resolve"]


class PlanError(ValueError):
    """A rollout's runner overrides are invalid; the rollout fails with this message (no attempt can help)."""


def _command(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        try:
            argv = shlex.split(value)
        except ValueError as exc:
            raise PlanError(f"{where}: cannot split {value!r}: {exc}") from None
    elif isinstance(value, list | tuple) and all(isinstance(a, str) for a in value):
        argv = list(value)
    else:
        raise PlanError(f"{where} must be a list of strings or a string, got {type(value).__name__}")
    if not argv:
        raise PlanError(f"{where} is empty")
    return tuple(argv)


def _env(value: Any, where: str) -> dict[str, str]:
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and k and isinstance(v, str) for k, v in value.items()
    ):
        raise PlanError(f"{where} must be a table of string values")
    if "AGL_KEY" in value:
        raise PlanError(f"{where} must not set AGL_KEY: agents never get the admin key")
    return dict(value)


def resolve(settings: RunnerSettings, rollout: Rollout) -> Plan:
    """The plan for `rollout`; PlanError when its overrides are malformed."""
    config = rollout.config
    overrides: Mapping[str, Any] = config.runner or {}
    command = (
        _command(overrides["command"], "config.runner.command")
        if overrides.get("command") is not None
        else settings.command
    )
    env = dict(settings.env)
    if overrides.get("env") is not None:
        env.update(_env(overrides["env"], "config.runner.env"))
    grader = config.grader
    if grader is not None and not isinstance(grader, Mapping):
        raise PlanError("config.grader must be a table")
    grader_command = settings.grader_command
    if grader is not None and grader.get("command") is not None:
        grader_command = _command(grader["command"], "config.grader.command")
    max_attempts = config.max_attempts
    if settings.max_attempts > 0:
        max_attempts = min(max_attempts, settings.max_attempts)
    return Plan(
        command=command,
        timeout_s=config.timeout_s or settings.timeout_s,
        max_attempts=max(1, max_attempts),
        grading=grader is not None or bool(settings.grader_command),
        grader_command=grader_command,
        grader_timeout_s=settings.grader_timeout_s,
        env=env,
        overrides=overrides,
        grader=grader,
    )
