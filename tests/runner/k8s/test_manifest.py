"""The Job and Secret of a rollout: the spec the controller relies on, keys only through the Secret, the env the
agent ends up with after the kubelet's `$(VAR)` expansion."""

from __future__ import annotations

import base64
import dataclasses
import json
import re
from typing import Any

import pytest

from agl_lite.core.contract import KeyRole, agent_env, derive_key, grader_env
from agl_lite.runner.k8s.manifest import LaunchSpec, build_job, build_secret, launch_spec
from agl_lite.runner.k8s.options import GraderTemplate, grader_template, parse_k8s_options
from agl_lite.store.records import Rollout, RolloutConfig

ADMIN = "admin-key-for-manifest-tests"
PUBLIC = "http://gateway.test:8100"
OPTIONS = parse_k8s_options(
    {
        "namespace": "agents",
        "non_retryable_exit_codes": [3, 2],
        "job": {
            "image": "agent:1.0",
            "command": ["python", "agent.py"],
            "resources": {"limits": {"memory": "1Gi"}},
            "service_account_name": "agent",
            "node_selector": {"pool": "cpu"},
            "tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}],
            "env": {"EXTRA": "$(OPENAI_BASE_URL)", "OPENAI_API_KEY": "must-not-win"},
        },
    },
    file="test",
)


def spec_for(
    rollout_id: str = "ro-1",
    *,
    task: Any = None,
    max_attempts: int = 3,
    timeout_s: float | None = 30,
    grader: GraderTemplate | None = None,
) -> LaunchSpec:
    rollout = Rollout(rollout_id, task or {"q": "2+2"}, config=RolloutConfig(max_attempts=max_attempts))
    return LaunchSpec(
        rollout_id=rollout_id,
        max_attempts=max_attempts,
        timeout_s=timeout_s,
        env=agent_env(PUBLIC, ADMIN, rollout, "$(AGL_ATTEMPT_ID)"),
        grader_env=grader_env(PUBLIC, ADMIN, rollout, "$(AGL_ATTEMPT_ID)") if grader else None,
        grader=grader,
    )


def expand(entries: list[dict[str, Any]], secret: dict[str, Any], uid: str) -> dict[str, str]:
    """The kubelet's rules: `$(VAR)` of an EARLIER entry is replaced, `$$` is a literal `$`, others stay."""
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    env: dict[str, str] = {}
    for entry in entries:
        ref = entry.get("valueFrom", {})
        if "fieldRef" in ref:
            assert ref["fieldRef"]["fieldPath"] == "metadata.uid"
            env[entry["name"]] = uid
        elif "secretKeyRef" in ref:
            assert ref["secretKeyRef"]["name"] == secret["metadata"]["name"]
            env[entry["name"]] = data[ref["secretKeyRef"]["key"]]
        else:

            def sub(m: re.Match[str]) -> str:
                if m.group(0) == "$$":
                    return "$"
                return env.get(m.group(1), m.group(0))

            env[entry["name"]] = re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", sub, entry["value"])
    return env


