"""SWE-bench JSONL → rollouts: what the agent may see goes into the task input, what grades it into the metadata.

SWE-bench rows (the dataset's JSONL export; `FAIL_TO_PASS`/`PASS_TO_PASS` are JSON-encoded lists there, plain
lists are accepted too) carry the gold patch and the tests that decide the verdict. The agent must see neither:
its task input is the instance id, the repository, the base commit and the problem statement; the test patch,
the test names and the test command sit in the rollout's metadata, which agent keys cannot read and the grading
step reads with its grader key. Bad rows stop the load with the line number and the field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agl_lite.store.records import RolloutConfig
from agl_lite.store.rules import RolloutSpec

__all__ = [
    "DEFAULT_TEST_CMD",
    "Instance",
    "TaskOptions",
    "image_key",
    "instance_image",
    "load_instances",
    "rollout_spec",
]

DEFAULT_TEST_CMD = "python -m pytest -rA -p no:cacheprovider"
"""The grader appends the test files to this and reads pytest's `-rA` summary (SWE-bench's pytest log format)."""
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True, slots=True)
class Instance:
    instance_id: str
    repo: str
    base_commit: str
    problem_statement: str
    test_patch: str
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    version: str = ""
    patch: str = ""
    """The gold patch: kept for reference, never given to the agent or the grader."""


@dataclass(frozen=True, slots=True)
class TaskOptions:
    """How an instance becomes a rollout where it runs (local clones, or one image per instance on Kubernetes)."""

    repos: Path | None = None
    """Local runs: the clone of `owner/name` is `repos/owner/name` (what `tiny_repo.py` builds); None: the agent and
    the grader use the checkout their image has (`SWE_TESTBED`, `/testbed` in SWE-bench's images)."""
    test_cmd: str = DEFAULT_TEST_CMD
    """Shell command the grader runs the tests with, in the clean checkout, the test files appended."""
    image_template: str = ""
    """Kubernetes: the per-instance image, `{key}` being SWE-bench's image key (see `image_key`) and
    `{instance_id}` the id as it is; empty: the controller's configured image."""
    timeout_s: float | None = None
    max_attempts: int = 1


def _field(row: dict[str, Any], name: str, where: str) -> str:
    value = row.get(name)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}: `{name}` must be a non-empty string")
    return value


def _tests(row: dict[str, Any], name: str, where: str) -> tuple[str, ...]:
    value = row.get(name, [])
    if isinstance(value, str):  # the dataset's export stores these lists as JSON text
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ValueError(f"{where}: `{name}` is neither a list nor a JSON list ({exc})") from exc
    if not isinstance(value, list) or not all(isinstance(t, str) and t for t in value):
        raise ValueError(f"{where}: `{name}` must be a list of test names")
    return tuple(value)


def parse_instance(row: Any, where: str) -> Instance:
    if not isinstance(row, dict):
        raise ValueError(f"{where}: not a JSON object")
    commit = _field(row, "base_commit", where)
    if not _COMMIT.match(commit):
        raise ValueError(f"{where}: `base_commit` must be a full 40-character commit id, got {commit!r}")
    instance = Instance(
        instance_id=_field(row, "instance_id", where),
        repo=_field(row, "repo", where),
        base_commit=commit,
        problem_statement=_field(row, "problem_statement", where),
        test_patch=_field(row, "test_patch", where),
        fail_to_pass=_tests(row, "FAIL_TO_PASS", where),
        pass_to_pass=_tests(row, "PASS_TO_PASS", where),
        version=str(row.get("version") or ""),
        patch=str(row.get("patch") or ""),
    )
    if not instance.fail_to_pass:
        raise ValueError(f"{where}: `FAIL_TO_PASS` is empty: nothing would tell a fix from no change")
    return instance


def load_instances(path: Path, *, ids: Iterable[str] | None = None, limit: int = 0) -> list[Instance]:
    """The instances of a SWE-bench JSONL file, in file order: only `ids` when given, at most `limit` (0: all)."""
    wanted = set(ids) if ids is not None else None
    out: list[Instance] = []
    seen: set[str] = set()
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise ValueError(f"{where}: not JSON ({exc})") from exc
            instance = parse_instance(row, where)
            if instance.instance_id in seen:
                raise ValueError(f"{where}: instance {instance.instance_id!r} appears twice")
            seen.add(instance.instance_id)
            if wanted is None or instance.instance_id in wanted:
                out.append(instance)
            if limit and len(out) == limit:
                break
    if wanted is not None and (missing := wanted - {i.instance_id for i in out}):
        raise ValueError(f"{path}: no instance {sorted(missing)}")
    return out


def image_key(instance_id: str) -> str:
    """SWE-bench's image naming: `django__django-11099` → `django_1776_django-11099` (`__` is not allowed in an
    image name), lower case."""
    return instance_id.replace("__", "_1776_").lower()


def instance_image(instance_id: str, template: str) -> str:
    image = template.format(key=image_key(instance_id), instance_id=instance_id)
    if image.endswith(":latest") or ":" not in image.rsplit("/", 1)[-1]:
        raise ValueError(
            f"image {image!r}: give a tag that is not `latest` (IfNotPresent would never refresh it)"
        )
    return image


def rollout_spec(instance: Instance, options: TaskOptions, *, group_id: str | None = None) -> RolloutSpec:
    """One rollout of `instance`: graded (the runner's grader command unless the config names one)."""
    task: dict[str, Any] = {
        "instance_id": instance.instance_id,
        "repo": instance.repo,
        "base_commit": instance.base_commit,
        "problem_statement": instance.problem_statement,
    }
    metadata: dict[str, Any] = {
        "instance_id": instance.instance_id,
        "repo": instance.repo,
        "base_commit": instance.base_commit,
        "version": instance.version,
        "test_patch": instance.test_patch,
        "FAIL_TO_PASS": list(instance.fail_to_pass),
        "PASS_TO_PASS": list(instance.pass_to_pass),
        "test_cmd": options.test_cmd,
    }
    if options.repos is not None:
        url = str((options.repos / instance.repo).resolve())
        task["repo_url"] = metadata["repo_url"] = url
    runner: dict[str, Any] = {}
    grader: dict[str, Any] = {}
    if options.image_template:
        image = instance_image(instance.instance_id, options.image_template)
        runner["k8s"] = {"image": image}
        grader["k8s"] = {
            "image": image
        }  # the grader needs the instance's environment too, in a pristine copy
    config = RolloutConfig(
        max_attempts=options.max_attempts, timeout_s=options.timeout_s, runner=runner, grader=grader
    )
    return RolloutSpec(input=task, config=config, metadata=metadata, group_id=group_id)


def rollout_specs(
    instances: Sequence[Instance], options: TaskOptions, *, samples: int = 1, tag: str = ""
) -> list[RolloutSpec]:
    """`samples` rollouts per instance, sharing a group id (GRPO groups: one per instance and iteration)."""
    return [
        rollout_spec(instance, options, group_id=f"{instance.instance_id}{tag}")
        for instance in instances
        for _ in range(samples)
    ]
