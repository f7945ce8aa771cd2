"""Server-side defaults and field order for Jobs, Pods and Secrets, as the transcripts of a real server show them.

It owns what the API server fills in on create (the defaulting functions and admission's tolerations) and the
order Go serialises struct fields in; it must not validate (validation.py) nor generate identities (registry).
"""

from __future__ import annotations

import base64
from typing import Any

from agl_fake_k8s.meta import JsonObj

__all__ = [
    "admit_pod",
    "default_job",
    "default_pod",
    "default_secret",
    "order_container_status",
    "order_job_spec",
    "order_job_status",
    "order_pod_spec",
    "order_pod_status",
    "pod_qos_class",
    "reorder",
]

_CONTAINER_ORDER = (
    "name",
    "image",
    "command",
    "args",
    "workingDir",
    "ports",
    "envFrom",
    "env",
    "resources",
    "resizePolicy",
    "restartPolicy",
    "volumeMounts",
    "volumeDevices",
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
    "lifecycle",
    "terminationMessagePath",
    "terminationMessagePolicy",
    "imagePullPolicy",
    "securityContext",
    "stdin",
    "stdinOnce",
    "tty",
)
_POD_SPEC_ORDER = (
    "volumes",
    "initContainers",
    "containers",
    "ephemeralContainers",
    "restartPolicy",
    "terminationGracePeriodSeconds",
    "activeDeadlineSeconds",
    "dnsPolicy",
    "nodeSelector",
    "serviceAccountName",
    "serviceAccount",
    "automountServiceAccountToken",
    "nodeName",
    "hostNetwork",
    "hostPID",
    "hostIPC",
    "shareProcessNamespace",
    "securityContext",
    "imagePullSecrets",
    "hostname",
    "subdomain",
    "affinity",
    "schedulerName",
    "tolerations",
    "hostAliases",
    "priorityClassName",
    "priority",
    "dnsConfig",
    "readinessGates",
    "runtimeClassName",
    "enableServiceLinks",
    "preemptionPolicy",
    "overhead",
    "topologySpreadConstraints",
)
_JOB_SPEC_ORDER = (
    "parallelism",
    "completions",
    "activeDeadlineSeconds",
    "podFailurePolicy",
    "successPolicy",
    "backoffLimit",
    "backoffLimitPerIndex",
    "maxFailedIndexes",
    "selector",
    "manualSelector",
    "template",
    "ttlSecondsAfterFinished",
    "completionMode",
    "suspend",
    "podReplacementPolicy",
    "managedBy",
)
_JOB_STATUS_ORDER = (
    "conditions",
    "startTime",
    "completionTime",
    "active",
    "succeeded",
    "failed",
    "ready",
)
_POD_STATUS_ORDER = (
    "phase",
    "conditions",
    "message",
    "reason",
    "nominatedNodeName",
    "hostIP",
    "hostIPs",
    "podIP",
    "podIPs",
    "startTime",
    "initContainerStatuses",
    "containerStatuses",
    "qosClass",
)
_CONTAINER_STATUS_ORDER = (
    "name",
    "state",
    "lastState",
    "ready",
    "restartCount",
    "image",
    "imageID",
    "containerID",
    "started",
)
_POD_TOLERATIONS = [
    {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
]


def reorder(obj: dict[str, Any], order: tuple[str, ...]) -> dict[str, Any]:
    """`obj` with the keys named in `order` first, in that order, and any others after them."""
    out = {k: obj[k] for k in order if k in obj}
    out.update((k, v) for k, v in obj.items() if k not in out)
    return out


def order_pod_spec(spec: dict[str, Any]) -> dict[str, Any]:
    return reorder(spec, _POD_SPEC_ORDER)


def order_job_spec(spec: dict[str, Any]) -> dict[str, Any]:
    return reorder(spec, _JOB_SPEC_ORDER)


def order_job_status(status: dict[str, Any]) -> dict[str, Any]:
    return reorder(status, _JOB_STATUS_ORDER)


def order_pod_status(status: dict[str, Any]) -> dict[str, Any]:
    return reorder(status, _POD_STATUS_ORDER)


def order_container_status(status: dict[str, Any]) -> dict[str, Any]:
    return reorder(status, _CONTAINER_STATUS_ORDER)


def _pull_policy(image: Any) -> str:
    if not isinstance(image, str):
        return "IfNotPresent"
    last = image.rsplit("/", 1)[-1]
    if "@" in last:
        return "IfNotPresent"
    tag = last.split(":", 1)[1] if ":" in last else ""
    return "Always" if tag in ("", "latest") else "IfNotPresent"


def _default_container(container: dict[str, Any]) -> dict[str, Any]:
    container.setdefault("resources", {})
    container.setdefault("terminationMessagePath", "/dev/termination-log")
    container.setdefault("terminationMessagePolicy", "File")
    container.setdefault("imagePullPolicy", _pull_policy(container.get("image")))
    for env in container.get("env") or []:
        field_ref = ((env or {}).get("valueFrom") or {}).get("fieldRef")
        if isinstance(field_ref, dict) and not field_ref.get("apiVersion"):
            env["valueFrom"]["fieldRef"] = {"apiVersion": "v1", **field_ref}
    for port in container.get("ports") or []:
        if isinstance(port, dict):
            port.setdefault("protocol", "TCP")
    return reorder(container, _CONTAINER_ORDER)


def _default_pod_spec(spec: dict[str, Any], *, pod: bool) -> dict[str, Any]:
    for key in ("containers", "initContainers"):
        if isinstance(spec.get(key), list):
            spec[key] = [_default_container(c) if isinstance(c, dict) else c for c in spec[key]]
    for volume in spec.get("volumes") or []:
        if isinstance(volume, dict) and isinstance(volume.get("secret"), dict):
            volume["secret"].setdefault("defaultMode", 420)
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("securityContext", {})
    spec.setdefault("schedulerName", "default-scheduler")
    if pod:
        spec.setdefault("enableServiceLinks", True)
    return reorder(spec, _POD_SPEC_ORDER)


def admit_pod(obj: JsonObj) -> None:
    """What admission plugins add to a new pod (DefaultTolerationSeconds, Priority), after defaulting: these
    fields belong to no field manager."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    tolerations = list(spec.get("tolerations") or [])
    keys = {t.get("key") for t in tolerations if isinstance(t, dict)}
    tolerations += [dict(t) for t in _POD_TOLERATIONS if t["key"] not in keys]
    spec["tolerations"] = tolerations
    spec.setdefault("priority", 0)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    obj["spec"] = reorder(spec, _POD_SPEC_ORDER)


def pod_qos_class(spec: dict[str, Any]) -> str:
    containers = [
        c for key in ("initContainers", "containers") for c in spec.get(key) or [] if isinstance(c, dict)
    ]
    resources = [c.get("resources") or {} for c in containers]
    if not any((r.get("requests") or r.get("limits")) for r in resources):
        return "BestEffort"
    for r in resources:
        limits, requests = r.get("limits") or {}, r.get("requests") or {}
        if not {"cpu", "memory"} <= limits.keys() or any(
            requests.get(k, limits[k]) != limits[k] for k in limits
        ):
            return "Burstable"
    return "Guaranteed"


def default_pod(obj: JsonObj) -> None:
    if isinstance(obj.get("spec"), dict):
        obj["spec"] = _default_pod_spec(obj["spec"], pod=True)


def default_job(obj: JsonObj) -> None:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    if spec.get("completions") is None and spec.get("parallelism") is None:
        spec["completions"] = 1
    spec.setdefault("parallelism", 1)
    spec.setdefault("backoffLimit", 6)
    template = spec.get("template")
    if isinstance(template, dict):
        template_meta = template.get("metadata")
        template["metadata"] = {
            "creationTimestamp": None,
            **(template_meta if isinstance(template_meta, dict) else {}),
        }
        if isinstance(template.get("spec"), dict):
            template["spec"] = _default_pod_spec(template["spec"], pod=False)
    obj["spec"] = reorder(spec, _JOB_SPEC_ORDER)


def default_secret(obj: JsonObj) -> None:
    """type Opaque; stringData folds into data (base64) and is never stored, as the real server does."""
    string_data = obj.pop("stringData", None) or {}
    if string_data:
        data = dict(obj.get("data") or {})
        data.update({k: base64.b64encode(str(v).encode()).decode() for k, v in string_data.items()})
        obj["data"] = data
    obj.setdefault("type", "Opaque")
