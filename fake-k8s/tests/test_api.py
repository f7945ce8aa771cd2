"""The HTTP face of the fake API server through the real clients: Status errors, auth, faults, patches, paging,
discovery and pods/log."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import kubernetes.aio.client
import kubernetes.client
import pytest
from kubernetes.aio.client import BatchV1Api, CoreV1Api

from agl_fake_k8s import FakeK8s
from agl_fake_k8s.manifests import container, job_manifest, pod_manifest, secret_manifest

SECRETS = "/api/v1/namespaces/default/secrets"


@pytest.fixture
async def http(k8s: FakeK8s) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(
        base_url=k8s.url, headers={"Authorization": f"Bearer {k8s.token}"}
    ) as session:
        yield session


def status_of(error: kubernetes.aio.client.ApiException | kubernetes.client.ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(error.body)
    return body


async def test_a_missing_object_is_a_404_status(aio: kubernetes.aio.client.ApiClient) -> None:
    with pytest.raises(kubernetes.aio.client.ApiException) as raised:
        await BatchV1Api(aio).read_namespaced_job("nope", "default")
    assert raised.value.status == 404
    assert status_of(raised.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'jobs.batch "nope" not found',
        "reason": "NotFound",
        "details": {"name": "nope", "group": "batch", "kind": "jobs"},
        "code": 404,
    }


async def test_creating_a_job_twice_is_a_409_for_the_sync_client(
    k8s: FakeK8s, sync_api: kubernetes.client.ApiClient
) -> None:
    batch = kubernetes.client.BatchV1Api(sync_api)
    manifest = job_manifest("twice", [container(["true"])])
    await asyncio.to_thread(batch.create_namespaced_job, "default", manifest)
    with pytest.raises(kubernetes.client.ApiException) as raised:
        await asyncio.to_thread(batch.create_namespaced_job, "default", manifest)
    assert (raised.value.status, status_of(raised.value)["reason"]) == (409, "AlreadyExists")
    assert k8s.requests[("create", "jobs")] == 2


async def test_an_invalid_job_is_a_422_with_one_cause_per_error(aio: kubernetes.aio.client.ApiClient) -> None:
    manifest = job_manifest("x" * 64, [container(["true"], name="Main")], restart_policy="Always")
    with pytest.raises(kubernetes.aio.client.ApiException) as raised:
        await BatchV1Api(aio).create_namespaced_job("default", manifest)
    status = status_of(raised.value)
    assert (raised.value.status, status["reason"], status["details"]["kind"]) == (422, "Invalid", "Job")
    assert [c["field"] for c in status["details"]["causes"]] == [
        "spec.template.labels",  # job-name would be 64 characters, too long for a label value
        "spec.template.spec.containers[0].name",
        "spec.template.spec.restartPolicy",
    ]
    assert status["message"].startswith(f'Job.batch "{"x" * 64}" is invalid: [')


async def test_a_field_of_the_wrong_type_is_a_400_not_a_crash(
    k8s: FakeK8s, http: aiohttp.ClientSession
) -> None:
    manifest = job_manifest("typed", [container(["true"])])
    manifest["spec"]["backoffLimit"] = "six"
    async with http.post("/apis/batch/v1/namespaces/default/jobs", json=manifest) as response:
        body = await response.json()
    assert (response.status, body["reason"]) == (400, "BadRequest")
    assert "Job.spec.backoffLimit of type int64" in body["message"]
    assert k8s.objects("jobs") == []


@pytest.mark.parametrize(
    ("method", "path", "headers", "data", "status", "reason"),
    [
        ("POST", SECRETS, {"Content-Type": "application/json"}, b"{not json", 400, "BadRequest"),
        (
            "PATCH",
            f"{SECRETS}/s",
            {"Content-Type": "application/apply-patch+yaml"},
            b"a: 1",
            415,
            "UnsupportedMediaType",
        ),
        ("PUT", SECRETS, {"Content-Type": "application/json"}, b"{}", 405, "MethodNotAllowed"),
        ("GET", "/apis/apps/v1/namespaces/default/deployments", {}, None, 404, "NotFound"),
        ("GET", f"{SECRETS}?labelSelector=a%20in%20(", {}, None, 400, "BadRequest"),
        ("GET", f"{SECRETS}?fieldSelector=spec.foo%3Dx", {}, None, 400, "BadRequest"),
    ],
)
async def test_bad_requests_get_a_status_body(
    k8s: FakeK8s,
    http: aiohttp.ClientSession,
    method: str,
    path: str,
    headers: dict[str, str],
    data: bytes | None,
    status: int,
    reason: str,
) -> None:
    k8s.create("secrets", "default", secret_manifest("s", {"k": "v"}))
    async with http.request(method, path, headers=headers, data=data) as response:
        body = await response.json()
    assert (response.status, body["kind"], body["reason"], body["code"]) == (status, "Status", reason, status)


async def test_a_request_without_the_token_is_a_401(k8s: FakeK8s) -> None:
    config = k8s.aio_api_client_config()
    config.api_key = {"authorization": "wrong"}
    async with kubernetes.aio.client.ApiClient(config) as api:
        with pytest.raises(kubernetes.aio.client.ApiException) as raised:
            await CoreV1Api(api).list_namespaced_pod("default")
    assert (raised.value.status, status_of(raised.value)["reason"]) == (401, "Unauthorized")
    assert k8s.responses_by_status[401] == 1


async def test_a_throttle_burst_answers_429_with_retry_after_then_recovers(
    k8s: FakeK8s, http: aiohttp.ClientSession
) -> None:
    k8s.throttle_next_requests(2, retry_after_s=3)
    for _ in range(2):
        async with http.get(SECRETS) as response:
            body = await response.json()
            assert (response.status, response.headers["Retry-After"]) == (429, "3")
            assert (body["reason"], body["details"]) == ("TooManyRequests", {"retryAfterSeconds": 3})
    async with http.get(SECRETS) as response:
        assert response.status == 200
    assert (k8s.requests_by_verb["list"], k8s.responses_by_status[429]) == (3, 2)


async def test_a_stale_resource_version_and_an_injected_conflict_are_409s(
    k8s: FakeK8s, aio: kubernetes.aio.client.ApiClient
) -> None:
    core = CoreV1Api(aio)
    created = await core.create_namespaced_secret("default", secret_manifest("s", {"k": "v"}))
    await core.patch_namespaced_secret("s", "default", {"metadata": {"labels": {"a": "1"}}})
    stale = created.to_dict(serialize=True)
    with pytest.raises(kubernetes.aio.client.ApiException) as raised:
        await core.replace_namespaced_secret("s", "default", stale)
    assert status_of(raised.value)["message"] == (
        'Operation cannot be fulfilled on secrets "s": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )
    k8s.conflict_next_updates(1, resource="secrets")
    with pytest.raises(kubernetes.aio.client.ApiException) as raised:
        await core.patch_namespaced_secret("s", "default", {"metadata": {"labels": {"a": "2"}}})
    assert (raised.value.status, status_of(raised.value)["reason"]) == (409, "Conflict")
    patched = await core.patch_namespaced_secret("s", "default", {"metadata": {"labels": {"a": "2"}}})
    assert patched.metadata.labels == {"a": "2"}


async def test_patches_merge_strategically_by_json_merge_and_by_json_patch(
    k8s: FakeK8s, aio: kubernetes.aio.client.ApiClient
) -> None:
    core = CoreV1Api(aio)
    pod = pod_manifest("p", [container(["sleep", "30"], name="a"), container(["sleep", "30"], name="b")])
    await core.create_namespaced_pod("default", pod)
    strategic = {"spec": {"containers": [{"name": "b", "image": "busybox:1.37"}]}}  # by name: a stays
    result = await core.patch_namespaced_pod("p", "default", strategic)
    assert [(c.name, c.image) for c in result.spec.containers] == [
        ("a", "busybox:1.36"),
        ("b", "busybox:1.37"),
    ]
    merge = {"metadata": {"labels": {"x": "1"}}}
    result = await core.patch_namespaced_pod(
        "p", "default", merge, _content_type="application/merge-patch+json"
    )
    assert result.metadata.labels == {"x": "1"}
    json_patch = [{"op": "add", "path": "/metadata/annotations", "value": {"note": "hi"}}]
    result = await core.patch_namespaced_pod("p", "default", json_patch)
    assert result.metadata.annotations == {"note": "hi"}


async def test_a_no_op_update_is_no_write(k8s: FakeK8s, aio: kubernetes.aio.client.ApiClient) -> None:
    core = CoreV1Api(aio)
    await core.create_namespaced_secret("default", secret_manifest("same", {"k": "v"}))
    before = k8s.resource_version
    await core.patch_namespaced_secret("same", "default", {"metadata": {"labels": {}}})
    assert k8s.resource_version == before


async def test_lists_page_with_limit_and_continue_and_expire_after_compaction(
    k8s: FakeK8s, aio: kubernetes.aio.client.ApiClient
) -> None:
    core = CoreV1Api(aio)
    for name in ("a", "b", "c"):
        await core.create_namespaced_secret("default", secret_manifest(name, {"k": "v"}))
    first = await core.list_namespaced_secret("default", limit=2)
    assert [s.metadata.name for s in first.items] == ["a", "b"]
    assert first.metadata.remaining_item_count == 1
    await core.delete_namespaced_secret("c", "default")  # the continuation still sees the snapshot
    rest = await core.list_namespaced_secret("default", limit=2, _continue=first.metadata._continue)
    assert [s.metadata.name for s in rest.items] == ["c"]
    assert rest.metadata.resource_version == first.metadata.resource_version
    k8s.compact_history()
    with pytest.raises(kubernetes.aio.client.ApiException) as raised:
        await core.list_namespaced_secret("default", limit=2, _continue=first.metadata._continue)
    assert (raised.value.status, status_of(raised.value)["reason"]) == (410, "Expired")


async def test_secrets_fold_string_data_into_data(aio: kubernetes.aio.client.ApiClient) -> None:
    manifest = {"metadata": {"name": "plain"}, "stringData": {"token": "abc"}}
    created = await CoreV1Api(aio).create_namespaced_secret("default", manifest)
    assert (created.data, created.string_data, created.type) == ({"token": "YWJj"}, None, "Opaque")


async def test_delete_preconditions_and_background_propagation(
    k8s: FakeK8s, aio: kubernetes.aio.client.ApiClient
) -> None:
    batch = BatchV1Api(aio)
    await batch.create_namespaced_job("default", job_manifest("gone", [container(["sleep", "30"])]))
    await k8s.wait_for_pods("default", "job-name=gone", lambda p: len(p) == 1)
    with pytest.raises(kubernetes.aio.client.ApiException) as raised:
        await batch.delete_namespaced_job("gone", "default", body={"preconditions": {"uid": "not-its-uid"}})
    assert raised.value.status == 409
    status = await batch.delete_namespaced_job("gone", "default", propagation_policy="Background")
    # the client types this response "object" (a Status, or the Job while a deletion is pending): a dict
    assert (status["status"], status["details"]["kind"], status["details"]["group"]) == (
        "Success",
        "jobs",
        "batch",
    )
    await k8s.wait_for(lambda: not k8s.objects("pods"))


async def test_discovery_documents_are_served(http: aiohttp.ClientSession) -> None:
    async with http.get("/version") as response:
        assert (await response.json())["major"] == "1"
    async with http.get("/apis/batch/v1") as response:
        names = {r["name"] for r in (await response.json())["resources"]}
    assert names == {"jobs", "jobs/status"}
    async with http.get("/api/v1") as response:
        names = {r["name"] for r in (await response.json())["resources"]}
    assert names == {"pods", "pods/status", "pods/binding", "pods/log", "secrets"}


async def test_a_followed_log_streams_until_the_container_exits(
    k8s: FakeK8s, http: aiohttp.ClientSession
) -> None:
    gate = "$(FAKE_K8S_MOUNT_GATE)/open"
    script = f"echo first; while [ ! -e {gate} ]; do sleep 0.01; done; echo second"
    main = container(["sh", "-c", script], volumeMounts=[{"name": "gate", "mountPath": "/gate"}])
    k8s.create("pods", "default", pod_manifest("follow", [main], volumes=[{"name": "gate", "emptyDir": {}}]))
    await k8s.wait_for(lambda: "first" in k8s.logs("default", "follow", "main"))
    async with http.get("/api/v1/namespaces/default/pods/follow/log?follow=true") as response:
        assert response.headers["Content-Type"] == "text/plain"
        assert await response.content.readline() == b"first\n"
        pod_dir = k8s.pod_dir("default", "follow")
        assert pod_dir is not None
        (pod_dir / "volumes" / "gate" / "open").touch()
        assert await response.content.read() == b"second\n"


async def test_the_log_of_a_pod_with_several_containers_needs_a_container_name(
    k8s: FakeK8s, http: aiohttp.ClientSession
) -> None:
    k8s.create(
        "pods", "default", pod_manifest("duo", [container(["true"], name="a"), container(["true"], name="b")])
    )
    async with http.get("/api/v1/namespaces/default/pods/duo/log") as response:
        body = await response.json()
    assert (response.status, body["message"]) == (
        400,
        "a container name must be specified for pod duo, choose one of: [a b]",
    )


async def test_a_dry_run_create_is_answered_but_not_stored(
    k8s: FakeK8s, aio: kubernetes.aio.client.ApiClient
) -> None:
    created = await BatchV1Api(aio).create_namespaced_job(
        "default", job_manifest("dry", [container(["true"])]), dry_run="All"
    )
    assert created.metadata.name == "dry"
    assert k8s.objects("jobs") == []


async def test_delete_collection_deletes_what_the_selector_matches(
    k8s: FakeK8s, aio: kubernetes.aio.client.ApiClient
) -> None:
    for name, team in (("a", "x"), ("b", "y"), ("c", "x")):
        manifest = secret_manifest(name, {"k": "v"})
        manifest["metadata"]["labels"] = {"team": team}
        k8s.create("secrets", "default", manifest)
    await CoreV1Api(aio).delete_collection_namespaced_secret("default", label_selector="team=x")
    assert [s["metadata"]["name"] for s in k8s.objects("secrets")] == ["b"]
