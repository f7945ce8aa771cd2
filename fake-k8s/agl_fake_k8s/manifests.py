"""Small builders of Job, Pod and Secret manifests (plain dicts) for tests that drive the fake cluster.

They write only what a test means; the API server fills in every default, as a real one does.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any

from agl_fake_k8s.meta import JsonObj

__all__ = ["container", "job_manifest", "pod_manifest", "secret_manifest"]


def container(
    command: Sequence[str], *, name: str = "main", image: str = "busybox:1.36", **fields: Any
) -> JsonObj:
    """A container running `command`; extra fields (env, volumeMounts, workingDir, ...) are passed through."""
    return {"name": name, "image": image, "command": list(command), **fields}


def pod_manifest(
    name: str,
    containers: Sequence[JsonObj],
    *,
    restart_policy: str = "Never",
    labels: Mapping[str, str] | None = None,
    **spec: Any,
) -> JsonObj:
    metadata: JsonObj = {"name": name, "labels": dict(labels or {})}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": list(containers), "restartPolicy": restart_policy, **spec},
    }


def job_manifest(
    name: str,
    containers: Sequence[JsonObj],
    *,
    backoff_limit: int = 0,
    restart_policy: str = "Never",
    labels: Mapping[str, str] | None = None,
    pod_spec: Mapping[str, Any] | None = None,
    **spec: Any,
) -> JsonObj:
    """A batch/v1 Job; `spec` adds Job spec fields (podFailurePolicy, activeDeadlineSeconds, ...)."""
    template_spec = {"containers": list(containers), "restartPolicy": restart_policy, **(pod_spec or {})}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": dict(labels or {})},
        "spec": {"backoffLimit": backoff_limit, "template": {"spec": template_spec}, **spec},
    }


def secret_manifest(name: str, data: Mapping[str, str]) -> JsonObj:
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": encoded}
