"""Validation messages in the real server's format for the fields that matter."""

from __future__ import annotations

from agl_fake_k8s.manifests import container, job_manifest, pod_manifest
from agl_fake_k8s.validation import validate_job, validate_pod


def messages(errors: list[object]) -> list[str]:
    return [str(e) for e in errors]


def test_a_pod_failure_policy_needs_never_and_well_formed_rules() -> None:
    rules = [
        {"action": "Retry", "onExitCodes": {"operator": "In", "values": [0, 1, 1]}},
        {"action": "Ignore"},
    ]
    manifest = job_manifest(
        "j", [container(["true"])], restart_policy="OnFailure", podFailurePolicy={"rules": rules}
    )
    manifest["metadata"]["name"] = "j"
    assert messages(validate_job(manifest)) == [
        'spec.template.spec.restartPolicy: Invalid value: "OnFailure": '
        'only "Never" is supported when podFailurePolicy is specified',
        'spec.podFailurePolicy.rules[0].action: Unsupported value: "Retry": '
        'supported values: "Count", "FailIndex", "FailJob", "Ignore"',
        "spec.podFailurePolicy.rules[0].onExitCodes.values[0]: Invalid value: 0: must not be 0 for the In operator",
        "spec.podFailurePolicy.rules[0].onExitCodes.values[2]: Duplicate value: 1",
        "spec.podFailurePolicy.rules[1]: Invalid value: null: "
        "specifying one of OnExitCodes and OnPodConditions is required",
    ]


def test_env_names_volume_mounts_and_field_paths_are_checked() -> None:
    env = [
        {"name": "1BAD", "value": "x"},
        {"name": "F", "valueFrom": {"fieldRef": {"fieldPath": "spec.nope"}}},
    ]
    main = container(["true"], env=env, volumeMounts=[{"name": "missing", "mountPath": "/m"}])
    errors = messages(validate_pod(pod_manifest("p", [main], restart_policy="Sometimes")))
    assert errors[0].startswith(
        'spec.containers[0].env[0].name: Invalid value: "1BAD": a valid environment variable name'
    )
    assert errors[1].startswith(
        'spec.containers[0].env[1].valueFrom.fieldRef.fieldPath: Unsupported value: "spec.nope"'
    )
    assert errors[2:] == [
        'spec.containers[0].volumeMounts[0].name: Not found: "missing"',
        'spec.restartPolicy: Unsupported value: "Sometimes": supported values: "Always", "OnFailure", "Never"',
    ]


def test_counts_must_not_be_negative() -> None:
    manifest = job_manifest("j", [container(["true"])], backoff_limit=-1, activeDeadlineSeconds=-5)
    assert messages(validate_job(manifest)) == [
        "spec.backoffLimit: Invalid value: -1: must be greater than or equal to 0",
        "spec.activeDeadlineSeconds: Invalid value: -5: must be greater than or equal to 0",
    ]
