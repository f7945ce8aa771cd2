"""What a fake cluster is told at start: its timings, its node, its token, which controllers run.

Every delay the fake takes is here, so tests inject short ones instead of sleeping: the backoffs default to 0
(each field says what a real cluster does) and `time_scale` shrinks the durations objects ask for.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["DEFAULT_NAMESPACES", "FakeK8sConfig", "Timings"]


@dataclass(frozen=True, slots=True)
class Timings:
    """Delays of the fake cluster, in seconds (scaled durations are the objects' own, times `time_scale`)."""

    time_scale: float = 1.0
    """Multiplies every duration read from an object: activeDeadlineSeconds, terminationGracePeriodSeconds,
    deletion grace periods and ttlSecondsAfterFinished (0.01 turns a 30 s grace period into 0.3 s)."""
    job_backoff_s: float = 0.0
    """Delay before the second retry of a failed Job pod, doubling per failure (real: 10 s; the first retry is
    immediate in both)."""
    job_backoff_max_s: float = 360.0
    """Cap of the Job retry delay (real: 6 min)."""
    container_restart_backoff_s: float = 0.0
    """Delay before a container of a restartPolicy OnFailure/Always pod restarts (real: 10 s, doubling)."""
    bookmark_interval_s: float = 60.0
    """How often an idle watch with allowWatchBookmarks gets a BOOKMARK (real: about a minute); one is also sent
    just before a watch's timeoutSeconds ends, as a 1.20 server does."""


DEFAULT_NAMESPACES = frozenset({"default", "kube-system", "kube-public", "kube-node-lease"})
"""What a fresh cluster has."""


@dataclass(frozen=True, slots=True)
class FakeK8sConfig:
    """How `running_fake_k8s` builds the fake cluster."""

    timings: Timings = Timings()
    """Injectable delays, see `Timings`."""
    token: str | None = None
    """The bearer token the API server accepts; None draws a random one."""
    namespaces: frozenset[str] | None = DEFAULT_NAMESPACES
    """Namespaces that exist (no Namespace objects are served): a fresh cluster's by default, and as on a real
    server anything in another namespace is a 404 `namespaces "X" not found`; None lets every namespace exist."""
    history_limit: int = 10_000
    """Watch events kept for replay from a resourceVersion; an older resourceVersion gets 410 Expired."""
    node_name: str = "fake-node"
    """The one node: the scheduler binds pods to it and its kubelet runs them."""
    max_pods: int | None = None
    """Pods the node runs at once; the rest stay Pending and unscheduled (None: no limit)."""
    run_scheduler: bool = True
    """Bind new pods to the node (off for replaying transcripts recorded without a scheduler)."""
    run_kubelet: bool = True
    """Run the containers of the node's pods as local subprocesses."""
    run_job_controller: bool = True
    """Run the Job controller (pods from Jobs, retries, conditions, deadlines, TTL)."""
    run_garbage_collector: bool = True
    """Delete or orphan the dependents of deleted owners (ownerReferences)."""
    images: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Image name -> entrypoint, for containers that give `args` or nothing but no `command`."""
    base_env: Mapping[str, str] | None = None
    """Environment every container starts from (an image's ENV); None takes PATH, HOME and LANG from this process."""
    rewrite_paths: bool = True
    """Map volume mountPaths and terminationMessagePath in command, args, env values and workingDir to the
    pod's real temporary directories (a fake-only convenience, so manifests need no test-only paths)."""
    work_root: Path | None = None
    """Where pods' temporary directories go; None makes a temporary directory removed at exit."""
