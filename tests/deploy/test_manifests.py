"""deploy/: every manifest, and the Jobs and Secrets the controller generates, validate offline against the pinned
Kubernetes schema (kubernetes-validate, strict: unknown fields are errors); the Role grants exactly what the
controller calls; the controller's config loads as `agl-lite run` would load it. (The Dockerfiles are not built
here: there is no Docker engine.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from agl_lite.core.contract import agent_env, grader_env
from agl_lite.errors import ConfigError
from agl_lite.runner.k8s.manifest import LaunchSpec, build_job, build_secret
from agl_lite.runner.k8s.options import grader_template, job_template, parse_k8s_options
from agl_lite.service import check_config, load_config
from agl_lite.store.records import Rollout

K8S_SCHEMA = "1.31.0"
"""The oldest Kubernetes the controller supports: podFailurePolicy and the DisruptionTarget condition are GA."""
DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
MANIFESTS = sorted(DEPLOY.glob("*.yaml"))
RBAC_CALLS = {
    ("create", "jobs"),
    ("get", "jobs"),
    ("list", "jobs"),
    ("watch", "jobs"),
    ("delete", "jobs"),
    ("deletecollection", "jobs"),
    ("list", "pods"),
    ("watch", "pods"),
    ("create", "secrets"),
    ("list", "secrets"),
}
"""Every (verb, resource) the adapter (`agl_lite.runner.k8s.kube`) can send; the fake-cluster tests check the
controller's real calls against deploy/k8s/rbac.yaml too."""


def documents() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in MANIFESTS:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out.append((f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc))
    return out


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [doc for _, doc in documents() if doc["kind"] == kind]


def validate(obj: dict[str, Any]) -> None:
    try:
        kubernetes_validate.validate(obj, K8S_SCHEMA, strict=True)
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"{obj['kind']} {obj['metadata'].get('name')}: {exc.message} at {list(exc.path)}")


def test_the_manifests_are_all_there() -> None:
    kinds = sorted(doc["kind"] for _, doc in documents())
    assert kinds == ["ConfigMap", "Deployment", "Namespace", "Role", "RoleBinding", "ServiceAccount"]


@pytest.mark.parametrize(("name", "doc"), documents(), ids=[n for n, _ in documents()])
def test_every_manifest_validates_against_the_pinned_schema(name: str, doc: dict[str, Any]) -> None:
    validate(doc)


def test_a_schema_violation_is_caught() -> None:
    deployment = by_kind("Deployment")[0]
    broken = {**deployment, "spec": {**deployment["spec"], "replica": 1}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_SCHEMA, strict=True)


def test_everything_lives_in_one_namespace() -> None:
    (namespace,) = by_kind("Namespace")
    for name, doc in documents():
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == namespace["metadata"]["name"], name


def test_the_role_grants_exactly_what_the_controller_calls() -> None:
    (role,) = by_kind("Role")
    granted = set()
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"]
        granted |= {(verb, res) for verb in rule["verbs"] for res in rule["resources"]}
    assert granted == RBAC_CALLS
    assert by_kind("ClusterRole") == []


def test_the_binding_gives_the_role_to_the_controllers_service_account() -> None:
    (binding,), (account,), (role,) = by_kind("RoleBinding"), by_kind("ServiceAccount"), by_kind("Role")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": account["metadata"]["name"],
            "namespace": account["metadata"]["namespace"],
        }
    ]
    (deployment,) = by_kind("Deployment")
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]


def test_the_controller_gets_the_admin_key_from_a_secret_and_a_pinned_image() -> None:
    (deployment,) = by_kind("Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["AGL_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "agl-lite", "key": "AGL_KEY"}
    assert "value" not in env["AGL_KEY"]
    assert ":" in container["image"]
    assert not container["image"].endswith(":latest")
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"


def controller_toml(tmp_path: Path) -> Path:
    (configmap,) = by_kind("ConfigMap")
    path = tmp_path / "agl-lite.toml"
    path.write_text(configmap["data"]["agl-lite.toml"])
    return path


async def test_the_controller_config_loads_as_a_runner_only_k8s_process(tmp_path: Path) -> None:
    config = load_config(controller_toml(tmp_path))
    assert config.chain == ("runner",)
    runner = config.addons["runner"]
    assert (runner["backend"], runner["store_url"]) == ("k8s", "http://host.minikube.internal:8100")
    await check_config(config)  # every addon configured, the k8s options parsed: ConfigError otherwise


async def test_a_bad_k8s_option_in_the_controller_config_stops_it(tmp_path: Path) -> None:
    path = controller_toml(tmp_path)
    path.write_text(path.read_text().replace("qps = 20.0", "qps = 20.0\nqpss = 1"))
    with pytest.raises(ConfigError, match=r"addons\.runner\.k8s\.qpss"):
        await check_config(load_config(path))


@pytest.mark.parametrize("grading", [False, True])
@pytest.mark.parametrize("rollout_id", ["ro-0123", "Mixed_Case_" + "x" * 90])
def test_the_jobs_and_secrets_the_controller_generates_validate(
    tmp_path: Path, grading: bool, rollout_id: str
) -> None:
    k8s = load_config(controller_toml(tmp_path)).addons["runner"]["k8s"]
    options = parse_k8s_options(k8s, file="configmap", where="k8s")
    rollout = Rollout(rollout_id, {"question": "2+2", "hint": "$(HOME)"})
    spec = LaunchSpec(
        rollout_id=rollout_id,
        max_attempts=3,
        timeout_s=120.0,
        env=agent_env("http://host.minikube.internal:8100", "k", rollout, "$(AGL_ATTEMPT_ID)"),
        grader_env=grader_env("http://host.minikube.internal:8100", "k", rollout, "$(AGL_ATTEMPT_ID)")
        if grading
        else None,
        grader=grader_template(options, {"k8s": {"image": "grader:0.1.0"}}, ("python", "grade.py"))
        if grading
        else None,
        template=job_template(options, {"k8s": {"node_selector": {"pool": "cpu"}}}),
    )
    validate(build_job(spec, options))
    validate(build_secret(spec, options, job_uid="0b7c2a8e-4f7e-4a57-9d0c-1b2f3e4d5c6b"))
