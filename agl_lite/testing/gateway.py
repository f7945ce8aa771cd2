"""Write a gateway config for tests and examples: an agl-lite.toml and routes.toml in a directory.

Pair it with `agl_lite.service.running_gateway` to serve on a free port.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import tomli_w

from agl_lite.core.config import GatewayConfig, load_config

__all__ = ["write_config"]


def write_config(
    directory: Path,
    upstreams: Mapping[str, Sequence[str]],
    *,
    aliases: Mapping[str, Sequence[str]] | None = None,
    served_model: Mapping[str, str] | None = None,
    strategy: str = "sticky",
    chain: Sequence[str] = ("auth", "route"),
    extra: Mapping[str, Any] | None = None,
    addons: Mapping[str, Mapping[str, Any]] | None = None,
) -> GatewayConfig:
    """Config for a gateway on a free loopback port routing each model to its upstream base URLs."""
    directory.mkdir(parents=True, exist_ok=True)
    models = {
        name: {
            "aliases": list((aliases or {}).get(name, ())),
            "strategy": strategy,
            "upstreams": [
                {"base_url": url, "served_model": (served_model or {}).get(name, name)} for url in urls
            ],
        }
        for name, urls in upstreams.items()
    }
    (directory / "routes.toml").write_text(tomli_w.dumps({"models": models}))
    doc: dict[str, Any] = {"routes": "routes.toml", "server": {"host": "127.0.0.1", "port": 0}}
    doc["addons"] = {"chain": list(chain), **{k: dict(v) for k, v in (addons or {}).items()}}
    for key, value in (extra or {}).items():
        doc[key] = {**doc.get(key, {}), **value} if isinstance(value, Mapping) else value
    path = directory / "agl-lite.toml"
    path.write_text(tomli_w.dumps(doc))
    return load_config(path)
