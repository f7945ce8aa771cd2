"""Replays the transcripts of a real kube-apiserver v1.20.2 (fixtures/k8s-1.20 beside this file, see its README)
against the fake, request for request over raw HTTP, and compares status codes and whole bodies after normalising
what must differ (uids, times, resourceVersions, random name suffixes).

As when the transcripts were recorded, no scheduler and no kubelet run: the test binds pods and writes their
status itself. Known differences (the fake keeps modern Job fields, its Job controller reacts at once) are
documented in fake-k8s/README.md and not replayed here.
"""

from __future__ import annotations

import asyncio
import difflib
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agl_fake_k8s import FakeK8s, FakeK8sConfig, running_fake_k8s

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "k8s-1.20"
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
SUFFIX = re.compile(r"\b(agl-[a-z]+)-[bcdfghjklmnpqrstvwxz2456789]{5}\b")
JOBS = "/apis/batch/v1/namespaces/default/jobs"
PODS = "/api/v1/namespaces/default/pods"


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def ndjson(name: str) -> list[Any]:
    return [json.loads(line) for line in (FIXTURES / name).read_text().splitlines() if line.strip()]


def transcript_status(step: str) -> int:
    """The status code the real server answered, from the step's .http transcript."""
    for line in (FIXTURES / f"{step}.http").read_text().splitlines():
        if m := re.match(r"< HTTP/1\.1 (\d{3}) ", line):
            return int(m[1])
    raise AssertionError(f"no status line in {step}.http")


def normalize(value: Any, key: str | None = None) -> Any:
    """Blank out what differs between two servers by nature; keep everything else for an exact comparison."""
    if isinstance(value, dict):
        out = {normalize(k): normalize(v, k) for k, v in value.items()}
        if key == "metadata" and "managedFields" in out:  # same-second entries sort by manager name
            out["managedFields"] = sorted(out["managedFields"], key=lambda e: (e["operation"], e["manager"]))
        return out
    if isinstance(value, list):
        return [normalize(v) for v in value]
    if isinstance(value, str):
        if key == "resourceVersion":
            return "<rv>"
        return SUFFIX.sub(r"\1-<rand>", TIME.sub("<time>", UUID.sub("<uid>", value)))
    return value


def same(real: Any, ours: Any) -> None:
    """Equal after normalising; on a mismatch the message is a diff of the two (real first)."""
    expected, got = normalize(real), normalize(ours)
    if got != expected:
        lines = [json.dumps(x, indent=1, sort_keys=True).splitlines() for x in (expected, got)]
        diff = "\n".join(difflib.unified_diff(*lines, "real", "fake", lineterm="", n=2))
        raise AssertionError(f"the fake differs from the real server:\n{diff}")


def same_items(real: Any, ours: Any) -> None:
    """Lists whose item order depends on random names: compared as multisets."""
    assert normalize({**ours, "items": []}) == normalize({**real, "items": []})

    def key(item: Any) -> str:
        return json.dumps(normalize(item), sort_keys=True)

    assert sorted(map(key, ours["items"])) == sorted(map(key, real["items"]))


@dataclass
class Replay:
    k8s: FakeK8s
    http: aiohttp.ClientSession

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body, separators=(",", ":"))
        async with self.http.request(method, self.k8s.url + path, data=data) as response:
            return response.status, await response.json()

    async def step(self, step: str, method: str, path: str, *, body: Any = None) -> Any:
        """Send a transcript step; the status must be the real one. Returns our body."""
        if body is None and (FIXTURES / f"{step}.request.json").exists():
            body = fixture(f"{step}.request.json")
        status, ours = await self.call(method, path, body)
        assert status == transcript_status(step), ours
        return ours

    async def pod_names(self, job: str, count: int) -> list[str]:
        pods = await self.k8s.wait_for_pods("default", f"job-name={job}", lambda p: len(p) >= count)
        pods.sort(key=lambda p: int(p["metadata"]["resourceVersion"]))
        return [p["metadata"]["name"] for p in pods]

    async def bind_and_finish(self, step_binding: str, step_status: str, name: str) -> Any:
        """What the recording script did in place of scheduler and kubelet: a Binding, then a status PUT."""
        binding = fixture(f"{step_binding}.request.json")
        binding["metadata"]["name"] = name
        same(
            fixture(f"{step_binding}.json"),
            await self.step(step_binding, "POST", f"{PODS}/{name}/binding", body=binding),
        )
        _, pod = await self.call("GET", f"{PODS}/{name}")
        status = fixture(f"{step_status}.request.json")["status"]
        pod["status"] = {**status, "conditions": pod["status"]["conditions"]}  # the script echoed them
        return await self.step(step_status, "PUT", f"{PODS}/{name}/status", body=pod)


