"""What the controller reads from Jobs and Pods: small frozen views of the raw API JSON, and the attempt status a
pod's state means. Pure: no I/O, no client objects, so the rules are tested on plain dicts.

Pod → attempt: Succeeded → succeeded; Failed with a `DisruptionTarget` condition (eviction, preemption, drain) →
lost (the Job's podFailurePolicy ignores it, so it burns no retry); Failed by `activeDeadlineSeconds` → timeout;
other failures → failed with the exit code of the container that failed. Job → rollout: `Complete` → succeeded,
`Failed` → failed (reason and message kept).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agl_lite.runner.k8s.names import ROLLOUT_ANNOTATION
from agl_lite.store.records import AttemptStatus

__all__ = ["JobView", "PodOutcome", "PodView", "pod_outcome"]

DISRUPTION_REASONS = frozenset({"Evicted", "Preempting", "Shutdown", "Terminated", "NodeShutdown"})
"""Pod `status.reason`s that say the pod was taken away rather than failed (older clusters have no condition)."""
MESSAGE_LIMIT = 2048


def _get(obj: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def _rollout_id(obj: Mapping[str, Any]) -> str | None:
    value = _get(obj, "metadata", "annotations", ROLLOUT_ANNOTATION)
    return value if isinstance(value, str) and value else None


def _true_condition(status: Any, kind: str) -> Mapping[str, Any] | None:
    for cond in _get(status, "conditions") or ():
        if isinstance(cond, Mapping) and cond.get("type") == kind and cond.get("status") == "True":
            return cond
    return None


@dataclass(frozen=True, slots=True)
class JobView:
    name: str
    uid: str
    rollout_id: str | None
    resource_version: str
    finished: bool
    """A `Complete` or `Failed` condition is True."""
    succeeded: bool
    reason: str | None = None
    message: str | None = None
    deleting: bool = False
    has_failure_policy: bool = True
    """False when the API server dropped `podFailurePolicy` (a cluster older than 1.26): retries then burn on
    disruptions and non-retryable codes, which the controller logs once."""

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> JobView:
        meta = obj.get("metadata") or {}
        status = obj.get("status") or {}
        complete = _true_condition(status, "Complete")
        failed = _true_condition(status, "Failed")
        outcome = complete or failed
        return cls(
            name=str(meta.get("name", "")),
            uid=str(meta.get("uid", "")),
            rollout_id=_rollout_id(obj),
            resource_version=str(meta.get("resourceVersion", "")),
            finished=outcome is not None,
            succeeded=complete is not None,
            reason=outcome.get("reason") if outcome else None,
            message=outcome.get("message") if outcome else None,
            deleting=meta.get("deletionTimestamp") is not None,
            has_failure_policy=_get(obj, "spec", "podFailurePolicy") is not None,
        )

    @property
    def outcome_message(self) -> str:
        if self.succeeded:
            return f"Job {self.name} complete"
        detail = ": ".join(p for p in (self.reason, self.message) if p)
        return f"Job {self.name} failed" + (f" ({detail})" if detail else "")


@dataclass(frozen=True, slots=True)
class PodOutcome:
    status: AttemptStatus
    exit_code: int | None
    message: str | None


@dataclass(frozen=True, slots=True)
class PodView:
    name: str
    uid: str
    rollout_id: str | None
    job_name: str | None
    phase: str
    outcome: PodOutcome | None
    """None while the pod has not ended."""
    owner_uid: str | None = None
    """The UID of the Job that made it (a Job recreated under the same name has another)."""
    created: str = ""
    """creationTimestamp (RFC 3339, so it sorts): attempts are upserted in the order their pods were made."""
    deleting: bool = False

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> PodView:
        meta = obj.get("metadata") or {}
        owner: Mapping[str, Any] = next(
            (o for o in meta.get("ownerReferences") or () if o.get("kind") == "Job"), {}
        )
        phase = str(_get(obj, "status", "phase") or "Pending")
        return cls(
            name=str(meta.get("name", "")),
            uid=str(meta.get("uid", "")),
            rollout_id=_rollout_id(obj),
            job_name=owner.get("name") or _get(meta, "labels", "job-name"),
            phase=phase,
            outcome=pod_outcome(obj.get("status") or {}),
            owner_uid=owner.get("uid"),
            created=str(meta.get("creationTimestamp") or ""),
            deleting=meta.get("deletionTimestamp") is not None,
        )


def _terminated(statuses: Any) -> list[tuple[str, Mapping[str, Any]]]:
    out = []
    for cs in statuses or ():
        term = _get(cs, "state", "terminated")
        if isinstance(term, Mapping):
            out.append((str(cs.get("name", "?")), term))
    return out


def _clip(text: str | None) -> str | None:
    if not text:
        return None
    text = text.strip()
    return text if len(text) <= MESSAGE_LIMIT else "…" + text[-MESSAGE_LIMIT:]


def pod_outcome(status: Mapping[str, Any]) -> PodOutcome | None:
    """The attempt status a pod's `status` means, or None while it has not ended."""
    phase = status.get("phase")
    terminated = _terminated(status.get("initContainerStatuses")) + _terminated(
        status.get("containerStatuses")
    )
    if phase == "Succeeded":
        return PodOutcome(AttemptStatus.SUCCEEDED, 0, None)
    if phase != "Failed":
        return None
    reason, message = status.get("reason"), status.get("message")
    disruption = _true_condition(status, "DisruptionTarget")
    if disruption is not None or reason in DISRUPTION_REASONS:
        what = reason or "disrupted"
        why = (disruption or {}).get("reason")
        text = (disruption or {}).get("message") or message
        head = f"pod {what}" + (f" ({why})" if why else "")
        return PodOutcome(AttemptStatus.LOST, None, _clip(head + (f": {text}" if text else "")))
    if reason == "DeadlineExceeded":
        return PodOutcome(AttemptStatus.TIMEOUT, None, _clip(f"pod DeadlineExceeded: {message or ''}"))
    failed = [(name, t) for name, t in terminated if t.get("exitCode") not in (0, None)]
    if failed:
        name, term = failed[0]
        code = int(term["exitCode"])
        detail = term.get("message") or term.get("reason")
        return PodOutcome(
            AttemptStatus.FAILED, code, _clip(f"{name} exited {code}" + (f": {detail}" if detail else ""))
        )
    return PodOutcome(
        AttemptStatus.FAILED, None, _clip(": ".join(p for p in (reason, message) if p) or "pod failed")
    )
