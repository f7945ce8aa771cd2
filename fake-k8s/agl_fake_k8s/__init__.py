"""A fake Kubernetes API server that the real `kubernetes` client (sync and `kubernetes.aio`) cannot tell from a
real one, with a Job controller, a garbage collector, a scheduler and a kubelet that runs containers as local
subprocesses; see the README of its distribution (fake-k8s/README.md).

    async with running_fake_k8s(FakeK8sConfig(timings=Timings(time_scale=0.01))) as k8s:
        api = kubernetes.client.BatchV1Api(kubernetes.client.ApiClient(k8s.api_client_config()))
        ...
        job = await k8s.wait_for_job("default", "agl-1", "Complete")
"""

from agl_fake_k8s.config import FakeK8sConfig, Timings
from agl_fake_k8s.env import expand, mount_env_name
from agl_fake_k8s.observe import RequestRecord
from agl_fake_k8s.server import FakeK8s, running_fake_k8s
from agl_fake_k8s.status import ApiError

__all__ = [
    "ApiError",
    "FakeK8s",
    "FakeK8sConfig",
    "RequestRecord",
    "Timings",
    "expand",
    "mount_env_name",
    "running_fake_k8s",
]
