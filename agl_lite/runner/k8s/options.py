"""The Kubernetes backend's options: the Job template (image, command, resources...), the API client's limits and
the controller's timings. Parsed once from the runner's `k8s` table; a rollout may override template fields in
`config.runner["k8s"]`, which is validated with the same rules. No I/O here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from agl_lite.core.config import option, parse_dataclass
from agl_lite.errors import ConfigError

__all__ = [
    "GraderTemplate",
    "JobTemplate",
    "K8sOptions",
    "grader_template",
    "job_template",
    "parse_k8s_options",
]

T = TypeVar("T", "JobTemplate", "GraderTemplate")
PullPolicy = Literal["Always", "IfNotPresent", "Never"]


@dataclass(frozen=True, slots=True)
class JobTemplate:
    """What the agent container of every Job looks like; a rollout overrides fields in `config.runner.k8s`."""

    image: str = option("", "Agent image (required); use a non-`latest` tag with `IfNotPresent`.")
    command: tuple[str, ...] = option((), "Container command (entrypoint); empty keeps the image's.")
    args: tuple[str, ...] = option((), "Container args; empty keeps the image's.")
    image_pull_policy: PullPolicy = option("IfNotPresent", "`Always`, `IfNotPresent` or `Never`.")
    resources: Mapping[str, Any] = option(
        {}, "Container resources: `{requests = {cpu = '500m'}, limits = {memory = '1Gi'}}`."
    )
    env: Mapping[str, str] = option(
        {}, "Extra literal env of the agent container (the agent contract's variables win)."
    )
    service_account_name: str = option("", "Service account of the pods; empty is the namespace's default.")
    automount_service_account_token: bool = option(
        False, "Mount an API token into agent pods (off: agents have no business with the Kubernetes API)."
    )
    node_selector: Mapping[str, str] = option({}, "Node labels the pods must run on.")
    tolerations: tuple[Mapping[str, Any], ...] = option((), "Pod tolerations, as in a Pod spec.")
    pod_labels: Mapping[str, str] = option({}, "Extra labels on the pods (ours cannot be overridden).")
    pod_annotations: Mapping[str, str] = option({}, "Extra annotations on the pods.")


@dataclass(frozen=True, slots=True)
class GraderTemplate:
    """The grading container (main container; the agent runs before it as an init container)."""

    image: str = option("", "Grader image; empty uses the agent's image.")
    command: tuple[str, ...] = option((), "Grader command; a rollout's `config.grader.command` wins.")
    args: tuple[str, ...] = option((), "Grader args.")
    resources: Mapping[str, Any] = option({}, "Grader container resources.")
    env: Mapping[str, str] = option({}, "Extra literal env of the grader container.")


@dataclass(frozen=True, slots=True)
class K8sOptions:
    namespace: str = option("default", "Namespace of the Jobs, Pods and Secrets.")
    kubeconfig: str = option(
        "",
        "Kubeconfig file; empty: the in-cluster service account inside a pod, else the default kubeconfig.",
    )
    context: str = option("", "Kubeconfig context; empty is the current one.")
    instance: str = option(
        "agl-lite",
        "Value of `app.kubernetes.io/instance`: controllers sharing a namespace need distinct ones.",
    )
    qps: float = option(20.0, "Client-side limit on Kubernetes API requests, per second (token bucket).")
    burst: int = option(40, "Requests the token bucket allows at once after a quiet spell.")
    max_retry_after_s: float = option(60.0, "Longest `Retry-After` of a 429 that is honoured, in seconds.")
    retries: int = option(8, "Times a request refused with 429 (or a connection error) is retried.")
    resync_s: float = option(
        300.0,
        "Seconds between full relists of Jobs and Pods (watches carry every change in between; the reconcile "
        "against the store runs every `[addons.runner] resync_s`).",
    )
    watch_timeout_s: int = option(
        290, "Server-side `timeoutSeconds` of each watch, after which it resumes from its resourceVersion."
    )
    settle_s: float = option(
        10.0,
        "Seconds a finished Job's pods may take to report their last status before their attempts are closed "
        "as lost (or timeout).",
    )
    launch_concurrency: int = option(16, "Rollouts whose Job and Secret are being created at the same time.")
    ttl_seconds_after_finished: int = option(
        86_400,
        "`ttlSecondsAfterFinished` of each Job: a safety net only; the controller deletes Jobs itself.",
    )
    non_retryable_exit_codes: tuple[int, ...] = option(
        (), "Agent exit codes that fail the rollout at once (podFailurePolicy FailJob), 1-255."
    )
    result_dir: str = option(
        "/agl/result", "Where the emptyDir shared by the agent and the grader is mounted (`AGL_RESULT_DIR`)."
    )
    job: JobTemplate = option(JobTemplate(), "The Job template.", toml_key="addons.runner.k8s.job")
    grader: GraderTemplate = option(
        GraderTemplate(), "The grading container.", toml_key="addons.runner.k8s.grader"
    )


def parse_k8s_options(table: Mapping[str, Any], *, file: str, where: str = "k8s") -> K8sOptions:
    """The `k8s` table of the runner's options, checked: unknown keys and bad values name the key."""
    opts = parse_dataclass(K8sOptions, table, file=file, where=where)
    if not opts.job.image:
        raise ConfigError(f"{file}: {where}.job.image is required for the Kubernetes backend")
    if opts.qps <= 0 or opts.burst < 1:
        raise ConfigError(f"{file}: {where}.qps must be positive and {where}.burst at least 1")
    if opts.resync_s <= 0 or opts.watch_timeout_s < 1 or opts.launch_concurrency < 1:
        raise ConfigError(
            f"{file}: {where}.resync_s, watch_timeout_s and launch_concurrency must be positive"
        )
    bad = [c for c in opts.non_retryable_exit_codes if not 1 <= c <= 255]
    if bad or len(opts.non_retryable_exit_codes) > 255:
        raise ConfigError(
            f"{file}: {where}.non_retryable_exit_codes must be 1-255 (0 means success), got {bad}"
        )
    if not opts.result_dir.startswith("/"):
        raise ConfigError(f"{file}: {where}.result_dir must be an absolute path")
    return opts


def _overridden(base: T, overrides: Any, *, where: str) -> T:
    if overrides is None:
        return base
    if not isinstance(overrides, Mapping):
        raise ConfigError(f"rollout config: {where} must be an object of container fields")
    parsed = parse_dataclass(type(base), overrides, file="rollout config", where=where)
    return dataclasses.replace(base, **{key: getattr(parsed, key) for key in overrides})


def job_template(options: K8sOptions, runner: Mapping[str, Any]) -> JobTemplate:
    """The Job template with the fields a rollout sets in `config.runner.k8s`; a bad one raises ConfigError."""
    return _overridden(options.job, runner.get("k8s"), where="runner.k8s")


def grader_template(
    options: K8sOptions, grader: Mapping[str, Any] | None, command: tuple[str, ...] = ()
) -> GraderTemplate:
    """The grading container of a graded rollout: the options' grader with the rollout's `config.grader.k8s`
    fields; `command` (the plan's grader command: the rollout's `config.grader.command` or the runner's
    `grader_command`) wins over the configured one. ConfigError when none is left or an override is bad."""
    template = _overridden(options.grader, (grader or {}).get("k8s"), where="grader.k8s")
    if command:
        template = dataclasses.replace(template, command=tuple(command))
    if not template.command:
        raise ConfigError(
            "the rollout has a grading step but no grader command: set [addons.runner] grader_command, "
            "[addons.runner.k8s.grader] command or the rollout's config.grader.command"
        )
    return template
