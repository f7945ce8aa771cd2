"""deploy/k8s/replicas/: N gateway replicas on PostgreSQL. The manifests validate against the pinned schema; the
replicas keep nothing in their pods (a rolling update is safe), read the DSN from a Secret, run no runner; and the
ConfigMap's own config, given a DSN as the pods get it, serves two replicas that share one store."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from agl_lite.client import AglLiteClient
from agl_lite.service import load_config, running_gateway
from tests.conftest import ADMIN_KEY, gateway_url
from tests.deploy.test_manifests import DEPLOY, validate

REPLICAS = DEPLOY / "replicas"


def documents() -> list[dict[str, Any]]:
    return [d for p in sorted(REPLICAS.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]


def one(kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def test_the_replica_manifests_are_all_there() -> None:
    assert sorted((d["kind"], d["metadata"]["name"]) for d in documents()) == [
        ("ConfigMap", "agl-lite-replicas"),
        ("Deployment", "agl-lite-replicas"),
        ("Service", "agl-lite-postgres"),
        ("Service", "agl-lite-replicas"),
        ("StatefulSet", "agl-lite-postgres"),
    ]


@pytest.mark.parametrize("doc", documents(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_every_replica_manifest_validates_against_the_pinned_schema(doc: dict[str, Any]) -> None:
    validate(doc)


def test_the_replicas_keep_nothing_in_their_pods_and_read_the_dsn_from_a_secret() -> None:
    deployment = one("Deployment", "agl-lite-replicas")
    assert deployment["spec"]["replicas"] > 1
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    pod = deployment["spec"]["template"]["spec"]
    assert not [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
    (c,) = pod["containers"]
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in c["env"]}
    assert env == {
        "AGL_KEY": {"name": "agl-lite", "key": "AGL_KEY"},
        "AGL_STORE_DSN": {"name": "agl-lite-store", "key": "AGL_STORE_DSN"},
    }
    postgres = one("StatefulSet", "agl-lite-postgres")["spec"]["template"]["spec"]["containers"][0]
    password = {e["name"]: e for e in postgres["env"]}["POSTGRES_PASSWORD"]
    assert password["valueFrom"]["secretKeyRef"]["name"] == "agl-lite-store"
    assert not postgres["image"].endswith(":latest")
    config = tomllib.loads(one("ConfigMap", "agl-lite-replicas")["data"]["agl-lite.toml"])
    assert "runner" not in config["addons"]["chain"]
    assert "store" not in config["addons"] or "dsn" not in config["addons"]["store"]  # (never in a ConfigMap)


async def test_two_replicas_run_from_the_configmap_on_one_database(
    tmp_path: Path, postgres_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = one("ConfigMap", "agl-lite-replicas")["data"]
    for name, text in data.items():
        (tmp_path / name).write_text(text.replace('host = "0.0.0.0"', 'host = "127.0.0.1"'))
    monkeypatch.setenv("AGL_STORE_DSN", postgres_db)  # as the pods get it, from the Secret
    config = load_config(tmp_path / "agl-lite.toml")
    config = dataclasses.replace(config, server=dataclasses.replace(config.server, port=0))
    async with (
        running_gateway(config) as a,
        running_gateway(config) as b,
        AglLiteClient(gateway_url(a), ADMIN_KEY) as via_a,
        AglLiteClient(gateway_url(b), ADMIN_KEY) as via_b,
    ):
        (group,) = await via_a.enqueue_group([{"q": 1}], n=3)
        assert sorted(r.id for r in await via_b.claim("runner", 10)) == sorted(r.id for r in group)