def containers(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    pod = job["spec"]["template"]["spec"]
    return {c["name"]: c for c in pod.get("initContainers", []) + pod["containers"]}


def test_one_job_per_rollout_with_a_deterministic_name_and_our_labels() -> None:
    job = build_job(spec_for("ro-1"), OPTIONS)
    meta = job["metadata"]
    assert (meta["name"], meta["namespace"]) == ("agl-ro-1", "agents")
    assert meta["labels"]["app.kubernetes.io/managed-by"] == "agl-lite"
    assert meta["labels"]["agl-lite/rollout"] == "ro-1"
    assert meta["annotations"]["agl-lite/rollout-id"] == "ro-1"
    pod_meta = job["spec"]["template"]["metadata"]
    assert pod_meta["labels"]["app.kubernetes.io/managed-by"] == "agl-lite"
    assert pod_meta["annotations"]["agl-lite/rollout-id"] == "ro-1"


def test_an_awkward_rollout_id_rides_exactly_in_the_annotation() -> None:
    job = build_job(spec_for("Ro_" + "x" * 100), OPTIONS)
    assert job["metadata"]["annotations"]["agl-lite/rollout-id"] == "Ro_" + "x" * 100
    assert len(job["metadata"]["name"]) <= 63


def test_retries_are_the_jobs() -> None:
    spec = build_job(spec_for(max_attempts=3), OPTIONS)["spec"]
    assert spec["backoffLimit"] == 2
    assert spec["template"]["spec"]["restartPolicy"] == "Never"
    assert spec["ttlSecondsAfterFinished"] == OPTIONS.ttl_seconds_after_finished


def test_disruptions_are_ignored_before_non_retryable_codes_fail_the_job() -> None:
    rules = build_job(spec_for(), OPTIONS)["spec"]["podFailurePolicy"]["rules"]
    assert rules[0] == {
        "action": "Ignore",
        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
    }
    assert rules[1]["action"] == "FailJob"
    assert rules[1]["onExitCodes"] == {"containerName": "agent", "operator": "In", "values": [2, 3]}


def test_without_non_retryable_codes_only_the_disruption_rule_is_left() -> None:
    opts = parse_k8s_options({"job": {"image": "a:1"}}, file="t")
    rules = build_job(spec_for(), opts)["spec"]["podFailurePolicy"]["rules"]
    assert [r["action"] for r in rules] == ["Ignore"]


def test_deadlines_per_attempt_on_the_pod_and_for_all_attempts_on_the_job() -> None:
    spec = build_job(spec_for(max_attempts=2, timeout_s=4.2), OPTIONS)["spec"]
    assert spec["template"]["spec"]["activeDeadlineSeconds"] == 5
    assert spec["activeDeadlineSeconds"] == 10
    no_timeout = build_job(spec_for(timeout_s=None), OPTIONS)["spec"]
    assert "activeDeadlineSeconds" not in no_timeout
    assert "activeDeadlineSeconds" not in no_timeout["template"]["spec"]


def test_the_attempt_id_comes_first_from_the_pod_uid() -> None:
    env = containers(build_job(spec_for(), OPTIONS))["agent"]["env"]
    assert env[0] == {
        "name": "AGL_ATTEMPT_ID",
        "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.uid"}},
    }
    assert [e["name"] for e in env].count("AGL_ATTEMPT_ID") == 1


def test_no_key_is_a_literal_anywhere_in_the_job() -> None:
    text = json.dumps(build_job(spec_for(grader=GraderTemplate(command=("grade",))), OPTIONS))
    assert derive_key(ADMIN, "ro-1", KeyRole.AGENT) not in text
    assert derive_key(ADMIN, "ro-1", KeyRole.GRADER) not in text
    assert ADMIN not in text


def test_the_agent_sees_the_contract_with_its_pod_uid() -> None:
    spec = spec_for(task={"cmd": "echo $HOME $(whoami) $$"})
    job, secret = build_job(spec, OPTIONS), build_secret(spec, OPTIONS)
    seen = expand(containers(job)["agent"]["env"], secret, uid="0f1e-uid")
    rollout = Rollout("ro-1", {"cmd": "echo $HOME $(whoami) $$"})
    assert {k: seen[k] for k in spec.env} == agent_env(PUBLIC, ADMIN, rollout, "0f1e-uid")
    assert seen["OPENAI_BASE_URL"] == f"{PUBLIC}/r/ro-1/a/0f1e-uid/v1"
    assert json.loads(seen["AGL_TASK_INPUT"]) == {"cmd": "echo $HOME $(whoami) $$"}


def test_operator_env_comes_after_ours_and_never_replaces_it() -> None:
    spec = spec_for()
    seen = expand(containers(build_job(spec, OPTIONS))["agent"]["env"], build_secret(spec, OPTIONS), uid="u1")
    assert seen["EXTRA"] == f"{PUBLIC}/r/ro-1/a/u1/v1"
    assert seen["OPENAI_API_KEY"] == derive_key(ADMIN, "ro-1", KeyRole.AGENT)


def test_a_large_task_goes_through_the_task_url() -> None:
    spec = spec_for(task={"blob": "x" * 70_000})
    seen = expand(containers(build_job(spec, OPTIONS))["agent"]["env"], build_secret(spec, OPTIONS), "u2")
    assert "AGL_TASK_INPUT" not in seen
    assert seen["AGL_TASK_URL"] == f"{PUBLIC}/r/ro-1/a/u2/task"


