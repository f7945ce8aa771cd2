"""The math PoC's Kubernetes path, checked offline (there is no cluster here): the manifests k8s.sh applies and a
Job the controller would launch for a math rollout validate against the pinned Kubernetes schema; the controller's
config loads, points at the host gateway and runs the math agent image with a non-latest tag."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from agl_lite.core.contract import agent_env
from agl_lite.runner.k8s.manifest import LaunchSpec, build_job
from agl_lite.runner.k8s.options import job_template, parse_k8s_options
from agl_lite.service import check_config, load_config
from agl_lite.store.records import Rollout

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "math-poc"
K8S_SCHEMA = "1.31.0"
STORE_URL = "http://host.minikube.internal:8123"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("k8s")
    subprocess.run(
        [
            sys.executable,
            str(EXAMPLE / "k8s_manifests.py"),
            "--tag",
            "0.2.0",
            "--store-url",
            STORE_URL,
            "--out",
            str(out),
        ],
        check=True,
    )
    return out


def _docs(directory: Path) -> list[dict[str, Any]]:
    return [d for p in sorted(directory.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]


def test_every_rendered_manifest_validates(rendered: Path) -> None:
    docs = _docs(rendered)
    assert {d["kind"] for d in docs} >= {"Namespace", "ConfigMap", "Deployment", "Role", "RoleBinding"}
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_SCHEMA, strict=True)


async def test_the_controller_runs_the_math_agent_against_the_host_gateway(
    rendered: Path, tmp_path: Path
) -> None:
    (configmap,) = [d for d in _docs(rendered) if d["kind"] == "ConfigMap"]
    (deployment,) = [d for d in _docs(rendered) if d["kind"] == "Deployment"]
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "agl-lite:0.2.0"
    path = tmp_path / "agl-lite.toml"
    path.write_text(configmap["data"]["agl-lite.toml"])
    config = load_config(path)
    await check_config(config)
    runner = config.addons["runner"]
    assert runner["store_url"] == STORE_URL
    k8s = runner["k8s"]
    assert k8s["job"]["image"] == "agl-math-agent:0.2.0"
    assert k8s["job"]["image_pull_policy"] == "IfNotPresent"

    options = parse_k8s_options(k8s, file="configmap", where="k8s")
    rollout = Rollout("ro-math-1", {"question": "Mia has 12 apples..."})
    job = build_job(
        LaunchSpec(
            rollout_id=rollout.id,
            max_attempts=2,
            timeout_s=120.0,
            env=agent_env(STORE_URL, "agent-key", rollout, "$(AGL_ATTEMPT_ID)"),
            grader_env=None,
            grader=None,
            template=job_template(options, {}),
        ),
        options,
    )
    kubernetes_validate.validate(job, K8S_SCHEMA, strict=True)
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "agl-math-agent:0.2.0"
    assert container["command"] == ["python", "/agent/agent.py"]
    env = {e["name"]: e for e in container["env"]}
    assert env["OPENAI_BASE_URL"]["value"].startswith(f"{STORE_URL}/r/ro-math-1/a/$(AGL_ATTEMPT_ID)")
    assert "value" not in env["OPENAI_API_KEY"]  # from the rollout's Secret, never a literal
    assert job["spec"]["backoffLimit"] == 1


def test_latest_is_refused(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(EXAMPLE / "k8s_manifests.py"),
            "--tag",
            "latest",
            "--store-url",
            STORE_URL,
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0
    assert "latest" in done.stderr
