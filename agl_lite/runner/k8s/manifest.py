"""The Job and the Secret of one rollout, as plain Kubernetes JSON (pure functions: no I/O, no client objects).

The attempt id is the pod UID (downward API, listed first so the URLs after it can say `$(AGL_ATTEMPT_ID)`); keys
come from the rollout's Secret, never literals; retries are the Job's (`backoffLimit`, `podFailurePolicy`). With a
grading step the agent is the init container and the grader the main one, sharing an emptyDir; only the grader's
env holds the grader key. Literal values are escaped (`$` → `$$`) so the kubelet expands only our references.
"""

from __future__ import annotations

import base64
import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agl_lite.core.contract import KeyRole
from agl_lite.runner.k8s.names import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    ROLLOUT_ANNOTATION,
    ROLLOUT_LABEL,
    job_name,
    rollout_label_value,
)
from agl_lite.runner.k8s.options import GraderTemplate, JobTemplate, K8sOptions, grader_template, job_template
from agl_lite.runner.seams import Plan

__all__ = [
    "AGENT_CONTAINER",
    "GRADER_CONTAINER",
    "INSTANCE_LABEL",
    "LaunchSpec",
    "build_job",
    "build_secret",
    "launch_spec",
    "object_labels",
    "secret_data",
]

AGENT_CONTAINER = "agent"
GRADER_CONTAINER = "grader"
SHARED_VOLUME = "agl-result"
INSTANCE_LABEL = "app.kubernetes.io/instance"
ATTEMPT_VAR = "AGL_ATTEMPT_ID"
PLACEHOLDER = f"$({ATTEMPT_VAR})"
SECRET_ENV = frozenset({"OPENAI_API_KEY", "ANTHROPIC_API_KEY", "AGL_GRADER_KEY"})
"""Variables whose values are keys: they reach the pod only through `secretKeyRef`."""
_KEY_PREFIXES = {f"agl-{role.value}.": f"{role.value}-key" for role in (KeyRole.AGENT, KeyRole.GRADER)}


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """What one Job needs from the store: the rollout's id and limits and the env templates it returned."""

    rollout_id: str
    max_attempts: int
    env: Mapping[str, str]
    """The agent contract with `$(AGL_ATTEMPT_ID)` in place of the attempt id."""
    timeout_s: float | None = None
    grader_env: Mapping[str, str] | None = None
    grader: GraderTemplate | None = None
    """The grading container (resolved with the rollout's overrides); None: no grading step."""
    template: JobTemplate | None = None
    """The Job template with the rollout's overrides applied; None uses the options' template."""
    backoff_limit: int | None = None
    """Set when a vanished Job is relaunched with the attempts that remain; else `max_attempts - 1`."""


def launch_spec(
    options: K8sOptions,
    plan: Plan,
    rollout_id: str,
    env: Mapping[str, str],
    grader_env: Mapping[str, str] | None,
    *,
    backoff_limit: int | None = None,
) -> LaunchSpec:
    """What the controller builds a rollout's Job from: the template with the rollout's overrides, the command by
    precedence (`config.runner.k8s.command`, `config.runner.command`, the template's, the runner's), the runner's
    and the rollout's env, the grading container. ConfigError for a bad override."""
    template = job_template(options, plan.overrides)
    k8s_overrides = plan.overrides.get("k8s") or {}
    if "command" not in k8s_overrides and (plan.overrides.get("command") is not None or not template.command):
        template = dataclasses.replace(template, command=plan.command)  # the rollout's, or the runner's
    template = dataclasses.replace(template, env={**template.env, **plan.env})
    grader = grader_template(options, plan.grader, plan.grader_command) if plan.grading else None
    timeout = plan.timeout_s
    if timeout is not None and grader is not None and plan.grader_timeout_s:
        timeout += plan.grader_timeout_s  # the pod's deadline covers the agent and its grading
    return LaunchSpec(
        rollout_id=rollout_id,
        max_attempts=plan.max_attempts,
        env=env,
        timeout_s=timeout,
        grader_env=grader_env if grader is not None else None,
        grader=grader,
        template=template,
        backoff_limit=backoff_limit,
    )


def object_labels(rollout_id: str, options: K8sOptions) -> dict[str, str]:
    """The labels every object of a rollout carries (Job, its pods, its Secret)."""
    return {
        MANAGED_BY_LABEL: MANAGED_BY,
        INSTANCE_LABEL: options.instance,
        ROLLOUT_LABEL: rollout_label_value(rollout_id),
    }


def _escape(value: str) -> str:
    return value.replace("$", "$$")


def _literal(name: str, value: str) -> str:
    """A contract value as the kubelet must see it: URLs keep their `$(AGL_ATTEMPT_ID)`, the rest is literal."""
    if name.endswith("_URL"):
        return PLACEHOLDER.join(_escape(part) for part in value.split(PLACEHOLDER))
    return _escape(value)


def _secret_key(name: str, value: str) -> str | None:
    for prefix, key in _KEY_PREFIXES.items():
        if value.startswith(prefix):
            return key
    return name.lower().replace("_", "-") if name in SECRET_ENV else None


