"""Backend names → `"module:Class"`, imported only when chosen (the Kubernetes client is an optional extra)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any, cast

from agl_lite.errors import ConfigError
from agl_lite.runner.seams import Backend, RunnerSettings

__all__ = ["BACKENDS", "backend_class"]

BACKENDS: dict[str, str] = {
    "local": "agl_lite.runner.local:LocalBackend",
    "k8s": "agl_lite.runner.k8s:K8sBackend",
}

BackendClass = Callable[[RunnerSettings, Mapping[str, Any]], Backend]


def backend_class(name: str) -> BackendClass:
    """The class of backend `name`; ConfigError saying what to install or choose when it cannot be had."""
    target = BACKENDS.get(name)
    if target is None:
        raise ConfigError(f"unknown runner backend {name!r}: use one of {', '.join(BACKENDS)}")
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        extra = " (install the extra: pip install 'agl-lite[k8s]')" if name == "k8s" else ""
        raise ConfigError(f"runner backend {name!r} cannot be loaded: {exc}{extra}") from exc
    cls = getattr(module, attr, None)
    if cls is None:
        raise ConfigError(f"runner backend {name!r}: module {module_name!r} has no {attr!r}")
    return cast(BackendClass, cls)
