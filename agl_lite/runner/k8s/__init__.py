"""The Kubernetes backend of the runner: one Job per rollout, retried by the Job, recorded by the controller.

`K8sBackend` is what `[addons.runner] backend = "k8s"` loads (lazily: the `kubernetes` client is the `k8s` extra).
The pieces: `names` and `manifest` (what is created, pure), `options` (the `[addons.runner.k8s]` table), `kube`
(the thin adapter over `kubernetes.aio`), `ratelimit`, `informer` + `cache` (list-then-watch), `views` (what a Job
or pod state means), `follow` (one rollout's pods to attempts), `cleanup` (deleting Jobs once their outcome is
recorded) and `backend` (what the runner core calls). See docs/controller.md.
"""

from agl_lite.runner.k8s.backend import K8sBackend

__all__ = ["K8sBackend"]
