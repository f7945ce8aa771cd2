"""Addon names: short names map to `"module:Class"` strings, resolved lazily, with readable errors.

A chain entry is either a short name from `ADDONS` or an import string (`"myco.audit:Audit"`), so users plug
in their own addons without forking.
"""

from __future__ import annotations

import importlib

from agl_lite.errors import AddonLoadError

__all__ = ["ADDONS", "resolve_addon"]

ADDONS: dict[str, str] = {
    "store": "agl_lite.addons.store:Storage",
    "auth": "agl_lite.addons.auth:Auth",
    "store_api": "agl_lite.addons.store_api:StoreApi",
    "metrics": "agl_lite.addons.metrics:Metrics",
    "control": "agl_lite.addons.control:Control",
    "route": "agl_lite.addons.router:Router",
    "anthropic": "agl_lite.addons.anthropic:Anthropic",
    "capture": "agl_lite.addons.capture:Capture",
    "tokens": "agl_lite.addons.tokens:Tokens",
    "sink": "agl_lite.addons.sink:Sink",
    "runner": "agl_lite.addons.runner:AgentRunner",
}
"""Short name → import string of every built-in addon."""


def resolve_addon(spec: str) -> type:
    """The addon class for a short name or a `module:Class` string."""
    target = ADDONS.get(spec, spec)
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        known = ", ".join(sorted(ADDONS))
        raise AddonLoadError(f"unknown addon {spec!r}: use one of {known} or a 'module:Class' import string")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise AddonLoadError(f"addon {spec!r}: cannot import module {module_name!r}: {exc}") from exc
    cls = getattr(module, attr, None)
    if not isinstance(cls, type):
        raise AddonLoadError(f"addon {spec!r}: module {module_name!r} has no class {attr!r}")
    return cls
