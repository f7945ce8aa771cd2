"""The layering contract in pyproject.toml keeps up with the package, and every module has its mirror test."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

WITHOUT_A_MIRROR_TEST = {
    # Tested through the module that uses them (named after the `#`), or, for test doubles, through the tests
    # that drive them. A module added from now on gets its own tests/.../test_<module>.py.
    "capture/client_view.py",  # tests/addons/test_anthropic.py
    "client/payloads.py",  # tests/client
    "client/results.py",
    "client/writers.py",
    "core/hooks.py",  # tests/core/test_addons.py, tests/test_docs.py
    "core/logs.py",  # tests/core/test_observability.py
    "core/prom.py",
    "core/registry.py",  # tests/core/test_addons.py
    "core/services.py",
    "core/tasks.py",
    "errors.py",  # everywhere an error is asserted
    "integrations/verl/blocking.py",  # tests/integrations/verl
    "integrations/verl/cpu_grpo.py",
    "integrations/verl/trainer.py",
    "runner/programs.py",  # tests/runner
    "runner/zygote.py",  # tests/runner/test_forkserver.py
    "service.py",  # every test that starts a gateway
    "store/api.py",  # tests/addons/test_store_api.py
    "store/codec.py",  # tests/store
    "store/memory.py",  # tests/store/test_rules.py (parametrised over backends)
    "store/openapi.py",  # tests/addons/test_store_api.py
    "testing/flows.py",  # test doubles and helpers, from here on
    "testing/gateway.py",
    "testing/mock_vllm/generate.py",
    "testing/mock_vllm/http_io.py",
    "testing/mock_vllm/side_routes.py",
    "testing/mock_vllm/scenario.py",
    "testing/mock_vllm/tokenizer.py",
    "testing/mock_vllm/wire.py",
    "testing/servers.py",
    "testing/tiny_policy.py",
}


def test_the_layers_contract_places_every_top_level_module() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    (layers,) = [c for c in contracts if c["type"] == "layers"]
    placed = [m.strip() for layer in layers["layers"] for m in layer.split("|")]
    top_level = {
        f"agl_lite.{p.stem if p.is_file() else p.name}"
        for p in (ROOT / "agl_lite").iterdir()
        if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.name != "__init__.py")
    }
    assert sorted(placed) == sorted(top_level)


def test_every_module_has_its_mirror_test_but_the_listed_ones() -> None:
    """As mitmproxy's `filename_matching`: agl_lite/x/y.py is tested in tests/x/test_y.py. The list of exceptions
    only shrinks: a listed module that gained its test must leave the list."""
    without = {
        str(p.relative_to(ROOT / "agl_lite"))
        for p in (ROOT / "agl_lite").rglob("*.py")
        if p.name not in ("__init__.py", "__main__.py")
        and not (ROOT / "tests" / p.relative_to(ROOT / "agl_lite").parent / f"test_{p.stem}.py").exists()
    }
    assert without - WITHOUT_A_MIRROR_TEST == set(), "add a test module for these"
    assert WITHOUT_A_MIRROR_TEST - without == set(), "these have a test now: take them off the list"


KNOWN_CIRCLES: set[frozenset[str]] = set()
"""None left: the mock vLLM's side routes and the fake kubelet's pod workers declare the protocols they need."""


def test_no_module_imports_itself_round_about_but_the_listed_ones() -> None:
    """Import circles (typing-only imports included) between modules, found as strongly connected components of
    the import graph: a module that needs another's type declares a Protocol instead (mock_vllm/side_routes.py)."""
    import grimp

    graph = grimp.build_graph("agl_lite")
    edges = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: set[frozenset[str]] = set()

    def visit(v: str) -> None:  # Tarjan's algorithm (the graph has a few hundred modules: recursion is fine)
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = {stack.pop()}
            while v not in component:
                component.add(stack.pop())
            if len(component) > 1:
                circles.add(frozenset(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    assert circles == KNOWN_CIRCLES


def test_the_product_never_imports_its_test_doubles_distribution() -> None:
    """The fake Kubernetes cluster is a dev-only distribution (fake-k8s/): nothing in agl_lite may need it."""
    offenders = [
        str(p.relative_to(ROOT)) for p in (ROOT / "agl_lite").rglob("*.py") if "agl_fake_k8s" in p.read_text()
    ]
    assert offenders == []
