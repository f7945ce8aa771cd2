"""What a pod's or a Job's state means for the store: the rules on plain API JSON."""

from __future__ import annotations

from typing import Any

import pytest

from agl_lite.runner.k8s.views import JobView, PodView, pod_outcome
from agl_lite.store.records import AttemptStatus


def terminated(name: str, code: int, **extra: Any) -> dict[str, Any]:
    return {"name": name, "state": {"terminated": {"exitCode": code, **extra}}}


def test_a_running_or_pending_pod_has_no_outcome() -> None:
    assert pod_outcome({"phase": "Running"}) is None
    assert pod_outcome({"phase": "Pending"}) is None
    assert pod_outcome({}) is None


def test_a_succeeded_pod_succeeds_with_exit_code_zero() -> None:
    outcome = pod_outcome({"phase": "Succeeded", "containerStatuses": [terminated("agent", 0)]})
    assert outcome is not None
    assert (outcome.status, outcome.exit_code) == (AttemptStatus.SUCCEEDED, 0)


def test_a_failed_pod_fails_with_its_containers_exit_code_and_message() -> None:
    status = {
        "phase": "Failed",
        "containerStatuses": [terminated("agent", 3, reason="Error", message="boom")],
    }
    outcome = pod_outcome(status)
    assert outcome is not None
    assert (outcome.status, outcome.exit_code) == (AttemptStatus.FAILED, 3)
    assert outcome.message == "agent exited 3: boom"


def test_a_failed_agent_init_container_is_the_one_reported() -> None:
    status = {
        "phase": "Failed",
        "initContainerStatuses": [terminated("agent", 7, reason="Error")],
        "containerStatuses": [{"name": "grader", "state": {"waiting": {"reason": "PodInitializing"}}}],
    }
    outcome = pod_outcome(status)
    assert outcome is not None
    assert (outcome.exit_code, outcome.message) == (7, "agent exited 7: Error")


def test_a_failing_grader_after_a_good_agent_is_reported() -> None:
    status = {
        "phase": "Failed",
        "initContainerStatuses": [terminated("agent", 0, reason="Completed")],
        "containerStatuses": [terminated("grader", 2, reason="Error")],
    }
    outcome = pod_outcome(status)
    assert outcome is not None
    assert (outcome.exit_code, outcome.message) == (2, "grader exited 2: Error")


@pytest.mark.parametrize(
    "status",
    [
        {
            "phase": "Failed",
            "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}],
            "containerStatuses": [terminated("agent", 137)],
        },
        {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."},
    ],
)
def test_a_disrupted_pod_is_lost_not_failed(status: dict[str, Any]) -> None:
    outcome = pod_outcome(status)
    assert outcome is not None
    assert outcome.status is AttemptStatus.LOST
    assert outcome.exit_code is None


def test_an_evicted_pods_message_says_so() -> None:
    status = {
        "phase": "Failed",
        "reason": "Evicted",
        "message": "low on memory",
        "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet"}],
    }
    outcome = pod_outcome(status)
    assert outcome is not None
    assert outcome.message == "pod Evicted (TerminationByKubelet): low on memory"


def test_a_false_disruption_condition_does_not_count() -> None:
    status = {
        "phase": "Failed",
        "conditions": [{"type": "DisruptionTarget", "status": "False"}],
        "containerStatuses": [terminated("agent", 1)],
    }
    outcome = pod_outcome(status)
    assert outcome is not None
    assert outcome.status is AttemptStatus.FAILED


def test_a_pod_past_its_deadline_timed_out() -> None:
    outcome = pod_outcome(
        {"phase": "Failed", "reason": "DeadlineExceeded", "message": "Pod was active too long"}
    )
    assert outcome is not None
    assert outcome.status is AttemptStatus.TIMEOUT


def test_a_long_termination_message_keeps_its_tail() -> None:
    status = {"phase": "Failed", "containerStatuses": [terminated("agent", 1, message="x" * 5000 + "END")]}
    outcome = pod_outcome(status)
    assert outcome is not None
    assert outcome.message is not None
    assert outcome.message.endswith("END")
    assert len(outcome.message) <= 2049


def job(conditions: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "agl-ro-1",
            "uid": "job-uid",
            "resourceVersion": "42",
            "annotations": {"agl-lite/rollout-id": "ro-1"},
        },
        "spec": spec,
        "status": {"conditions": conditions},
    }


def test_a_complete_job_succeeded() -> None:
    view = JobView.from_json(job([{"type": "Complete", "status": "True"}], podFailurePolicy={"rules": []}))
    assert (view.finished, view.succeeded, view.rollout_id, view.uid) == (True, True, "ro-1", "job-uid")
    assert view.has_failure_policy


def test_a_failed_job_keeps_its_reason() -> None:
    view = JobView.from_json(
        job([{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "limit"}])
    )
    assert (view.finished, view.succeeded, view.reason) == (True, False, "BackoffLimitExceeded")
    assert view.outcome_message == "Job agl-ro-1 failed (BackoffLimitExceeded: limit)"


def test_interim_conditions_are_no_verdict() -> None:
    view = JobView.from_json(
        job([{"type": "FailureTarget", "status": "True"}, {"type": "Suspended", "status": "False"}])
    )
    assert not view.finished


def test_a_job_without_pod_failure_policy_is_noticed() -> None:
    assert not JobView.from_json(job([])).has_failure_policy


def test_a_pod_knows_its_rollout_job_and_owner() -> None:
    pod = PodView.from_json(
        {
            "metadata": {
                "name": "agl-ro-1-abcde",
                "uid": "pod-uid",
                "annotations": {"agl-lite/rollout-id": "ro-1"},
                "ownerReferences": [
                    {"kind": "Job", "name": "agl-ro-1", "uid": "job-uid", "apiVersion": "batch/v1"}
                ],
            },
            "status": {"phase": "Running"},
        }
    )
    assert (pod.rollout_id, pod.job_name, pod.owner_uid, pod.outcome) == ("ro-1", "agl-ro-1", "job-uid", None)
