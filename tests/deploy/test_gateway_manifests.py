"""deploy/k8s/gateway/: the gateway, its volume, its Service and the mock upstream in the cluster. The manifests
validate against the pinned schema; the names, ports and paths they share agree with each other and with the
configs; and the gateway runs from the ConfigMap's own config (store path and upstream address moved to this
machine), records a call, and leaves it in the database file alone when SIGTERM stops it."""

from __future__ import annotations

import re
import sqlite3
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from agl_lite.service import load_config
from agl_lite.store.sqlite import SQLiteStore
from tests.deploy.test_manifests import DEPLOY, validate
from tests.test_cli import chat_through

GATEWAY = DEPLOY / "gateway"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "deployment.md"
IN_CLUSTER_URL = "http://agl-lite-gateway.agl-lite.svc:8100"
"""The controller's `store_url` when the gateway runs in the cluster (docs/deployment.md says how to set it)."""


def documents() -> list[dict[str, Any]]:
    return [d for p in sorted(GATEWAY.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]


def one(kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    return c


def config_files() -> dict[str, str]:
    return one("ConfigMap", "agl-lite-gateway")["data"]


def test_the_gateway_manifests_are_all_there() -> None:
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in documents())
    assert kinds == [
        ("ConfigMap", "agl-lite-gateway"),
        ("Deployment", "agl-lite-gateway"),
        ("Deployment", "mock-llm"),
        ("PersistentVolumeClaim", "agl-lite-data"),
        ("Service", "agl-lite-gateway"),
        ("Service", "mock-llm"),
    ]


@pytest.mark.parametrize("doc", documents(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_every_gateway_manifest_validates_against_the_pinned_schema(doc: dict[str, Any]) -> None:
    validate(doc)
    assert doc["metadata"]["namespace"] == "agl-lite"


@pytest.mark.parametrize("name", ["agl-lite-gateway", "mock-llm"])
def test_each_service_selects_its_deployments_pods_on_a_port_they_open(name: str) -> None:
    deployment, service = one("Deployment", name), one("Service", name)
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] in {p["name"] for p in container(deployment)["ports"]}


def test_the_gateway_listens_where_its_service_and_the_controller_look() -> None:
    config = tomllib.loads(config_files()["agl-lite.toml"])
    (c_port,) = container(one("Deployment", "agl-lite-gateway"))["ports"]
    (s_port,) = one("Service", "agl-lite-gateway")["spec"]["ports"]
    assert config["server"]["host"] == "0.0.0.0"
    assert config["server"]["port"] == c_port["containerPort"] == s_port["port"]
    url = urlsplit(IN_CLUSTER_URL)
    assert url.hostname == "agl-lite-gateway.agl-lite.svc"
    assert url.port == s_port["port"]


def test_the_routes_point_at_the_mock_service_on_the_port_it_serves() -> None:
    routes = tomllib.loads(config_files()["routes.toml"])
    (upstream,) = routes["models"]["smollm2"]["upstreams"]
    url = urlsplit(upstream["base_url"])
    (s_port,) = one("Service", "mock-llm")["spec"]["ports"]
    args = container(one("Deployment", "mock-llm"))["args"]
    assert url.hostname == "mock-llm.agl-lite.svc"
    assert url.port == s_port["port"]
    assert args[args.index("--port") + 1] == str(s_port["port"])
    assert args[args.index("--model") + 1] == upstream["served_model"]


def test_the_gateway_keeps_its_store_on_the_volume_and_its_key_in_the_secret() -> None:
    deployment = one("Deployment", "agl-lite-gateway")
    pod = deployment["spec"]["template"]["spec"]
    c = container(deployment)
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    store = Path(tomllib.loads(config_files()["agl-lite.toml"])["addons"]["store"]["path"])
    (data,) = [n for n, v in volumes.items() if "persistentVolumeClaim" in v]
    assert volumes[data]["persistentVolumeClaim"]["claimName"] == "agl-lite-data"
    assert store.parent == Path(mounts[data])
    assert store.is_absolute()
    (config,) = [n for n, v in volumes.items() if v.get("configMap", {}).get("name") == "agl-lite-gateway"]
    assert c["args"] == ["run", "--config", f"{mounts[config]}/agl-lite.toml"]
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsUser"]  # the volume is writable
    # One SQLite writer, one ReadWriteOnce volume: never two pods at once.
    assert (deployment["spec"]["replicas"], deployment["spec"]["strategy"]["type"]) == (1, "Recreate")
    env = {e["name"]: e for e in c["env"]}
    assert env["AGL_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "agl-lite", "key": "AGL_KEY"}
    assert c["image"].startswith("agl-lite:")
    assert not c["image"].endswith(":latest")
    assert pod["automountServiceAccountToken"] is False


def test_the_docs_point_the_controller_at_the_gateways_service(tmp_path: Path) -> None:
    """The walk-through's command for an in-cluster gateway, applied to the controller's ConfigMap, loads and
    names the Service."""
    m = re.search(r"sed 's#(?P<old>[^#]+)#(?P<new>[^#]+)#' deploy/k8s/configmap\.yaml", DOCS.read_text())
    assert m is not None, "docs/deployment.md lost the command that points the controller at the Service"
    assert m["new"] == IN_CLUSTER_URL
    (configmap,) = [d for d in yaml.safe_load_all((DEPLOY / "configmap.yaml").read_text()) if d]
    toml = configmap["data"]["agl-lite.toml"]
    assert toml.count(m["old"]) == 1
    (tmp_path / "agl-lite.toml").write_text(toml.replace(m["old"], m["new"]))
    assert load_config(tmp_path / "agl-lite.toml").addons["runner"]["store_url"] == IN_CLUSTER_URL


async def test_the_gateway_runs_from_its_configmap_and_a_stop_leaves_one_complete_file(
    tmp_path: Path, unused_tcp_port_factory: Any
) -> None:
    gw_port, mock_port = unused_tcp_port_factory(), unused_tcp_port_factory()
    files = config_files()
    # Only what must change off-cluster: the volume's path, the ports, the upstream's address.
    toml = _replace_once(
        files["agl-lite.toml"], 'path = "/data/agl-lite.db"', f'path = "{tmp_path}/agl-lite.db"'
    )
    toml = _replace_once(toml, 'host = "0.0.0.0"', 'host = "127.0.0.1"')
    toml = _replace_once(toml, "port = 8100", f"port = {gw_port}")
    routes = _replace_once(
        files["routes.toml"], "http://mock-llm.agl-lite.svc:8000/v1", f"http://127.0.0.1:{mock_port}/v1"
    )
    (tmp_path / "agl-lite.toml").write_text(toml)
    (tmp_path / "routes.toml").write_text(routes)
    args = container(one("Deployment", "mock-llm"))["args"]
    args = [a.replace("0.0.0.0", "127.0.0.1").replace("8000", str(mock_port)) for a in args]
    response_id = (await chat_through(args, tmp_path / "agl-lite.toml", gw_port, "gpt-4.1"))["id"]
    assert not (tmp_path / "agl-lite.db-wal").exists()
    # A copy of the .db alone (what a volume snapshot or `kubectl cp` takes) holds the call.
    copy = tmp_path / "copy.db"
    copy.write_bytes((tmp_path / "agl-lite.db").read_bytes())
    with sqlite3.connect(f"file:{copy}?mode=ro", uri=True) as conn:
        assert conn.execute("SELECT COUNT(*) FROM calls").fetchone() == (1,)
    store = await SQLiteStore.open(copy)
    try:
        assert [c.response_id for c in await store.calls(None)] == [response_id]
    finally:
        await store.close()


def _replace_once(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"expected one {old!r}"
    return text.replace(old, new)
