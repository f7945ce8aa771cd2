"""What the kubelet does with a pod: env by Kubernetes' rules, volumes, init containers, termination messages,
restarts, and termination on delete. Pods are created with the real `kubernetes.aio` client."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes.aio.client
from kubernetes.aio.client import CoreV1Api

from agl_fake_k8s import FakeK8s, FakeK8sConfig, Timings, running_fake_k8s
from agl_fake_k8s.containers import alive
from agl_fake_k8s.manifests import container, pod_manifest, secret_manifest
from agl_fake_k8s.storage import Event

REPORT = "/dev/termination-log"


def sh(script: str) -> list[str]:
    return ["sh", "-c", script]


async def finished(k8s: FakeK8s, name: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        pod = k8s.get("pods", "default", name)
        return pod if pod and pod["status"]["phase"] in ("Succeeded", "Failed") else None

    return await k8s.wait_for(done)


def terminated(pod: dict[str, Any], index: int = 0) -> dict[str, Any]:
    state: dict[str, Any] = pod["status"]["containerStatuses"][index]["state"]["terminated"]
    return state


def is_file(path: Path) -> bool:
    return path.is_file()


async def test_env_follows_kubernetes_expansion_rules(
    k8s: FakeK8s, aio: kubernetes.aio.client.ApiClient
) -> None:
    env = [
        {"name": "BASE", "value": "hello"},
        {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "TEAM", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['team']"}}},
        {"name": "GREETING", "value": "$(BASE)-world"},
        {"name": "LITERAL", "value": "$$(BASE) and $(UNDEFINED_VAR)"},
        {"name": "FORWARD", "value": "$(LATER)"},
        {"name": "LATER", "value": "too late"},
        {"name": "URL", "value": "http://gw/r/x/a/$(POD_UID)/v1"},
    ]
    values = '"$POD_NAME" "$NS" "$TEAM" "$GREETING" "$LITERAL" "$FORWARD" "$URL" "$1"'
    script = f'printf "%s|%s|%s|%s|%s|%s|%s|%s" {values} > {REPORT}'
    main = container([*sh(script), "argv0", "$(GREETING)"], env=env)
    created = await CoreV1Api(aio).create_namespaced_pod(
        "default", pod_manifest("envy", [main], labels={"team": "rl"})
    )
    pod = await finished(k8s, "envy")
    uid = created.metadata.uid
    assert terminated(pod)["message"] == (
        f"envy|default|rl|hello-world|$(BASE) and $(UNDEFINED_VAR)|$(LATER)|http://gw/r/x/a/{uid}/v1|hello-world"
    )


async def test_a_missing_secret_holds_the_container_until_it_exists(
    k8s: FakeK8s, aio: kubernetes.aio.client.ApiClient
) -> None:
    core = CoreV1Api(aio)
    env = [{"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "keys", "key": "agent"}}}]
    await core.create_namespaced_pod(
        "default", pod_manifest("waits", [container(sh(f"printf %s $KEY > {REPORT}"), env=env)])
    )

    def config_error() -> dict[str, Any] | None:
        pod = k8s.get("pods", "default", "waits")
        waiting = (
            ((pod or {}).get("status", {}).get("containerStatuses") or [{}])[0]
            .get("state", {})
            .get("waiting")
        )
        return waiting if waiting and waiting["reason"] == "CreateContainerConfigError" else None

    waiting = await k8s.wait_for(config_error)
    assert waiting["message"] == 'secret "keys" not found'
    await core.create_namespaced_secret("default", secret_manifest("keys", {"agent": "s3cret"}))
    pod = await finished(k8s, "waits")
    assert (pod["status"]["phase"], terminated(pod)["message"]) == ("Succeeded", "s3cret")


async def test_an_empty_dir_is_shared_by_init_and_main_containers(
    k8s: FakeK8s, aio: kubernetes.aio.client.ApiClient
) -> None:
    mounts = [{"name": "work", "mountPath": "/work-area"}]
    init = container(
        sh("echo $$ > /work-area/from-init && printf %s $FAKE_K8S_MOUNT_WORK > /work-area/path"),
        name="first",
        volumeMounts=mounts,
    )
    main = container(sh(f"cat /work-area/path > {REPORT}"), volumeMounts=mounts, workingDir="/work-area")
    spec = {"initContainers": [init], "volumes": [{"name": "work", "emptyDir": {}}]}
    await CoreV1Api(aio).create_namespaced_pod("default", pod_manifest("shares", [main], **spec))
    pod = await finished(k8s, "shares")
    assert is_file(Path(terminated(pod)["message"]) / "from-init")
    assert pod["status"]["initContainerStatuses"][0]["state"]["terminated"]["reason"] == "Completed"


async def test_a_failing_init_container_fails_the_pod_before_the_main_one_starts(
    k8s: FakeK8s, aio: kubernetes.aio.client.ApiClient
) -> None:
    spec = {"initContainers": [container(sh("exit 4"), name="setup")]}
    await CoreV1Api(aio).create_namespaced_pod(
        "default", pod_manifest("no-init", [container(["true"])], **spec)
    )
    pod = await finished(k8s, "no-init")
    assert pod["status"]["phase"] == "Failed"
    assert pod["status"]["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] == 4
    assert "waiting" in pod["status"]["containerStatuses"][0]["state"]


async def test_fallback_to_logs_reports_the_output_tail_of_a_failed_container(
    k8s: FakeK8s, aio: kubernetes.aio.client.ApiClient
) -> None:
    main = container(
        sh("echo starting; echo 'Traceback: boom' >&2; exit 2"),
        terminationMessagePolicy="FallbackToLogsOnError",
    )
    await CoreV1Api(aio).create_namespaced_pod("default", pod_manifest("crashy", [main]))
    pod = await finished(k8s, "crashy")
    assert terminated(pod) | {"startedAt": "", "finishedAt": "", "containerID": ""} == {
        "exitCode": 2,
        "reason": "Error",
        "message": "starting\nTraceback: boom\n",
        "startedAt": "",
        "finishedAt": "",
        "containerID": "",
    }


async def test_a_missing_executable_is_a_start_error(
    k8s: FakeK8s, aio: kubernetes.aio.client.ApiClient
) -> None:
    await CoreV1Api(aio).create_namespaced_pod(
        "default", pod_manifest("typo", [container(["no-such-binary-x"])])
    )
    pod = await finished(k8s, "typo")
    state = terminated(pod)
    assert (pod["status"]["phase"], state["exitCode"], state["reason"]) == ("Failed", 128, "StartError")
    assert "no-such-binary-x" in state["message"]


async def test_restart_policy_on_failure_restarts_the_container(
    k8s: FakeK8s, aio: kubernetes.aio.client.ApiClient, tmp_path: Path
) -> None:
    marker = tmp_path / "tried"
    main = container(sh(f"if [ -e {marker} ]; then exit 0; fi; touch {marker}; exit 1"))
    await CoreV1Api(aio).create_namespaced_pod(
        "default", pod_manifest("again", [main], restart_policy="OnFailure")
    )
    pod = await finished(k8s, "again")
    status = pod["status"]["containerStatuses"][0]
    assert (pod["status"]["phase"], status["restartCount"]) == ("Succeeded", 1)
    assert status["lastState"]["terminated"]["exitCode"] == 1


async def test_deleting_a_pod_kills_its_process_group_after_the_grace_period(
    k8s: FakeK8s, aio: kubernetes.aio.client.ApiClient
) -> None:
    script = "trap '' TERM; sleep 30 & echo started; wait"  # ignores SIGTERM, as does its child
    spec = {"terminationGracePeriodSeconds": 5}  # 0.1 s at the tests' time scale
    await CoreV1Api(aio).create_namespaced_pod(
        "default", pod_manifest("stubborn", [container(sh(script))], **spec)
    )
    await k8s.wait_for(lambda: "started" in k8s.logs("default", "stubborn", "main"))
    pid = k8s.container_pid("default", "stubborn", "main")
    assert pid is not None

    deleted = await CoreV1Api(aio).delete_namespaced_pod("stubborn", "default")
    assert deleted.metadata.deletion_grace_period_seconds == 5  # graceful: the pod is returned, still there
    await k8s.wait_for(lambda: k8s.get("pods", "default", "stubborn") is None)
    assert not alive(pid)


async def test_the_container_log_is_served_by_pods_log(
    k8s: FakeK8s, aio: kubernetes.aio.client.ApiClient
) -> None:
    core = CoreV1Api(aio)
    await core.create_namespaced_pod(
        "default", pod_manifest("talker", [container(sh("echo one; echo two; echo three"))])
    )
    await finished(k8s, "talker")
    assert await core.read_namespaced_pod_log("talker", "default") == "one\ntwo\nthree\n"
    assert await core.read_namespaced_pod_log("talker", "default", tail_lines=1) == "three\n"


async def test_a_secret_volume_holds_one_file_per_key(
    k8s: FakeK8s, aio: kubernetes.aio.client.ApiClient
) -> None:
    core = CoreV1Api(aio)
    await core.create_namespaced_secret("default", secret_manifest("keys", {"agent": "k-1", "grader": "k-2"}))
    main = container(
        sh(f"cat /keys/grader > {REPORT}"), volumeMounts=[{"name": "keys", "mountPath": "/keys"}]
    )
    volumes = [{"name": "keys", "secret": {"secretName": "keys"}}]
    await core.create_namespaced_pod("default", pod_manifest("mounted", [main], volumes=volumes))
    pod = await finished(k8s, "mounted")
    assert terminated(pod)["message"] == "k-2"


async def test_a_restart_backoff_is_reported_as_crash_loop_back_off(tmp_path: Path) -> None:
    timings = Timings(container_restart_backoff_s=0.05)
    marker = tmp_path / "tried"
    async with running_fake_k8s(FakeK8sConfig(timings=timings)) as k8s:
        main = container(sh(f"if [ -e {marker} ]; then exit 0; fi; touch {marker}; exit 1"))
        reasons: list[str] = []

        def record(event: Event) -> None:  # every write, however fast the next one follows
            for status in event.obj.get("status", {}).get("containerStatuses", []):
                reasons.append(status["state"].get("waiting", {}).get("reason", ""))

        k8s.storage.subscribe(record)
        k8s.create("pods", "default", pod_manifest("loop", [main], restart_policy="OnFailure"))
        await finished(k8s, "loop")
    assert "CrashLoopBackOff" in reasons
