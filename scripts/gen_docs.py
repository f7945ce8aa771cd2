"""Regenerate the generated sections of docs/ (between `<!-- BEGIN GENERATED: x -->` and its END marker).

`--check` exits 1 when a section is out of date (the test suite runs it), instead of writing.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from agl_lite.addons import ADDONS, DEFAULT_CHAIN
from agl_lite.core import config, hooks
from agl_lite.core.registry import resolve_addon
from agl_lite.core.routes import HttpRoute
from agl_lite.core.server import CORE_ROUTES
from agl_lite.runner.k8s.options import K8sOptions

ROOT = Path(__file__).resolve().parent.parent


def addon_options() -> str:
    parts = []
    for name in ADDONS:
        options = getattr(resolve_addon(name, ADDONS), "Options", None)
        if options is not None:
            parts.append(f"### `[addons.{name}]`\n\n" + config.reference_markdown(options))
    return "\n".join(parts)


def routes_file() -> str:
    from agl_lite.addons.router import ModelRoute, UpstreamSpec

    return (
        "### `[models.NAME]`\n\n"
        + config.reference_markdown(ModelRoute)
        + "\n### `[[models.NAME.upstreams]]`\n\n"
        + config.reference_markdown(UpstreamSpec)
    )


def http_routes() -> str:
    routes: list[HttpRoute] = list(CORE_ROUTES)
    for name in ADDONS:
        cls = resolve_addon(name, ADDONS)
        routes.extend(getattr(cls, "routes", ()))
    lines = ["| method | path | scope | kind | what |", "|---|---|---|---|---|"]
    lines += [f"| {r.method} | `{r.path}` | {r.scope.value} | {r.kind.value} | {r.summary} |" for r in routes]
    return "\n".join(lines) + "\n"


def _schema_table(schema: dict[str, object]) -> str:
    required = set(schema.get("required", []))  # type: ignore[call-overload]
    rows = []
    for field, spec in schema.get("properties", {}).items():  # type: ignore[attr-defined]
        options = spec.get("anyOf", [spec])
        kind = " or ".join(o.get("type") or o.get("$ref", "object").rsplit("/", 1)[-1] for o in options)
        if spec.get("type") == "array" and "$ref" in spec.get("items", {}):
            kind = f"array of {spec['items']['$ref'].rsplit('/', 1)[-1]}"
        rows.append(
            f"| `{field}` | {kind} | {'yes' if field in required else ''} | {spec.get('description', '')} |"
        )
    return "| field | type | required | meaning |\n|---|---|---|---|\n" + "\n".join(rows) + "\n"


def api_bodies() -> str:
    """The body and the query parameters of each endpoint of the built-in addons, as each declared them."""
    routes = [r for name in ADDONS for r in getattr(resolve_addon(name, ADDONS), "routes", ())]
    out, done = [], set()
    for route in routes:
        model = route.body
        if model is None:
            continue
        schema = model.model_json_schema()
        out.append(f"**`{route.name}`** takes `{model.__name__}`.\n")
        for sub_name, sub in [(model.__name__, schema), *schema.get("$defs", {}).items()]:
            if sub_name not in done and "properties" in sub:
                done.add(sub_name)
                out.append(f"`{sub_name}`\n\n" + _schema_table(sub))
    out.append("Query parameters (any other is a 400):\n")
    for route in routes:
        if route.query:
            params = ", ".join(f"`{name}` ({_param(p)})" for name, p in route.query.items())
            out.append(f"- `{route.name}`: {params}")
    return "\n".join(out) + "\n"


def _number(x: float) -> str:
    """A bound as people read it: 2^62 rather than 4611686018427387904, 8,388,608 rather than 8388608."""
    if not float(x).is_integer():
        return f"{x:g}"
    n = int(x)
    if n > 2**20 and n & (n - 1) == 0:
        return f"2^{n.bit_length() - 1}"
    if n > 2**20 and (n + 1) & n == 0:
        return f"2^{n.bit_length()}−1"
    return f"{n:,}"


def _param(p: Any) -> str:
    if p.enum:
        text = " \\| ".join(f"`{e}`" for e in p.enum)
    elif p.minimum is not None or p.maximum is not None:
        lo = "" if p.minimum is None else _number(p.minimum)
        hi = "" if p.maximum is None else _number(p.maximum)
        text = f"{p.type} {lo}–{hi}" if hi else f"{p.type} ≥ {lo}"
    else:
        text = p.type
    return text + ("" if p.default is None else f", default {p.default!r}")


SECTIONS = {
    "hooks": hooks.reference_markdown,
    "config": lambda: config.reference_markdown(
        config.GatewayConfig, defaults={"addons.chain": DEFAULT_CHAIN}
    ),
    "addon-options": addon_options,
    "routes-file": routes_file,
    "http-routes": http_routes,
    "api-bodies": api_bodies,
    "k8s-options": lambda: config.reference_markdown(K8sOptions),
}

MARKER = re.compile(r"(<!-- BEGIN GENERATED: ([\w-]+) -->\n)(.*?)(<!-- END GENERATED: \2 -->)", re.S)


def render(text: str) -> str:
    return MARKER.sub(lambda m: m.group(1) + SECTIONS[m.group(2)]() + m.group(4), text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if a generated section is out of date")
    args = parser.parse_args()
    stale = []
    for path in sorted((ROOT / "docs").glob("*.md")):
        text = path.read_text()
        new = render(text)
        if new != text:
            stale.append(path.relative_to(ROOT))
            if not args.check:
                path.write_text(new)
    if args.check and stale:
        print(f"out of date (run `make docs`): {', '.join(map(str, stale))}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