@pytest.fixture
async def replay() -> AsyncIterator[Replay]:
    config = FakeK8sConfig(run_scheduler=False, run_kubelet=False)
    async with running_fake_k8s(config) as k8s:
        headers = {
            "Authorization": f"Bearer {k8s.token}",
            "User-Agent": "OpenAPI-Generator/37.0.2/python",
            "Accept": "application/json",
            "Content-Type": "application/json",
        }
        async with aiohttp.ClientSession(headers=headers) as http:
            yield Replay(k8s, http)


async def watch_lines(replay: Replay, path: str, count: int) -> list[Any]:
    async with replay.http.get(replay.k8s.url + path) as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "application/json"
        return [json.loads(await response.content.readline()) for _ in range(count)]


async def test_create_get_and_list_match_the_transcript(replay: Replay) -> None:
    same(fixture("01-post-job-201.json"), await replay.step("01-post-job-201", "POST", JOBS))
    same(fixture("01b-post-job-again-409.json"), await replay.step("01b-post-job-again-409", "POST", JOBS))
    await replay.pod_names("agl-fail", 1)
    same(fixture("02-get-job.json"), await replay.step("02-get-job", "GET", f"{JOBS}/agl-fail"))
    query = "?labelSelector=app.kubernetes.io%2Fmanaged-by%3Dagl-lite"
    same(
        fixture("03-list-jobs-labelselector.json"),
        await replay.step("03-list-jobs-labelselector", "GET", JOBS + query),
    )
    query = "?labelSelector=job-name%3Dagl-fail"
    same(
        fixture("04-list-pods-job-name.json"), await replay.step("04-list-pods-job-name", "GET", PODS + query)
    )


@pytest.mark.parametrize(
    ("step", "method", "path"),
    [
        ("02b-get-missing-job-404", "GET", f"{JOBS}/does-not-exist"),
        ("02c-post-invalid-job-422", "POST", JOBS),
        ("02d-post-invalid-restartpolicy-422", "POST", JOBS),
    ],
)
async def test_error_bodies_are_the_real_ones_byte_for_byte(
    replay: Replay, step: str, method: str, path: str
) -> None:
    assert await replay.step(step, method, path) == fixture(f"{step}.json")


async def test_a_failing_job_retries_fails_and_orphans_its_pods_as_recorded(replay: Replay) -> None:
    await replay.step("01-post-job-201", "POST", JOBS)
    (first,) = await replay.pod_names("agl-fail", 1)
    _, listed = await replay.call("GET", f"{PODS}?labelSelector=job-name%3Dagl-fail")
    pod_watch = asyncio.ensure_future(
        watch_lines(
            replay,
            f"{PODS}?watch=true&labelSelector=job-name%3Dagl-fail&resourceVersion={listed['metadata']['resourceVersion']}",
            7,
        )
    )
    same(
        fixture("05a-pod1-status-put.json"),
        await replay.bind_and_finish("05a-pod1-binding", "05a-pod1-status-put", first),
    )
    second = (await replay.pod_names("agl-fail", 2))[1]
    same_items(
        fixture("05b-list-pods-after-retry.json"),
        await replay.step("05b-list-pods-after-retry", "GET", f"{PODS}?labelSelector=job-name%3Dagl-fail"),
    )
    same(
        fixture("05c-pod2-status-put.json"),
        await replay.bind_and_finish("05c-pod2-binding", "05c-pod2-status-put", second),
    )
    await replay.k8s.wait_for_job("default", "agl-fail", "Failed")
    same(
        fixture("05d-get-job-failed.json"), await replay.step("05d-get-job-failed", "GET", f"{JOBS}/agl-fail")
    )

    deleted = await replay.step("10-delete-job-default-propagation", "DELETE", f"{JOBS}/agl-fail")
    same(fixture("10-delete-job-default-propagation.json"), deleted)
    await replay.k8s.wait_for(lambda: replay.k8s.get("jobs", "default", "agl-fail") is None)
    orphans = await replay.step(
        "10b-list-pods-after-default-delete", "GET", f"{PODS}?labelSelector=job-name%3Dagl-fail"
    )
    same_items(fixture("10b-list-pods-after-default-delete.json"), orphans)

    events = await asyncio.wait_for(pod_watch, 10)
    recorded = ndjson("06c-watch-pods.ndjson")[:7]
    same(recorded[:5], events[:5])
    same_items({"items": recorded[5:]}, {"items": events[5:]})  # the two orphaning updates, in either order


