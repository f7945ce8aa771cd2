"""How the kubelet turns a container spec into a local process: environment, command line, paths, directories.

It maps the container's view of the filesystem onto the pod's host directory (volume mounts, the termination
message file, workingDir) and exposes the real paths as FAKE_K8S_* variables; it must not run anything.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Callable
from pathlib import Path

from agl_fake_k8s.config import FakeK8sConfig
from agl_fake_k8s.containers import ContainerProcess
from agl_fake_k8s.env import (
    ConfigError,
    SecretLookup,
    container_env,
    expand,
    mount_env_name,
    rewrite_paths,
)
from agl_fake_k8s.meta import JsonObj
from agl_fake_k8s.tasks import TaskSet

__all__ = ["build_process", "write_secret_volume"]

_BASE_ENV_KEYS = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")


def write_secret_volume(path: Path, secret: JsonObj | None, source: JsonObj) -> None:
    """One file per key (or per `items` entry) of the Secret; a missing Secret is a ConfigError unless optional."""
    if secret is None:
        if source.get("optional"):
            return
        raise ConfigError(f'secret "{source.get("secretName")}" not found')
    data = secret.get("data") or {}
    for item in source.get("items") or [{"key": k, "path": k} for k in data]:
        if item.get("key") not in data:
            continue
        try:
            content = base64.b64decode(data[item["key"]] or "")
        except (binascii.Error, ValueError):
            content = b""
        target = path / item.get("path", item["key"])
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)


def build_process(
    pod: JsonObj,
    container: JsonObj,
    *,
    config: FakeK8sConfig,
    pod_dir: Path,
    mounts: dict[str, Path],
    secrets: SecretLookup,
    tasks: TaskSet,
    on_output: Callable[[], None],
) -> ContainerProcess:
    """The process for `container`: env, command and args as the kubelet builds them, paths mapped to `pod_dir`.

    Raises ConfigError while a referenced Secret or key is missing.
    """
    name = container["name"]
    termination = pod_dir / "termination" / name
    path_map = [(container.get("terminationMessagePath") or "/dev/termination-log", str(termination))]
    service_env = {"FAKE_K8S_TERMINATION_MESSAGE_PATH": str(termination)}
    for mount in container.get("volumeMounts") or []:
        host = mounts.get(mount.get("name", ""))
        if host is None:
            continue
        host = host / mount["subPath"] if mount.get("subPath") else host
        host.mkdir(parents=True, exist_ok=True)
        service_env[mount_env_name(mount["name"])] = str(host)
        path_map.append((mount["mountPath"], str(host)))
    env = container_env(pod, container, secrets, service_env)
    variables = {**service_env, **env}
    command = container.get("command") or list(config.images.get(str(container.get("image")), ()))
    argv = [expand(part, variables.get) for part in [*command, *(container.get("args") or [])]]
    working_dir = container.get("workingDir") or ""
    if config.rewrite_paths:
        argv = [rewrite_paths(a, path_map) for a in argv]
        env = {k: rewrite_paths(v, path_map) for k, v in env.items()}
        working_dir = rewrite_paths(working_dir, path_map)
    cwd = Path(working_dir) if working_dir and Path(working_dir).is_dir() else None
    if cwd is None:  # a container runtime creates a missing workingDir: here, under the pod's own root
        cwd = pod_dir / "root" / working_dir.lstrip("/")
        cwd.mkdir(parents=True, exist_ok=True)
    if config.base_env is not None:
        base = dict(config.base_env)
    else:
        base = {k: v for k, v in os.environ.items() if k in _BASE_ENV_KEYS}
    return ContainerProcess(
        argv,
        env={**base, "HOSTNAME": str(pod["metadata"]["name"]), **service_env, **env},
        cwd=cwd,
        log_path=pod_dir / "logs" / f"{name}.log",
        termination_path=termination,
        fallback_to_logs=container.get("terminationMessagePolicy") == "FallbackToLogsOnError",
        tasks=tasks,
        on_output=on_output,
    )
