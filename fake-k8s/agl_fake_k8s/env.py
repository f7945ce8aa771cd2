"""A container's environment, command and args as the kubelet builds them: `envFrom`, then `env` in order
(literal values with `$(VAR)` expanded from earlier entries only, Secrets, the downward API), then `$(VAR)` in
command and args from the whole environment.

`expand` follows Kubernetes' expansion rules to the letter: `$$` is a literal `$`, an undefined `$(VAR)` stays
as written, an unterminated `$(` is kept. Missing Secrets raise `ConfigError` (CreateContainerConfigError).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Mapping
from typing import Any

from agl_fake_k8s.meta import JsonObj

__all__ = ["ConfigError", "SecretLookup", "container_env", "expand", "mount_env_name", "rewrite_paths"]

SecretLookup = Callable[[str, str], JsonObj | None]


class ConfigError(Exception):
    """The container cannot be configured yet (a Secret or key is missing): CreateContainerConfigError."""


def expand(text: str, lookup: Callable[[str], str | None]) -> str:
    """Expand `$(VAR)` references in `text` exactly as Kubernetes does (third_party/forked/golang/expansion)."""
    out: list[str] = []
    checkpoint, cursor = 0, 0
    while cursor < len(text):
        if text[cursor] == "$" and cursor + 1 < len(text):
            out.append(text[checkpoint:cursor])
            rest = text[cursor + 1 :]
            if rest[0] == "$":  # escaped operator
                out.append("$")
                advance = 1
            elif rest[0] == "(" and (close := rest.find(")", 1)) != -1:
                name = rest[1:close]
                value = lookup(name)
                out.append(f"$({name})" if value is None else value)
                advance = close + 1
            elif rest[0] == "(":  # an unterminated reference is kept as written
                out.append("$(")
                advance = 1
            else:  # a lone operator: kept, with the character after it
                out.append("$" + rest[0])
                advance = 1
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    return "".join(out) + text[checkpoint:]


def mount_env_name(volume: str) -> str:
    """FAKE_K8S_MOUNT_<NAME>: the variable holding the real directory of an emptyDir volume mount."""
    return "FAKE_K8S_MOUNT_" + re.sub(r"[^A-Za-z0-9]", "_", volume).upper()


def _decode(value: Any) -> str:
    try:
        return base64.b64decode(value or "").decode("utf-8", "replace")
    except (binascii.Error, ValueError):
        return ""


def _field(pod: JsonObj, path: str) -> str:
    metadata, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    if m := re.fullmatch(r"metadata\.(labels|annotations)\['([^']*)'\]", path):
        return str((metadata.get(m[1]) or {}).get(m[2], ""))
    if path in ("metadata.labels", "metadata.annotations"):
        items = metadata.get(path.split(".")[1]) or {}
        return "\n".join(f'{k}="{v}"' for k, v in sorted(items.items()))
    if path in ("status.podIPs", "status.hostIPs"):
        return ",".join(str(entry.get("ip", "")) for entry in status.get(path.split(".")[1]) or [])
    section, _, key = path.partition(".")
    source = {"metadata": metadata, "spec": spec, "status": status}.get(section) or {}
    return str(source.get(key) or "")


def _resource_field(container: JsonObj, ref: JsonObj) -> str:
    kind, _, name = str(ref.get("resource", "")).partition(".")
    value = ((container.get("resources") or {}).get(kind) or {}).get(name)
    return "0" if value is None else str(value)


def container_env(
    pod: JsonObj, container: JsonObj, secrets: SecretLookup, service_env: Mapping[str, str]
) -> dict[str, str]:
    """The pod-defined environment of `container` (not the image's), in definition order.

    `service_env` plays the part of the Kubernetes service variables: `$(VAR)` may refer to it from any entry.
    """
    namespace = str(pod["metadata"].get("namespace", ""))
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix") or ""
        if ref := source.get("secretRef"):
            secret = secrets(namespace, ref.get("name", ""))
            if secret is None:
                if ref.get("optional"):
                    continue
                raise ConfigError(f'secret "{ref.get("name")}" not found')
            for key, value in (secret.get("data") or {}).items():
                env[prefix + key] = _decode(value)
        elif (ref := source.get("configMapRef")) and not ref.get("optional"):
            raise ConfigError(f'configmap "{ref.get("name")}" not found')

    def earlier(name: str) -> str | None:
        return env[name] if name in env else service_env.get(name)

    for var in container.get("env") or []:
        name, source = var.get("name", ""), var.get("valueFrom")
        if not source:
            env[name] = expand(var.get("value") or "", earlier)
        elif ref := source.get("fieldRef"):
            env[name] = _field(pod, ref.get("fieldPath", ""))
        elif ref := source.get("secretKeyRef"):
            secret = secrets(namespace, ref.get("name", ""))
            data = (secret or {}).get("data") or {}
            if secret is None or ref.get("key") not in data:
                if ref.get("optional"):
                    continue
                if secret is None:
                    raise ConfigError(f'secret "{ref.get("name")}" not found')
                raise ConfigError(
                    f"couldn't find key {ref.get('key')} in Secret {namespace}/{ref.get('name')}"
                )
            env[name] = _decode(data[ref["key"]])
        elif ref := source.get("configMapKeyRef"):
            if not ref.get("optional"):  # ConfigMaps are not served by the fake
                raise ConfigError(f'configmap "{ref.get("name")}" not found')
        elif ref := source.get("resourceFieldRef"):
            env[name] = _resource_field(container, ref)
    return env


def rewrite_paths(text: str, mapping: list[tuple[str, str]]) -> str:
    """Replace each in-container path of `mapping` (whole path components only) by its host path."""
    table = {inside.rstrip("/"): outside for inside, outside in mapping if inside.rstrip("/")}
    if not table:
        return text
    # One pass over the text, longest path first, so a host path put in is never rewritten again.
    alternatives = "|".join(re.escape(p) for p in sorted(table, key=len, reverse=True))
    return re.sub(rf"(?<![\w./-])(?:{alternatives})(?![\w.-])", lambda m: table[m[0]], text)
