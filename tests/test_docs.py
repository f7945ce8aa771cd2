"""The generated parts of docs/ match the code they are generated from."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

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


async def test_the_endpoint_addon_of_the_architecture_doc_runs_as_written(
    gateway_factory: Any, admin_key: str
) -> None:
    """The doc's example, taken from the page and run in a real gateway: one import module is all it needs."""
    import aiohttp

    text = (ROOT / "docs" / "architecture.md").read_text()
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "class Notes" in b]
    assert {line for line in code.splitlines() if line.startswith("from agl_lite")} == {
        "from agl_lite.addon import Call, Endpoints, Flow, Param, Scope"
    }
    namespace: dict[str, Any] = {"__name__": "doc_example"}
    exec(compile(code, "architecture.md", "exec"), namespace)
    async with (
        gateway_factory({"m": ["http://127.0.0.1:9/v1"]}, extra_addons=[namespace["Notes"]()]) as gw,
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {admin_key}"}) as http,
    ):
        url = f"http://127.0.0.1:{gw.port}/api/notes"
        async with http.post(url, json={"text": "hi"}, params={"tag": "x"}) as resp:
            assert (resp.status, await resp.json()) == (201, {"text": "hi", "tag": "x"})
        async with http.post(url, json={"text": "hi"}, params={"tag": "X1"}) as resp:
            assert resp.status == 400
            assert "'tag' must match" in (await resp.json())["error"]["message"]
        async with http.post(url, json={"text": "hi"}) as resp:  # the parameter is optional
            assert (resp.status, await resp.json()) == (201, {"text": "hi", "tag": None})
        async with http.post(url, json={"txt": "hi"}) as resp:
            assert resp.status == 400
        async with http.post(url, json={"text": "hi"}, headers={"Authorization": "Bearer nope"}) as resp:
            assert resp.status == 401  # the scope it declared