def _env(contract: Mapping[str, str], extra: Mapping[str, str], secret: str) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": ATTEMPT_VAR, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.uid"}}}
    ]
    for name, value in contract.items():
        if name == ATTEMPT_VAR:
            continue
        key = _secret_key(name, value)
        if key is not None:
            env.append({"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}})
        else:
            env.append({"name": name, "value": _literal(name, value)})
    # the operator's own env last, so it may refer to ours ($(OPENAI_BASE_URL)); it never replaces ours
    env += [{"name": k, "value": v} for k, v in extra.items() if k not in contract and k != ATTEMPT_VAR]
    return env


def secret_data(spec: LaunchSpec) -> dict[str, str]:
    """The Secret's `data` (base64): each key the pod's env refers to, once."""
    data: dict[str, str] = {}
    for env in (spec.env, spec.grader_env or {}):
        for name, value in env.items():
            key = _secret_key(name, value)
            if key is not None:
                data[key] = base64.b64encode(value.encode()).decode()
    return data


def _container(
    name: str,
    image: str,
    command: tuple[str, ...],
    args: tuple[str, ...],
    env: list[dict[str, Any]],
    resources: Mapping[str, Any],
    pull: str,
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": name, "image": image, "imagePullPolicy": pull}
    if command:
        container["command"] = list(command)
    if args:
        container["args"] = list(args)
    container["env"] = env
    if resources:
        container["resources"] = _plain(resources)
    # a failed container's last log lines become its termination message, hence the attempt's message
    container["terminationMessagePolicy"] = "FallbackToLogsOnError"
    return container


def _plain(value: Any) -> Any:
    """Read-only config mappings (MappingProxyType) and tuples as plain JSON values."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _pod_failure_policy(options: K8sOptions) -> dict[str, Any]:
    # first match wins: a disruption (eviction, preemption, node drain) never counts against backoffLimit
    rules: list[dict[str, Any]] = [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    ]
    if options.non_retryable_exit_codes:
        rules.append(
            {
                "action": "FailJob",
                "onExitCodes": {
                    "containerName": AGENT_CONTAINER,
                    "operator": "In",
                    "values": sorted(set(options.non_retryable_exit_codes)),
                },
            }
        )
    return {"rules": rules}


def build_job(spec: LaunchSpec, options: K8sOptions) -> dict[str, Any]:
    """The Job of one rollout (`batch/v1`), named `agl-<rollout>`."""
    template = spec.template or options.job
    name = job_name(spec.rollout_id)
    labels = object_labels(spec.rollout_id, options)
    annotations = {ROLLOUT_ANNOTATION: spec.rollout_id}
    grader, grader_env = spec.grader, spec.grader_env
    grading = grader is not None and grader_env is not None
    shared = {"AGL_RESULT_DIR": options.result_dir} if grading else {}
    agent = _container(
        AGENT_CONTAINER,
        template.image,
        template.command,
        template.args,
        _env({**spec.env, **shared}, template.env, name),
        template.resources,
        template.image_pull_policy,
    )
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "enableServiceLinks": False,  # the agent's env is the contract, not every Service in the namespace
        "automountServiceAccountToken": template.automount_service_account_token,
    }
    if grader is not None and grader_env is not None:
        mount = [{"name": SHARED_VOLUME, "mountPath": options.result_dir}]
        agent["volumeMounts"] = mount
        main = _container(
            GRADER_CONTAINER,
            grader.image or template.image,
            grader.command,
            grader.args,
            _env({**grader_env, **shared}, grader.env, name),
            grader.resources or template.resources,
            template.image_pull_policy,
        )
        main["volumeMounts"] = mount
        pod["initContainers"] = [agent]
        pod["containers"] = [main]
        pod["volumes"] = [{"name": SHARED_VOLUME, "emptyDir": {}}]
    else:
        pod["containers"] = [agent]
    if template.service_account_name:
        pod["serviceAccountName"] = template.service_account_name
    if template.node_selector:
        pod["nodeSelector"] = _plain(template.node_selector)
    if template.tolerations:
        pod["tolerations"] = _plain(template.tolerations)
    job_spec: dict[str, Any] = {
        "backoffLimit": spec.backoff_limit if spec.backoff_limit is not None else spec.max_attempts - 1,
        "podFailurePolicy": _pod_failure_policy(options),
        "ttlSecondsAfterFinished": options.ttl_seconds_after_finished,
        "template": {
            "metadata": {
                "labels": {**_plain(template.pod_labels), **labels},
                "annotations": {**_plain(template.pod_annotations), **annotations},
            },
            "spec": pod,
        },
    }
    if spec.timeout_s is not None:
        per_attempt = max(1, math.ceil(spec.timeout_s))
        pod["activeDeadlineSeconds"] = per_attempt  # one attempt's limit: the pod fails, the Job may retry
        job_spec["activeDeadlineSeconds"] = per_attempt * spec.max_attempts  # the whole rollout's
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": options.namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": job_spec,
    }


def build_secret(spec: LaunchSpec, options: K8sOptions, *, job_uid: str | None = None) -> dict[str, Any]:
    """The rollout's Secret (agent and grader keys), owned by its Job when `job_uid` is given, so the garbage
    collector deletes it with the Job."""
    name = job_name(spec.rollout_id)
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": options.namespace,
        "labels": object_labels(spec.rollout_id, options),
        "annotations": {ROLLOUT_ANNOTATION: spec.rollout_id},
    }
    if job_uid is not None:
        metadata["ownerReferences"] = [
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": name,
                "uid": job_uid,
                "blockOwnerDeletion": False,
            }
        ]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata,
        "type": "Opaque",
        "data": secret_data(spec),
    }
