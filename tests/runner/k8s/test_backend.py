"""The Kubernetes backend end to end (issue #5, Kubernetes acceptance): the runner addon of a real gateway runs each
rollout as a Job on the fake cluster through the real `kubernetes` client; the kubelet runs agents as local
processes that call the gateway back with exactly the env their Job gave them."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.aio.client import ApiClient, BatchV1Api

from agl_lite.core.contract import KeyRole, derive_key
from agl_lite.runner.k8s import backend as backend_module
from agl_lite.runner.k8s.names import job_name
from agl_lite.store.records import AttemptStatus, RolloutConfig, RolloutStatus
from agl_lite.store.rules import RolloutSpec
from tests.conftest import ADMIN_KEY
from tests.runner.agents import GRADED_AGENT, GRADER, SH_AGENT
from tests.runner.k8s.conftest import NAMESPACE, PodSpy, k8s_spec
from tests.runner.probe import Probe, exited, running_probe

RBAC = Path(__file__).resolve().parents[3] / "deploy" / "k8s" / "rbac.yaml"

PY_AGENT = """
import json, os
from openai import OpenAI

task = json.loads(os.environ["AGL_TASK_INPUT"])
client = OpenAI(max_retries=0)  # OPENAI_BASE_URL and OPENAI_API_KEY come from the Job
reply = client.chat.completions.create(
    model="smollm2", messages=[{"role": "user", "content": task["question"]}], max_tokens=8
)
print("answer:", reply.choices[0].message.content)
"""

FAIL_ONCE = """
import json, os, sys
marker = json.loads(os.environ["AGL_TASK_INPUT"])["marker"]
if not os.path.exists(marker):
    open(marker, "w").close()
    print("first attempt: failing on purpose")
    sys.exit(1)
