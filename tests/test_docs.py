"""The generated parts of docs/ match the code they are generated from."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_generated_doc_sections_are_current() -> None:
    result = subprocess.run(
        [sys.executable, "scripts/gen_docs.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_every_hook_is_in_the_architecture_doc() -> None:
    from agl_lite.core.hooks import all_hooks

    text = (ROOT / "docs" / "architecture.md").read_text()
    assert all(f"| `{name}` |" in text for name in all_hooks)


def test_readme_starts_with_the_two_commands() -> None:
    head = (ROOT / "README.md").read_text().splitlines()[:10]
    assert any(line.startswith("make demo") for line in head)
    assert any(line.startswith("make test") for line in head)
