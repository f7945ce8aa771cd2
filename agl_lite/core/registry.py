"""Addon names: a chain entry is a short name of the built-ins handed in (`agl_lite.addons.ADDONS`, name →
`"module:Class"`) or an import string (`"myco.audit:Audit"`), so users plug in their own addons without forking;
resolved lazily, with readable errors.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

from agl_lite.errors import AddonLoadError

__all__ = ["resolve_addon"]


def resolve_addon(spec: str, builtins: Mapping[str, str]) -> type:
    """The addon class for a short name of `builtins` or a `module:Class` string."""
    target = builtins.get(spec, spec)
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        known = ", ".join(sorted(builtins))
        raise AddonLoadError(f"unknown addon {spec!r}: use one of {known} or a 'module:Class' import string")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise AddonLoadError(f"addon {spec!r}: cannot import module {module_name!r}: {exc}") from exc
    cls = getattr(module, attr, None)
    if not isinstance(cls, type):
        raise AddonLoadError(f"addon {spec!r}: module {module_name!r} has no class {attr!r}")
    return cls
