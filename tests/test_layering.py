"""The layering contracts in pyproject.toml keep up with the package: core may import nothing above it."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BELOW_EVERYTHING = {"agl_lite.core", "agl_lite.errors", "agl_lite.__init__", "agl_lite.py"}


def test_core_contract_forbids_every_module_above_core() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    (core,) = [c for c in contracts if c.get("source_modules") == ["agl_lite.core"]]
    top_level = {
        f"agl_lite.{p.stem if p.is_file() else p.name}"
        for p in (ROOT / "agl_lite").iterdir()
        if (p.is_dir() and (p / "__init__.py").exists()) or p.suffix == ".py"
    }
    assert top_level - BELOW_EVERYTHING == set(core["forbidden_modules"])