def test_the_template_fields_reach_the_pod() -> None:
    job = build_job(spec_for(), OPTIONS)
    pod = job["spec"]["template"]["spec"]
    agent = containers(job)["agent"]
    assert (agent["image"], agent["command"], agent["imagePullPolicy"]) == (
        "agent:1.0",
        ["python", "agent.py"],
        "IfNotPresent",
    )
    assert agent["resources"] == {"limits": {"memory": "1Gi"}}
    assert pod["serviceAccountName"] == "agent"
    assert pod["nodeSelector"] == {"pool": "cpu"}
    assert pod["tolerations"] == [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["automountServiceAccountToken"] is False
    assert pod["enableServiceLinks"] is False


def test_grading_runs_the_agent_as_init_container_and_the_grader_as_main() -> None:
    grader = grader_template(OPTIONS, {}, ("sh", "-c", "python grade.py"))
    spec = spec_for(grader=grader)
    job, secret = build_job(spec, OPTIONS), build_secret(spec, OPTIONS)
    pod = job["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["agent"]
    assert [c["name"] for c in pod["containers"]] == ["grader"]
    assert pod["volumes"] == [{"name": "agl-result", "emptyDir": {}}]
    by_name = containers(job)
    for c in by_name.values():
        assert c["volumeMounts"] == [{"name": "agl-result", "mountPath": OPTIONS.result_dir}]
    assert by_name["grader"]["command"] == ["sh", "-c", "python grade.py"]
    assert by_name["grader"]["image"] == "agent:1.0"
    agent_seen = expand(by_name["agent"]["env"], secret, "u3")
    grader_seen = expand(by_name["grader"]["env"], secret, "u3")
    assert "AGL_GRADER_KEY" not in agent_seen
    assert derive_key(ADMIN, "ro-1", KeyRole.GRADER) not in agent_seen.values()
    assert grader_seen["AGL_GRADER_KEY"] == derive_key(ADMIN, "ro-1", KeyRole.GRADER)
    assert grader_seen["AGL_GRADE_URL"] == f"{PUBLIC}/r/ro-1/a/u3/grade"
    assert agent_seen["AGL_RESULT_DIR"] == grader_seen["AGL_RESULT_DIR"] == OPTIONS.result_dir


def test_the_secret_holds_both_keys_and_can_be_owned_by_the_job() -> None:
    spec = spec_for(grader=GraderTemplate(command=("grade",)))
    secret = build_secret(spec, OPTIONS, job_uid="job-uid-1")
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert data == {
        "agent-key": derive_key(ADMIN, "ro-1", KeyRole.AGENT),
        "grader-key": derive_key(ADMIN, "ro-1", KeyRole.GRADER),
    }
    assert secret["metadata"]["name"] == "agl-ro-1"
    assert secret["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": "agl-ro-1",
            "uid": "job-uid-1",
            "blockOwnerDeletion": False,
        }
    ]
    assert "ownerReferences" not in build_secret(spec, OPTIONS)["metadata"]


def test_a_relaunch_uses_the_attempts_left() -> None:
    spec = spec_for(max_attempts=3)
    assert build_job(dataclasses.replace(spec, backoff_limit=0), OPTIONS)["spec"]["backoffLimit"] == 0


def plan_for(runner: dict[str, Any], *, settings_command: tuple[str, ...] = (), grader: Any = None) -> Any:
    from agl_lite.runner.plan import resolve
    from agl_lite.runner.seams import RunnerSettings

    rollout = Rollout("ro-1", {"q": 1}, config=RolloutConfig(runner=runner, grader=grader, timeout_s=10))
    return resolve(RunnerSettings("k8s", PUBLIC, command=settings_command, grader_timeout_s=5), rollout)


@pytest.mark.parametrize(
    ("runner", "settings_command", "template_command", "expected"),
    [
        (
            {"k8s": {"command": ["k8s-rollout"]}, "command": ["rollout"]},
            ("runner",),
            ("template",),
            ["k8s-rollout"],
        ),
        ({"command": ["rollout"]}, ("runner",), ("template",), ["rollout"]),
        ({}, ("runner",), ("template",), ["template"]),
        ({}, ("runner",), (), ["runner"]),
        ({}, (), (), None),  # the image's entrypoint
    ],
)
def test_the_container_command_is_the_first_one_set(
    runner: dict[str, Any],
    settings_command: tuple[str, ...],
    template_command: tuple[str, ...],
    expected: Any,
) -> None:
    opts = parse_k8s_options({"job": {"image": "a:1", "command": list(template_command)}}, file="t")
    spec = launch_spec(opts, plan_for(runner, settings_command=settings_command), "ro-1", {}, None)
    assert containers(build_job(spec, opts))["agent"].get("command") == expected


def test_a_graded_rollouts_pod_deadline_covers_its_grading() -> None:
    plan = plan_for({}, grader={"command": ["grade"]})
    spec = launch_spec(OPTIONS, plan, "ro-1", {}, {"AGL_GRADER_KEY": "agl-grader.ro-1.sig"})
    assert spec.grader is not None
    assert spec.grader.command == ("grade",)
    assert spec.timeout_s == 15  # the agent's 10 s and the grader's 5 s
