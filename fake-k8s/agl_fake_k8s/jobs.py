"""The Job controller: pods from the template, retries up to backoffLimit, podFailurePolicy, activeDeadlineSeconds,
Complete/Failed conditions, status counts, and deletion after ttlSecondsAfterFinished.

Counting follows the 1.20 controller the transcripts show (no tracking finalizers): the counts come from the pods
that exist, kept monotonic through the Job's status, so a restarted controller continues from storage alone.
Only its timers (retry backoff, precise start times) are memory; after a restart they start over.
"""

from __future__ import annotations

import calendar
import time
from typing import Any

import structlog

from agl_fake_k8s.config import Timings
from agl_fake_k8s.controller import Controller
from agl_fake_k8s.defaults import order_job_status
from agl_fake_k8s.meta import JsonObj, copy_json, now
from agl_fake_k8s.registry import DeleteOptions, Registry
from agl_fake_k8s.resources import JOBS, PODS
from agl_fake_k8s.status import ApiError
from agl_fake_k8s.storage import Event

__all__ = ["JobController", "match_pod_failure_policy"]

log = structlog.get_logger("agl_fake_k8s")

MANAGER = "kube-controller-manager"
Key = tuple[str, str]
_TERMINAL = ("Succeeded", "Failed")


def _wall(timestamp: Any) -> float | None:
    try:
        return float(calendar.timegm(time.strptime(str(timestamp), "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return None


def _count(value: Any, default: int) -> int:
    return value if isinstance(value, int) else default


def _condition(status: JsonObj, kind: str) -> JsonObj | None:
    return next(
        (c for c in status.get("conditions") or [] if c.get("type") == kind and c.get("status") == "True"),
        None,
    )


def _phase(pod: JsonObj) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def match_pod_failure_policy(policy: JsonObj | None, pod: JsonObj) -> tuple[str, str] | None:
    """(action, message) of the first podFailurePolicy rule a failed pod matches, or None."""
    metadata, status = pod["metadata"], pod.get("status") or {}
    where = f"{metadata.get('namespace')}/{metadata.get('name')}"
    statuses = [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
    for index, rule in enumerate((policy or {}).get("rules") or []):
        action = rule.get("action")
        if on_codes := rule.get("onExitCodes"):
            values = on_codes.get("values") or []
            for container in statuses:
                code = ((container.get("state") or {}).get("terminated") or {}).get("exitCode")
                if code in (None, 0) or on_codes.get("containerName") not in (None, container.get("name")):
                    continue
                if (code in values) == (on_codes.get("operator") == "In"):
                    return action, (
                        f"Container {container.get('name')} for pod {where} failed with exit code {code} "
                        f"matching {action} rule at index {index}"
                    )
        for pattern in rule.get("onPodConditions") or []:
            wanted = pattern.get("status") or "True"
            if any(
                c.get("type") == pattern.get("type") and c.get("status") == wanted
                for c in status.get("conditions") or []
            ):
                return (
                    action,
                    f"Pod {where} has condition {pattern.get('type')} matching {action} rule at index {index}",
                )
    return None


def _condition_entry(kind: str, reason: str | None = None, message: str | None = None) -> JsonObj:
    timestamp = now()
    entry: JsonObj = {
        "type": kind,
        "status": "True",
        "lastProbeTime": timestamp,
        "lastTransitionTime": timestamp,
    }
    if reason:
        entry["reason"] = reason
        entry["message"] = message or ""
    return entry


class JobController(Controller[Key]):
    name = "job-controller"

    def __init__(self, registry: Registry, timings: Timings) -> None:
        super().__init__(registry.storage)
        self.registry = registry
        self.timings = timings
        self._started: dict[str, float] = {}
        """Job uid -> time.time() of its start, more precise than status.startTime's whole seconds."""
        self._finished: dict[str, float] = {}
        self._failures_seen: dict[str, int] = {}
        self._not_before: dict[str, float] = {}
        """Job uid -> time.time() before which no replacement pod is made (retry backoff)."""

    def initial_keys(self) -> list[Key]:
        return [(o["metadata"]["namespace"], o["metadata"]["name"]) for o in self.storage.items(JOBS)]

    def keys_for(self, event: Event) -> list[Key]:
        if event.resource is JOBS:
            return [(event.namespace, event.name)]
        if event.resource is PODS:
            refs = [*(event.obj["metadata"].get("ownerReferences") or [])]
            refs += (event.old or {}).get("metadata", {}).get("ownerReferences") or []
            return list(
                dict.fromkeys(
                    (event.namespace, r["name"])
                    for r in refs
                    if r.get("kind") == "Job" and r.get("controller")
                )
            )
        return []

    def _backoff(self, failures: int) -> float:
        """The delay before the pod that follows the `failures`-th failure; the first retry is immediate."""
        if failures <= 1 or self.timings.job_backoff_s <= 0:
            return 0.0
        return float(min(self.timings.job_backoff_s * 2 ** (failures - 2), self.timings.job_backoff_max_s))

    def reconcile(self, key: Key) -> None:
        namespace, name = key
        job = self.storage.get(JOBS, namespace, name)
        if job is None or job["metadata"].get("deletionTimestamp"):
            return
        uid = job["metadata"]["uid"]
        spec, status = job.get("spec") or {}, job.get("status") or {}
        pods = [
            p
            for resource, p in self.storage.dependents(uid)
            if resource is PODS
            and any(
                r.get("uid") == uid and r.get("controller")
                for r in p["metadata"].get("ownerReferences") or []
            )
        ]
        pods.sort(key=lambda p: (p["metadata"].get("creationTimestamp", ""), p["metadata"]["name"]))
        # As 1.20's controller.FilterActivePods: a terminating pod (deletionTimestamp set) is no longer active, so
        # a pod deleted by hand is replaced at once and both run side by side for its grace period.
        active = [
            p for p in pods if _phase(p) not in _TERMINAL and not p["metadata"].get("deletionTimestamp")
        ]
        succeeded = sum(_phase(p) == "Succeeded" for p in pods)
        failed_now, fail_job = 0, None
        for pod in (p for p in pods if _phase(p) == "Failed"):
            matched = match_pod_failure_policy(spec.get("podFailurePolicy"), pod)
            if matched and matched[0] == "Ignore":
                continue
            failed_now += 1
            if matched and matched[0] == "FailJob" and fail_job is None:
                fail_job = matched[1]
        new = copy_json(status)
        failed = max(int(status.get("failed") or 0), failed_now)
        succeeded = max(int(status.get("succeeded") or 0), succeeded)
        finished = _condition(status, "Complete") or _condition(status, "Failed")
        to_delete: list[JsonObj] = []
        to_create = 0
        if finished:
            if _condition(status, "Failed"):
                to_delete = [p for p in active if not p["metadata"].get("deletionTimestamp")]
        elif spec.get("suspend"):
            to_delete = [p for p in active if not p["metadata"].get("deletionTimestamp")]
        else:
            if "startTime" not in new:
                new["startTime"] = now()
                self._started[uid] = time.time()
            failure = self._failure(key, job, uid, failed, fail_job)
            completions = spec.get("completions")
            parallelism = _count(spec.get("parallelism"), 1)
            if failure is not None:
                to_delete = [p for p in active if not p["metadata"].get("deletionTimestamp")]
                failed += len(active)  # as 1.20 does: the pods it kills count as failed
                active = []
                new["conditions"] = [*(new.get("conditions") or []), _condition_entry("Failed", *failure)]
                self._finished[uid] = time.time()
            elif (completions is not None and succeeded >= completions) or (
                completions is None and succeeded > 0 and not active
            ):
                to_delete = [p for p in active if not p["metadata"].get("deletionTimestamp")]
                active = []
                new["conditions"] = [*(new.get("conditions") or []), _condition_entry("Complete")]
                new["completionTime"] = now()
                self._finished[uid] = time.time()
            else:
                wanted = parallelism if completions is None else min(parallelism, completions - succeeded)
                if succeeded and completions is None:
                    wanted = 0
                if len(active) > wanted:
                    to_delete = active[wanted:]
                elif len(active) < wanted:
                    to_create = self._allowed_creations(key, uid, failed, wanted - len(active))
        for pod in to_delete:
            self._delete_pod(namespace, pod["metadata"]["name"])
        created = sum(self._create_pod(job) for _ in range(to_create))
        if not finished:
            new["active"] = len(active) + created
        new["succeeded"], new["failed"] = succeeded, failed
        for count in ("active", "succeeded", "failed"):
            if not new.get(count):
                new.pop(count, None)
        new = order_job_status(new)
        if new != status:

            def write(obj: JsonObj) -> None:
                obj["status"] = new

            job = (
                self.registry.mutate(JOBS, namespace, name, write, manager=MANAGER, subresource="status")
                or job
            )
        if _condition(new, "Complete") or _condition(new, "Failed"):
            self._expire_after_ttl(key, job, uid)  # after the status write, so watchers see the outcome first

    def _failure(
        self, key: Key, job: JsonObj, uid: str, failed: int, fail_job: str | None
    ) -> tuple[str, str] | None:
        spec = job.get("spec") or {}
        if fail_job is not None:
            return "PodFailurePolicy", fail_job
        if failed > _count(spec.get("backoffLimit"), 6):
            return "BackoffLimitExceeded", "Job has reached the specified backoff limit"
        deadline = spec.get("activeDeadlineSeconds")
        if deadline is not None:
            started = (
                self._started.get(uid) or _wall((job.get("status") or {}).get("startTime")) or time.time()
            )
            left = started + deadline * self.timings.time_scale - time.time()
            if left <= 0:
                return "DeadlineExceeded", "Job was active longer than specified deadline"
            self.enqueue_after(key, left)
        return None

    def _allowed_creations(self, key: Key, uid: str, failed: int, wanted: int) -> int:
        """How many pods to create now; none while the retry backoff after a new failure runs."""
        if failed > self._failures_seen.get(uid, 0):
            self._failures_seen[uid] = failed
            self._not_before[uid] = time.time() + self._backoff(failed)
        wait = self._not_before.get(uid, 0.0) - time.time()
        if wait > 0:
            self.enqueue_after(key, wait)
            return 0
        return wanted

    def _create_pod(self, job: JsonObj) -> bool:
        metadata, template = job["metadata"], job["spec"]["template"]
        template_meta = template.get("metadata") or {}
        pod_meta: JsonObj = {
            "generateName": f"{metadata['name']}-",
            "labels": dict(template_meta.get("labels") or {}),
        }
        if template_meta.get("annotations"):
            pod_meta["annotations"] = dict(template_meta["annotations"])
        pod_meta["ownerReferences"] = [
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": metadata["name"],
                "uid": metadata["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        body = {"metadata": pod_meta, "spec": copy_json(template.get("spec") or {})}
        try:
            self.registry.create(PODS, metadata["namespace"], body, manager=MANAGER)
        except ApiError as error:  # a real controller records a FailedCreate event and retries
            log.warning(
                "fake k8s job controller could not create a pod", job=metadata["name"], error=error.message
            )
            self.enqueue_after((metadata["namespace"], metadata["name"]), 1.0)
            return False
        return True

    def _delete_pod(self, namespace: str, name: str) -> None:
        try:
            self.registry.delete(PODS, namespace, name, DeleteOptions(), manager=MANAGER)
        except ApiError as error:
            if error.status != 404:
                raise

    def _expire_after_ttl(self, key: Key, job: JsonObj, uid: str) -> None:
        """Delete a finished Job (and, in the background, its pods) ttlSecondsAfterFinished after it finished."""
        ttl = (job.get("spec") or {}).get("ttlSecondsAfterFinished")
        if ttl is None:
            return
        status = job.get("status") or {}
        finished = self._finished.get(uid)
        if finished is None:
            condition = _condition(status, "Complete") or _condition(status, "Failed") or {}
            finished = (
                _wall(status.get("completionTime") or condition.get("lastTransitionTime")) or time.time()
            )
        left = finished + ttl * self.timings.time_scale - time.time()
        if left > 0:
            self.enqueue_after(key, left)
            return
        try:
            options = DeleteOptions(propagation_policy="Background", precondition_uid=uid)
            self.registry.delete(JOBS, key[0], key[1], options, manager=MANAGER)
        except ApiError as error:
            if error.status not in (404, 409):
                raise