"""


def reporting_agent(probe: Probe, then: str = "wait") -> list[str]:
    """Reports its pid (and a child's) to the probe, then runs `then` (`wait`: forever, for the child sleeps).
    The kubelet expands a container's command as Kubernetes does, `$$` to `$`: the shell's `$$` is `$$$$`. (The
    child's output goes nowhere: the fake kubelet waits for the end of the container's output, not only its
    main process.)"""
    report = f'curl -sf "{probe.url}/started/$AGL_ROLLOUT_ID?pid=$$$$&child=$!" >/dev/null'
    script = f"sleep 60 >/dev/null 2>&1 & {report}; {then}"
    return ["/bin/sh", "-c", script]


async def test_a_python_agent_using_the_openai_sdk_completes_with_the_pod_uid_as_attempt_id(
    start: Any,
) -> None:
    async with start() as s, PodSpy(s.cluster) as spy:
        (rid,) = await s.enqueue([k8s_spec([sys.executable, s.script("agent.py", PY_AGENT)])])
        done = await s.wait([rid])
        (attempt,) = await s.client.attempts(rid)
        (call,) = await s.client.calls(rid)
    assert done[rid].status is RolloutStatus.SUCCEEDED, done[rid].message
    assert (attempt.status, attempt.exit_code) == (AttemptStatus.SUCCEEDED, 0)
    assert spy.of(rid) == {attempt.id}
    assert (call.attempt_id, call.outcome.value) == (attempt.id, "ok")


async def test_an_agent_in_sh_and_curl_completes(start: Any) -> None:
    async with start() as s:
        (rid,) = await s.enqueue([k8s_spec(["/bin/sh", s.script("agent.sh", SH_AGENT)])])
        done = await s.wait([rid])
        (attempt,) = await s.client.attempts(rid)
        (call,) = await s.client.calls(rid)
        notes = await s.client.events(rid, kind="note")
    assert done[rid].status is RolloutStatus.SUCCEEDED, done[rid].message
    assert (call.attempt_id, call.outcome.value) == (attempt.id, "ok")
    assert [(e.data, e.source, e.attempt_id) for e in notes] == [({"lang": "sh"}, "agent", attempt.id)]


async def test_a_failed_first_pod_is_retried_by_the_job_as_a_new_attempt(start: Any, tmp_path: Path) -> None:
    async with start() as s, PodSpy(s.cluster) as spy:
        task = {"marker": str(tmp_path / "failed-once")}
        (rid,) = await s.enqueue(
            [k8s_spec([sys.executable, s.script("a.py", FAIL_ONCE)], task, max_attempts=2)]
        )
        done = await s.wait([rid])
        first, second = await s.client.attempts(rid)
    assert done[rid].status is RolloutStatus.SUCCEEDED, done[rid].message
    assert (first.status, first.exit_code, first.seq) == (AttemptStatus.FAILED, 1, 1)
    assert (second.status, second.exit_code, second.seq) == (AttemptStatus.SUCCEEDED, 0, 2)
    assert spy.of(rid) == {first.id, second.id}  # two pods, two UIDs, two attempts
    assert "failing on purpose" in (first.message or "")  # the log tail (FallbackToLogsOnError)


async def test_a_non_retryable_exit_code_fails_the_rollout_at_once(start: Any) -> None:
    async with start(k8s={"non_retryable_exit_codes": [3]}) as s:
        (rid,) = await s.enqueue([k8s_spec(["/bin/sh", "-c", "exit 3"], max_attempts=3)])
        done = await s.wait([rid])
        attempts = await s.client.attempts(rid)
    assert done[rid].status is RolloutStatus.FAILED
    assert "PodFailurePolicy" in (done[rid].message or "")
    assert [(a.status, a.exit_code) for a in attempts] == [(AttemptStatus.FAILED, 3)]


async def test_retries_end_at_the_attempts_allowed(start: Any) -> None:
    async with start() as s:
        (rid,) = await s.enqueue([k8s_spec(["/bin/sh", "-c", "exit 1"], max_attempts=2)])
        done = await s.wait([rid])
        attempts = await s.client.attempts(rid)
    assert done[rid].status is RolloutStatus.FAILED
    assert "BackoffLimitExceeded" in (done[rid].message or "")
    assert [(a.status, a.exit_code) for a in attempts] == [(AttemptStatus.FAILED, 1)] * 2


async def test_an_evicted_pod_is_lost_and_burns_no_retry(start: Any) -> None:
    async with running_probe() as probe, start() as s:
        probe.hold = True  # agents wait in their report until released
        (rid,) = await s.enqueue([k8s_spec(reporting_agent(probe, then="exit 0"), max_attempts=2)])
        await probe.wait_started(rid)
        (first,) = s.pods(rid)
        complete = asyncio.ensure_future(s.cluster.wait_for_job(NAMESPACE, job_name(rid), "Complete", 30))
        assert s.cluster.evict_pod(NAMESPACE, first["metadata"]["name"])
        await s.cluster.wait_for_pods(
            NAMESPACE,
            "",
            lambda pods: (
                len([p for p in pods if p["metadata"]["annotations"].get("agl-lite/rollout-id") == rid]) == 2
            ),
        )
        probe.release()
        job = await complete
        done = await s.wait([rid])
        lost, second = await s.client.attempts(rid)
    assert done[rid].status is RolloutStatus.SUCCEEDED, done[rid].message
    assert (lost.id, lost.status) == (first["metadata"]["uid"], AttemptStatus.LOST)
    assert (lost.message or "").startswith("pod Evicted (TerminationByKubelet): The node was low on resource")
    assert second.status is AttemptStatus.SUCCEEDED
    assert job["status"].get("failed", 0) == 0  # the Job did not count the eviction against backoffLimit


async def test_a_hanging_agent_is_killed_at_its_deadline(start: Any) -> None:
    async with running_probe() as probe, start() as s:
        # 300 s of the rollout's timeout is 3 s on the fake's clock (time_scale 0.01)
        (rid,) = await s.enqueue([k8s_spec(reporting_agent(probe), timeout_s=300)])
        pids = await probe.wait_started(rid)
        done = await s.wait([rid])
        (attempt,) = await s.client.attempts(rid)
        for pid in pids:  # the agent and the child it started
            await exited(pid)
    assert done[rid].status is RolloutStatus.FAILED
    assert attempt.status is AttemptStatus.TIMEOUT
    assert "DeadlineExceeded" in (attempt.message or "") + (done[rid].message or "")


async def test_cancel_deletes_the_job_and_kills_the_agent(start: Any) -> None:
    async with running_probe() as probe, start() as s:
        (rid,) = await s.enqueue([k8s_spec(reporting_agent(probe), max_attempts=3)])
        pids = await probe.wait_started(rid)
        await s.client.cancel(rid, "not needed any more")
        for pid in pids:
            await exited(pid)
        await s.cluster.wait_for(lambda: s.cluster.get("jobs", NAMESPACE, job_name(rid)) is None or None)
        rollout, attempts = await s.client.get_rollout_with_attempts(rid)
    assert rollout.status is RolloutStatus.CANCELLED
    assert [a.status for a in attempts] == [AttemptStatus.CANCELLED]  # and no retry


async def test_the_reward_is_in_before_the_rollout_reaches_the_completion_cursor(
    start: Any, tmp_path: Path
) -> None:
    async with start() as s, PodSpy(s.cluster) as spy:
        grader = {"command": [sys.executable, s.script("grader.py", GRADER)]}
        agent = [sys.executable, s.script("agent.py", GRADED_AGENT)]
        tasks = [{"a": 2, "b": 3, "env_dump": str(tmp_path / f"env{i}.json")} for i in range(2)]
        ids = await s.enqueue(
            [
                RolloutSpec(
                    t,
                    config=RolloutConfig(runner={"k8s": {"command": agent}}, grader=grader),
                    metadata={"expected": e},
                )
                for t, e in zip(tasks, (5, 6), strict=True)
            ]
        )
        seen = await s.follow_completions(2, wait_s=30)
    assert [(seen[i].status, seen[i].reward) for i in ids] == [("succeeded", 1.0), ("succeeded", 0.0)]
    for i, rid in enumerate(ids):
        env = json.loads((tmp_path / f"env{i}.json").read_text())
        assert "AGL_GRADER_KEY" not in env
        assert derive_key(ADMIN_KEY, rid, KeyRole.GRADER) not in env.values()
        assert ADMIN_KEY not in env.values()
        assert env["OPENAI_API_KEY"] == derive_key(ADMIN_KEY, rid, KeyRole.AGENT)
        assert spy.of(rid) == {env["AGL_ATTEMPT_ID"]}
        assert env["AGL_RESULT_DIR"]


async def test_a_job_deleted_by_hand_is_relaunched_with_the_attempts_left(start: Any) -> None:
    async with running_probe() as probe, start() as s:
        probe.hold = True
        (rid,) = await s.enqueue([k8s_spec(reporting_agent(probe, then="exit 0"), max_attempts=2)])
        await probe.wait_started(rid)
        name = job_name(rid)
        first = s.cluster.get("jobs", NAMESPACE, name)
        assert first is not None
        async with ApiClient(
            s.cluster.aio_api_client_config()
        ) as api:  # kubectl delete job, as an operator would
            await BatchV1Api(api).delete_namespaced_job(name, NAMESPACE, propagation_policy="Background")
        second = await s.cluster.wait_for(
            lambda: (
                (j := s.cluster.get("jobs", NAMESPACE, name))
                and j["metadata"]["uid"] != first["metadata"]["uid"]
                and j
            )
        )
        probe.release()
        done = await s.wait([rid])
        lost, retried = await s.client.attempts(rid)
    assert done[rid].status is RolloutStatus.SUCCEEDED, done[rid].message
    assert second["spec"]["backoffLimit"] == 0  # one attempt was used; one is left
    assert (lost.status, lost.message) == (AttemptStatus.LOST, "its Job vanished")
    assert retried.status is AttemptStatus.SUCCEEDED


async def test_a_runner_only_controller_runs_the_rollouts_of_a_remote_gateway(start: Any) -> None:
    async with start(with_runner=False) as gw:
        url = f"http://127.0.0.1:{gw.gateway.port}"
        async with start(directory="controller", store_url=url) as ctl:
            (rid,) = await gw.enqueue([k8s_spec(["/bin/sh", gw.script("agent.sh", SH_AGENT)])])
            done = await gw.wait([rid])
            (call,) = await gw.client.calls(rid)
            (attempt,) = await gw.client.attempts(rid)
            assert ctl.backend.jobs_created == 1
    assert done[rid].status is RolloutStatus.SUCCEEDED, done[rid].message
    assert (call.attempt_id, call.outcome.value) == (attempt.id, "ok")


async def test_a_bad_job_override_fails_the_rollout_with_a_message_naming_the_key(start: Any) -> None:
    async with start() as s:
        (rid,) = await s.enqueue([k8s_spec(["true"], k8s={"imagePullPolicy": "Always"})])
        done = await s.wait([rid])
        jobs = s.jobs()
    assert done[rid].status is RolloutStatus.FAILED
    assert "runner.k8s.imagePullPolicy" in (done[rid].message or "")
    assert jobs == []


async def test_a_job_of_the_same_name_from_another_rollout_is_never_adopted(start: Any) -> None:
    labels = {"app.kubernetes.io/managed-by": "agl-lite", "app.kubernetes.io/instance": "agl-lite"}
    container = {"name": "agent", "image": "a:1", "command": ["/bin/sh", "-c", "exit 0"]}
    foreign = {
        "metadata": {
            "name": "agl-ro-taken",
            "labels": labels,
            "annotations": {"agl-lite/rollout-id": "someone"},
        },
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [container]}}},
    }
    async with start() as s:
        s.cluster.create("jobs", NAMESPACE, foreign)
        (rid,) = await s.enqueue([RolloutSpec({"q": 1}, id="ro-taken")])
        done = await s.wait([rid])
    assert done[rid].status is RolloutStatus.FAILED
    assert "belongs to rollout 'someone'" in (done[rid].message or "")


# --- the informers: a dropped watch, a forced 410 ------------------------------------------------------------------


async def test_a_dropped_watch_and_an_expired_resource_version_lose_no_outcome(start: Any) -> None:
    async with running_probe() as probe, start() as s:
        probe.hold = True
        ids = await s.enqueue([k8s_spec(reporting_agent(probe, then="exit 0")) for _ in range(3)])
        await probe.wait_count(3)
        informers = {i.kind: i for i in s.backend.informers}
        lists_before = {kind: i.lists for kind, i in informers.items()}
        s.cluster.expire_next_watches(2)  # the watches reopened next are refused with 410 Expired...
        assert s.cluster.drop_watches(abrupt=True) >= 2  # ...after both are cut mid-stream
        probe.release()  # the agents end while the informers relist
        done = await s.wait(ids)
        for rid in ids:
            (attempt,) = await s.client.attempts(rid)
            assert attempt.status is AttemptStatus.SUCCEEDED
    assert {r.status for r in done.values()} == {RolloutStatus.SUCCEEDED}
    assert all(i.lists > lists_before[kind] for kind, i in informers.items())


async def test_a_watch_ended_by_the_server_resumes_without_a_relist(start: Any) -> None:
    async with running_probe() as probe, start() as s:
        probe.hold = True
        (rid,) = await s.enqueue([k8s_spec(reporting_agent(probe, then="exit 0"))])
        await probe.wait_started(rid)
        lists_before = [i.lists for i in s.backend.informers]
        opened = s.cluster.watches_opened
        assert s.cluster.drop_watches() >= 2  # a clean end, as at timeoutSeconds
        await s.cluster.wait_for(lambda: s.cluster.watches_opened >= opened + 2 or None)
        probe.release()
        done = await s.wait([rid])
    assert done[rid].status is RolloutStatus.SUCCEEDED
    assert [i.lists for i in s.backend.informers] == lists_before  # resumed from its resourceVersion


# --- restarts and scale --------------------------------------------------------------------------------------------


async def test_a_controller_restart_adopts_its_jobs_and_creates_no_duplicate(start: Any) -> None:
    async with running_probe() as probe:
        probe.hold = True
        async with start() as s:
            ids = await s.enqueue(
                [k8s_spec(reporting_agent(probe, then="exit 0"), max_attempts=2) for _ in range(3)]
            )
            await probe.wait_count(3)
        # the controller is gone; its Jobs run on. A new one, on the same store:
        async with start() as s:
            probe.release()
            done = await s.wait(ids)
            creates = s.cluster.requests[("create", "jobs")]
            conflicts = s.cluster.responses_by_status[409]
            adopted = s.backend.jobs_adopted
    assert {r.status for r in done.values()} == {RolloutStatus.SUCCEEDED}
    assert (creates, adopted) == (3, 3)
    assert conflicts == 0  # adopted from the informers' cache: not even a create answered 409


async def test_two_hundred_rollouts_finish_at_twenty_requests_a_second(start: Any) -> None:
    qps, burst, n = 20.0, 20, 200
    async with start(k8s={"qps": qps, "burst": burst}) as s:
        bucket = s.backend._kube.bucket
        # When each request was scheduled to go: what the bucket decides. Answer times (the server's) and wake-up
        # times (after a loop stall on a busy machine) bunch up; the schedule is exact.
        granted: list[float] = []
        reserve = bucket.reserve

        def recording() -> float:
            delay = reserve()
            granted.append(time.monotonic() + delay)
            return delay

        bucket.reserve = recording  # type: ignore[method-assign]
        ids = await s.enqueue([k8s_spec(["/bin/sh", "-c", "exit 0"]) for _ in range(n)])
        done = await s.wait(ids, timeout=90)
        await s.cluster.wait_for(lambda: not s.jobs() or None, timeout=30)  # each deleted after its outcome
        api = s.backend._kube
        log = s.cluster.request_log
    sent = [r.at for r in log if r.verb != "watch"]
    assert {r.status for r in done.values()} == {RolloutStatus.SUCCEEDED}
    assert len(done) == n
    assert (api.calls[("create", "jobs")], api.calls[("create", "secrets")]) == (n, n)  # no Job twice
    deletes = api.calls[("deletecollection", "jobs")] + api.calls[("delete", "jobs")]
    assert 4 <= deletes <= n / 4  # finished Jobs go a page per request
    # the bucket set the pace: past the burst, the requests took at least (count - burst) / qps seconds...
    assert sent[-1] - sent[0] >= (len(sent) - burst) / qps * 0.95
    assert api.bucket.waited_s > 0
    # ...and no 5 s window saw more than the burst and 5 s worth (loop stalls on a busy machine bunch a few up)
    assert len(granted) >= n
    granted.sort()
    for i, t in enumerate(granted):
        assert sum(1 for u in granted[i : i + 250] if u < t + 5.0) <= burst + 5 * qps + 2


async def test_every_request_is_one_the_controllers_role_allows(start: Any) -> None:
    role = next(d for d in yaml.safe_load_all(RBAC.read_text()) if d["kind"] == "Role")
    allowed = {(v, r) for rule in role["rules"] for v in rule["verbs"] for r in rule["resources"]}
    async with running_probe() as probe, start() as s:
        (rid,) = await s.enqueue([k8s_spec(reporting_agent(probe))])
        await probe.wait_started(rid)
        await s.client.cancel(rid)
        ok = await s.enqueue([k8s_spec(["/bin/sh", "-c", "exit 0"])])
        await s.wait(ok)
        await s.backend.reconcile([])
    assert set(s.cluster.requests) <= allowed, set(s.cluster.requests) - allowed


async def test_a_namespace_that_does_not_exist_fails_the_rollout_with_the_servers_words(start: Any) -> None:
    # Issue #15, against a real 1.20 server: the create got 404 `namespaces "X" not found`, the backend retried it
    # for good (11,212 creates in 11 minutes) and the rollout stayed running with 0 attempts.
    async with start(k8s={"namespace": "nowhere"}) as s:
        (rid,) = await s.enqueue([k8s_spec(["/bin/sh", "-c", "exit 0"])])
        done = await s.wait([rid])
        creates = s.cluster.counters.by_resource[("create", "jobs")]
    assert done[rid].status is RolloutStatus.FAILED
    assert 'namespaces "nowhere" not found' in (done[rid].message or "")
    assert creates == 1


async def test_launch_retries_back_off_however_often_the_rollouts_are_marked_changed(
    start: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue #15: a reconcile marks every followed rollout changed, and the retry's pause returned at once on it,
    # and kept returning (nobody cleared the mark): the retries went at the client's full rate.
    monkeypatch.setattr(backend_module, "RETRY_S", 0.2)
    async with start() as s:
        s.cluster.fail_next_creates(1000, resource="jobs")
        started = time.monotonic()
        (rid,) = await s.enqueue([k8s_spec(["/bin/sh", "-c", "exit 0"])])

        def creates() -> int:
            return s.cluster.counters.by_resource[("create", "jobs")]

        await s.cluster.wait_for(lambda: creates() >= 1, timeout=30)
        await s.backend.reconcile([])  # every rollout marked changed, as the runner's resync does
        await s.cluster.wait_for(lambda: creates() >= 5, timeout=30)
        elapsed = time.monotonic() - started
        s.cluster.fail_next_creates(0)
        await s.backend.reconcile([])
        done = await s.wait([rid])
    # 0.2 + 0.4 + 0.8 + 1.6 s between the first five creates: not five in a row
    assert elapsed >= 2.5, elapsed
    assert done[rid].status is RolloutStatus.SUCCEEDED, done[rid].message
