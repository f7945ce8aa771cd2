"""Kubernetes' `$(VAR)` expansion and env resolution, to the letter, and the fake's path mapping."""

from __future__ import annotations

import base64

import pytest

from agl_fake_k8s.env import ConfigError, container_env, expand, mount_env_name, rewrite_paths

VARS = {"A": "x", "EMPTY": ""}


@pytest.mark.parametrize(
    ("text", "expanded"),
    [
        ("$(A)", "x"),
        ("pre-$(A)-post", "pre-x-post"),
        ("$(A)$(A)", "xx"),
        ("$$(A)", "$(A)"),  # escaped
        ("$$$(A)", "$x"),
        ("$(B)", "$(B)"),  # undefined: kept verbatim
        ("$(EMPTY)|", "|"),
        ("$(A", "$(A"),  # unterminated
        ("$A", "$A"),  # not a reference
        ("a$", "a$"),  # a trailing operator
        ("$", "$"),
        ("$()", "$()"),
        ("$$", "$"),
    ],
)
def test_expand_matches_kubernetes(text: str, expanded: str) -> None:
    assert expand(text, VARS.get) == expanded


def pod(labels: dict[str, str] | None = None) -> dict[str, object]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u-1", "labels": labels or {}},
        "spec": {"nodeName": "n"},
        "status": {"podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}]},
    }


def test_env_refers_only_to_earlier_entries_and_service_variables() -> None:
    container = {
        "env": [
            {"name": "FIRST", "value": "$(SECOND)/$(SERVICE)"},
            {"name": "SECOND", "value": "2"},
            {"name": "THIRD", "value": "$(SECOND)"},
            {"name": "SECOND", "value": "two"},
            {"name": "FOURTH", "value": "$(SECOND)"},
        ]
    }
    env = container_env(pod(), container, lambda ns, name: None, {"SERVICE": "svc"})
    assert env == {"FIRST": "$(SECOND)/svc", "SECOND": "two", "THIRD": "2", "FOURTH": "two"}


def test_downward_api_fields() -> None:
    paths = [
        "metadata.uid",
        "metadata.name",
        "metadata.namespace",
        "metadata.labels['team']",
        "spec.nodeName",
    ]
    paths += ["status.podIP", "metadata.labels['missing']"]
    container = {
        "env": [{"name": f"V{i}", "valueFrom": {"fieldRef": {"fieldPath": p}}} for i, p in enumerate(paths)]
    }
    env = container_env(pod({"team": "rl"}), container, lambda ns, name: None, {})
    assert list(env.values()) == ["u-1", "p", "ns", "rl", "n", "10.0.0.1", ""]


def test_secrets_resolve_and_missing_ones_are_config_errors_unless_optional() -> None:
    secret = {"data": {"key": base64.b64encode(b"s3cret").decode()}}
    secrets = {("ns", "keys"): secret}

    def lookup(namespace: str, name: str) -> dict[str, object] | None:
        return secrets.get((namespace, name))

    def ref(name: str, key: str, optional: bool = False) -> dict[str, object]:
        return {"name": "X", "valueFrom": {"secretKeyRef": {"name": name, "key": key, "optional": optional}}}

    assert container_env(pod(), {"env": [ref("keys", "key")]}, lookup, {}) == {"X": "s3cret"}
    assert container_env(pod(), {"env": [ref("other", "key", optional=True)]}, lookup, {}) == {}
    assert container_env(
        pod(), {"envFrom": [{"secretRef": {"name": "keys"}, "prefix": "P_"}]}, lookup, {}
    ) == {"P_key": "s3cret"}
    with pytest.raises(ConfigError, match='secret "other" not found'):
        container_env(pod(), {"env": [ref("other", "key")]}, lookup, {})
    with pytest.raises(ConfigError, match="couldn't find key nope in Secret ns/keys"):
        container_env(pod(), {"env": [ref("keys", "nope")]}, lookup, {})


def test_paths_are_rewritten_on_whole_components_only_and_once() -> None:
    mapping = [("/shared", "/tmp/pod/shared"), ("/tmp", "/tmp/pod/tmp")]
    text = "/shared/out.json --dir=/shared /shared-lib x/shared /tmp"
    assert (
        rewrite_paths(text, mapping)
        == "/tmp/pod/shared/out.json --dir=/tmp/pod/shared /shared-lib x/shared /tmp/pod/tmp"
    )


def test_mount_variables_are_named_after_the_volume() -> None:
    assert mount_env_name("agent-shared.v1") == "FAKE_K8S_MOUNT_AGENT_SHARED_V1"