async def test_a_complete_job_and_its_background_delete_match_the_transcript(replay: Replay) -> None:
    _, listed = await replay.call("GET", JOBS)
    job_watch = asyncio.ensure_future(
        watch_lines(replay, f"{JOBS}?watch=true&resourceVersion={listed['metadata']['resourceVersion']}", 4)
    )
    same(fixture("07-post-job-ok.json"), await replay.step("07-post-job-ok", "POST", JOBS))
    (pod,) = await replay.pod_names("agl-ok", 1)
    same(
        fixture("07a-pod-status-put.json"),
        await replay.bind_and_finish("07a-pod-binding", "07a-pod-status-put", pod),
    )
    await replay.k8s.wait_for_job("default", "agl-ok", "Complete")
    same(
        fixture("07b-get-job-complete.json"),
        await replay.step("07b-get-job-complete", "GET", f"{JOBS}/agl-ok"),
    )
    same(
        fixture("07c-delete-job-background.json"),
        await replay.step("07c-delete-job-background", "DELETE", f"{JOBS}/agl-ok"),
    )
    await replay.k8s.wait_for(lambda: not replay.k8s.objects("pods"))
    same(
        fixture("07e-list-pods-after-gc.json"),
        await replay.step("07e-list-pods-after-gc", "GET", f"{PODS}?labelSelector=job-name%3Dagl-ok"),
    )
    same(fixture("11-list-pods-all-end.json"), await replay.step("11-list-pods-all-end", "GET", PODS))

    events = await asyncio.wait_for(job_watch, 10)
    # ADDED, MODIFIED (started), MODIFIED (Complete), DELETED: the agl-ok lines of the recorded job watch
    same([e for e in ndjson("06-watch-jobs.ndjson") if e["object"]["metadata"]["name"] == "agl-ok"], events)


async def test_an_exact_list_at_an_old_resource_version_is_served_from_history(replay: Replay) -> None:
    ours = await replay.step(
        "08c-list-jobs-rv1-exact", "GET", f"{JOBS}?resourceVersion=1&resourceVersionMatch=Exact"
    )
    assert ours == fixture("08c-list-jobs-rv1-exact.json")


async def test_a_watch_from_a_compacted_resource_version_gets_410_inside_a_200_stream(replay: Replay) -> None:
    await replay.step("07-post-job-ok", "POST", JOBS)
    replay.k8s.compact_history()
    async with replay.http.get(
        f"{replay.k8s.url}{JOBS}?watch=true&resourceVersion=1&timeoutSeconds=5"
    ) as response:
        assert response.status == 200
        lines = (await response.read()).splitlines()
    (recorded,) = ndjson("08e-watch-jobs-rv1-after-restart.ndjson")
    (ours,) = [json.loads(line) for line in lines]
    number = re.compile(r"\(\d+\)")
    recorded["object"]["message"] = number.sub("(N)", recorded["object"]["message"])
    ours["object"]["message"] = number.sub("(N)", ours["object"]["message"])
    assert ours == recorded


async def test_a_bookmark_has_the_recorded_shape(replay: Replay) -> None:
    async with replay.http.get(f"{replay.k8s.url}{JOBS}?watch=true&allowWatchBookmarks=true") as response:
        await replay.k8s.wait_for(lambda: replay.k8s.open_watches == 1)
        assert replay.k8s.send_bookmarks() == 1
        ours = json.loads(await response.content.readline())
    same(ndjson("06b-watch-jobs-bookmarks.ndjson")[-1], ours)
