"""The math PoC's Kubernetes manifests: deploy/k8s with this example's agent image, tag and gateway URL.

Plain text substitutions on the shipped manifests, each required to match exactly once, so that a change in
deploy/k8s that breaks one fails here loudly instead of deploying something else. The result is validated offline
against the Kubernetes schemas by tests/e2e/test_math_poc_k8s.py.

    python k8s_manifests.py --tag 0.1.0 --store-url http://host.minikube.internal:8100 --out .run/k8s
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "k8s"


def render(tag: str, store_url: str) -> dict[str, str]:
    """File name → manifest text."""
    files = {p.name: p.read_text() for p in sorted(DEPLOY.glob("*.yaml"))}
    edits = {
        "configmap.yaml": [
            ('image = "agl-math-agent:0.1.0"', f'image = "agl-math-agent:{tag}"'),
            ('store_url = "http://host.minikube.internal:8100"', f'store_url = "{store_url}"'),
        ],
        "controller.yaml": [("image: agl-lite:0.1.0", f"image: agl-lite:{tag}")],
    }
    for name, pairs in edits.items():
        for old, new in pairs:
            if files[name].count(old) != 1:
                raise SystemExit(f"deploy/k8s/{name}: expected one {old!r} to replace; the manifest changed")
            files[name] = files[name].replace(old, new)
    return files


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--tag", default="0.1.0", help="Image tag (never latest: IfNotPresent uses the loaded image)."
    )
    p.add_argument("--store-url", required=True, help="The gateway as pods reach it.")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if args.tag == "latest":
        raise SystemExit("--tag latest would make the cluster pull instead of using the image loaded into it")
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in render(args.tag, args.store_url).items():
        (args.out / name).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
