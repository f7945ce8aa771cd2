"""A container spec becomes a process: the image entrypoint for containers without a command, the base
environment, and a workingDir that does not exist on the host."""

from __future__ import annotations

from typing import Any

from agl_fake_k8s import FakeK8s, FakeK8sConfig, Timings, running_fake_k8s
from agl_fake_k8s.manifests import pod_manifest


async def finished(k8s: FakeK8s, name: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        pod = k8s.get("pods", "default", name)
        return pod if pod and pod["status"]["phase"] in ("Succeeded", "Failed") else None

    return await k8s.wait_for(done)


async def test_args_follow_the_configured_image_entrypoint_and_the_base_env_is_the_image_s() -> None:
    config = FakeK8sConfig(
        timings=Timings(time_scale=0.02),
        images={
            "agent:1": ("sh", "-c", 'printf "%s %s %s" "$0" "$GREETING" "$HOSTNAME" > /dev/termination-log')
        },
        base_env={"PATH": "/usr/bin:/bin", "GREETING": "from-image"},
    )
    async with running_fake_k8s(config) as k8s:
        main = {
            "name": "main",
            "image": "agent:1",
            "args": ["first-arg"],
            "workingDir": "/app/does-not-exist",
        }
        k8s.create("pods", "default", pod_manifest("entry", [main]))
        pod = await finished(k8s, "entry")
    assert (
        pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"]
        == "first-arg from-image entry"
    )


async def test_a_container_without_command_or_entrypoint_cannot_start(k8s: FakeK8s) -> None:
    k8s.create("pods", "default", pod_manifest("nothing", [{"name": "main", "image": "unknown:1"}]))
    pod = await finished(k8s, "nothing")
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["reason"], terminated["message"]) == ("StartError", "no command specified")
