"""Kubernetes names, labels and annotations for a rollout's objects: deterministic, valid, and reversible.

A rollout id is 1–128 of `A-Z a-z 0-9 _ -`; a Job name must be a DNS-1123 label of at most 63 characters (the Job
controller copies it into the `job-name` label of its pods). Ids that do not fit are lower-cased, cleaned and given
a short hash of the exact id, so two ids never share a name. The exact id always rides along as an annotation.
"""

from __future__ import annotations

import hashlib
import re

__all__ = [
    "MANAGED_BY",
    "MANAGED_BY_LABEL",
    "MANAGED_SELECTOR",
    "ROLLOUT_ANNOTATION",
    "ROLLOUT_LABEL",
    "job_name",
    "rollout_label_value",
]

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "agl-lite"
MANAGED_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY}"
"""The label selector of every list and watch: only our own Jobs, Pods and Secrets."""
ROLLOUT_LABEL = "agl-lite/rollout"
"""The rollout id as a label value (cleaned when it is not a valid one), for `kubectl get -l`."""
ROLLOUT_ANNOTATION = "agl-lite/rollout-id"
"""The exact rollout id, which is what the controller reads back."""

MAX_NAME = 63
PREFIX = "agl-"
HASH_CHARS = 10
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?\Z")


def _digest(rollout_id: str) -> str:
    return hashlib.sha256(rollout_id.encode()).hexdigest()[:HASH_CHARS]


def job_name(rollout_id: str) -> str:
    """`agl-<rollout>` when the id is already a short DNS-1123 label, else `agl-<cleaned prefix>-<hash>`."""
    plain = PREFIX + rollout_id
    if len(plain) <= MAX_NAME and _DNS_LABEL.fullmatch(rollout_id):
        return plain
    cleaned = re.sub(r"-+", "-", re.sub(r"[^a-z0-9]", "-", rollout_id.lower())).strip("-")
    room = MAX_NAME - len(PREFIX) - 1 - HASH_CHARS
    head = cleaned[:room].rstrip("-")
    return f"{PREFIX}{head}-{_digest(rollout_id)}" if head else f"{PREFIX}{_digest(rollout_id)}"


def rollout_label_value(rollout_id: str) -> str:
    """The id itself when it is a valid label value (≤ 63, alphanumeric at both ends), else a cleaned prefix
    and a hash."""
    if len(rollout_id) <= MAX_NAME and _LABEL_VALUE.fullmatch(rollout_id):
        return rollout_id
    cleaned = rollout_id.strip("-_")
    head = cleaned[: MAX_NAME - 1 - HASH_CHARS].rstrip("-_")
    return f"{head}-{_digest(rollout_id)}" if head else _digest(rollout_id)
