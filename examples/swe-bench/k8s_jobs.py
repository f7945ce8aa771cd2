"""Render, offline, the Job the Kubernetes controller creates for each SWE-bench instance's rollout.

It loads the controller's config (`controller.toml`), turns each instance into the rollout `algorithm.py` would
enqueue (the loader, with `--image-template`), resolves that rollout's plan as the runner does and builds its Job
with the controller's own manifest builder: the instance's image for both containers, the agent (Claude Code) as
the init container, the grader as the main one, an emptyDir between them, keys from the rollout's Secret. Nothing
is sent anywhere; review the YAML, or check it against a cluster with `kubectl apply --dry-run=server -f`.

    python k8s_jobs.py --image-template 'registry.example/agl-swe.{key}:0.1.0' --out .run/jobs
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

import yaml

# Run as a script from anywhere: the loader is the module beside it.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from loader import TaskOptions, load_instances, rollout_spec

from agl_lite.core.contract import agent_env, grader_env
from agl_lite.errors import ConfigError
from agl_lite.runner.k8s.manifest import build_job, launch_spec
from agl_lite.runner.k8s.options import parse_k8s_options
from agl_lite.runner.plan import resolve
from agl_lite.runner.seams import RunnerSettings
from agl_lite.service import load_config
from agl_lite.store.records import Rollout

HERE = Path(__file__).resolve().parent
SWE_BENCH_TEST_CMD = (
    "source /opt/miniconda3/bin/activate && conda activate testbed && "
    "python -m pytest -rA -p no:cacheprovider"
)
"""SWE-bench's images: the repository's environment is conda's `testbed` (pytest repositories only)."""
KEY_PLACEHOLDER = "not-a-key"
"""Keys reach pods only through the rollout's Secret (`secretKeyRef`); the values rendered here are never used."""


def render(
    config_path: Path,
    data: Path,
    *,
    image_template: str,
    store_url: str = "",
    test_cmd: str = SWE_BENCH_TEST_CMD,
) -> dict[str, dict[str, Any]]:
    """instance id → the Job of its rollout."""
    config = load_config(config_path)
    table = config.addons["runner"]
    options = parse_k8s_options(table.get("k8s", {}), file=str(config_path), where="addons.runner.k8s")
    public_url = store_url or table.get("public_url") or table["store_url"]
    settings = RunnerSettings(
        runner_id=table.get("runner_id", "k8s"),
        public_url=public_url,
        command=tuple(table.get("command", ())),
        timeout_s=table.get("timeout_s") or None,
        grader_command=tuple(table.get("grader_command", ())),
        grader_timeout_s=table.get("grader_timeout_s", 600.0) or None,
        env=table.get("env", {}),
    )
    task_options = TaskOptions(image_template=image_template, test_cmd=test_cmd)
    jobs = {}
    for instance in load_instances(data):
        spec = rollout_spec(instance, task_options)
        rid = "ro-" + re.sub(r"[^a-z0-9-]", "-", instance.instance_id.lower())
        rollout = Rollout(rid, spec.input, config=spec.config, metadata=spec.metadata)
        plan = resolve(settings, rollout)
        # Exactly as the controller builds it (agl_lite/runner/k8s/backend.py).
        launch = launch_spec(
            options,
            plan,
            rid,
            agent_env(public_url, KEY_PLACEHOLDER, rollout, "$(AGL_ATTEMPT_ID)"),
            grader_env(public_url, KEY_PLACEHOLDER, rollout, "$(AGL_ATTEMPT_ID)"),
        )
        jobs[instance.instance_id] = build_job(launch, options)
    return jobs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, default=HERE / "controller.toml")
    p.add_argument("--data", type=Path, default=HERE / "instances.jsonl")
    p.add_argument(
        "--image-template", required=True, help="Per-instance image, e.g. 'reg/agl-swe.{key}:0.1.0'."
    )
    p.add_argument("--store-url", default="", help="The gateway as pods reach it (default: the config's).")
    p.add_argument("--test-cmd", default=SWE_BENCH_TEST_CMD)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    try:
        jobs = render(
            args.config,
            args.data,
            image_template=args.image_template,
            store_url=args.store_url,
            test_cmd=args.test_cmd,
        )
    except (ValueError, ConfigError) as exc:  # bad data, a `latest` image, a bad config
        print(f"k8s_jobs: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    for instance_id, job in jobs.items():
        (args.out / f"{instance_id}.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
