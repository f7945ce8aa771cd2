"""The servers under test: the minimal upstream, the bare relay, agl-lite and (if installed) LiteLLM's proxy.

Each starts in its own process (see procs.py) on a free port, and is checked to answer a well-formed 200 in both
modes before anything is measured.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from procs import BenchError, Children, free_port

__all__ = [
    "DEFAULT_CHAIN",
    "LITELLM_SKIP",
    "MODES",
    "STREAM_EVENTS",
    "Target",
    "check_answers",
    "request_body",
    "start_agl_lite",
    "start_litellm",
    "start_relay",
    "start_upstream",
]

HERE = Path(__file__).resolve().parent
PY = sys.executable
MODES = ("plain", "stream")
STREAM_EVENTS = 25  # bench/upstream.py: 24 chunks + [DONE]
LITELLM_SKIP = "skipped (pip install 'litellm[proxy]')"


def request_body(mode: str, api: str = "chat") -> bytes:
    """The bench's question: a chat completions body, or the same question as a Responses API body."""
    if api == "responses":
        return json.dumps(
            {
                "model": "bench",
                "instructions": "You are a helpful assistant.",
                "input": "What is 2 + 3? Answer in one sentence.",
                "max_output_tokens": 32,
                "stream": mode == "stream",
            },
            separators=(",", ":"),
        ).encode()
    return json.dumps(
        {
            "model": "bench",
            "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What is 2 + 3? Answer in one sentence."},
            ],
            "max_tokens": 32,
            "stream": mode == "stream",
        },
        separators=(",", ":"),
    ).encode()


@dataclass
class Target:
    name: str
    url: str
    """The chat completions URL (the Responses URL when `api` is `responses`)."""
    headers: dict[str, str] = field(default_factory=dict)
    pid: int | None = None
    reshapes: bool = False
    """True when the server re-encodes responses (LiteLLM): only status and [DONE] are checked."""
    api: str = "chat"
    """`responses`: the target is asked the same question through the Responses API (agl-lite's translation)."""


def start_upstream(children: Children, stream_writes: int, cpus: frozenset[int] | None) -> Target:
    port = free_port()
    argv = [PY, str(HERE / "upstream.py"), "--port", str(port), "--stream-writes", str(stream_writes)]
    children.spawn("upstream", argv, cpus=cpus)
    children.wait_ready("upstream", f"http://127.0.0.1:{port}/v1/models", 15)
    return Target("direct", f"http://127.0.0.1:{port}/v1/chat/completions", pid=children.pid("upstream"))


def start_relay(children: Children, upstream_base: str, cpus: frozenset[int] | None) -> Target:
    port = free_port()
    argv = [PY, str(HERE / "relay.py"), "--port", str(port), "--upstream", upstream_base]
    children.spawn("relay", argv, cpus=cpus)
    children.wait_ready("relay", f"http://127.0.0.1:{port}/v1/models", 20)
    return Target("bare relay", f"http://127.0.0.1:{port}/v1/chat/completions", pid=children.pid("relay"))


def run_as_baseline(source: Path, code: str) -> subprocess.CompletedProcess[str]:
    """`code` run as the baseline's process runs: `-P`, the checkout `source` on PYTHONPATH."""
    env = {**os.environ, "PYTHONPATH": str(source)}
    return subprocess.run([PY, "-P", "-c", code], env=env, capture_output=True, text=True, check=False)


def check_source(source: Path) -> None:
    """Fail unless a process started as the baseline imports the agl_lite package of `source`."""
    out = run_as_baseline(source, "import agl_lite, sys; sys.stdout.write(agl_lite.__file__)")
    package = Path(out.stdout.strip() or "?").resolve().parent
    if package != (source / "agl_lite").resolve():
        raise BenchError(
            f"the baseline would import agl_lite from {package}, not from {source}: {out.stderr[-300:]}"
        )


def scans_of(source: Path) -> str:
    """Which byte scans the baseline runs: the C ones only where its checkout has its extension built."""
    out = run_as_baseline(source, "from agl_lite.capture import native; print(native.NATIVE)")
    return "C scans" if out.stdout.strip() == "True" else "Python scans"


def agl_lite_argv() -> list[str]:
    beside = Path(PY).parent / "agl-lite"
    if beside.exists():
        return [str(beside)]
    found = shutil.which("agl-lite")
    return [found] if found else [PY, "-c", "from agl_lite.cli import main; main()"]


DEFAULT_CHAIN = ("auth", "route")


AGENT_ROLLOUT = "bench-rollout"


def start_agl_lite(
    children: Children,
    upstream_base: str,
    tmp: Path,
    cpus: frozenset[int] | None,
    chain: Sequence[str] = DEFAULT_CHAIN,
    *,
    agent_path: bool = False,
    source: Path | None = None,
    name: str = "agl-lite",
) -> Target:
    """agl-lite with `chain`; with `store` in it, the default SQLite store (and durability) in `tmp`.

    `source`: run the agl-lite of another checkout (its `agl_lite/` package, on PYTHONPATH ahead of the installed
    one), as `name`: an A/B of two builds in the same interleaved rounds (`bench/gateway.py --baseline`).

    `agent_path`: the calls go where every agent sends them, `/r/{rollout}/a/{attempt}/v1` with the rollout's
    agent key (a running rollout is made first): attributed, gated on the rollout, each with an `llm_call` event.
    """
    port = free_port()
    key = os.environ.get("AGL_KEY") or secrets.token_hex(32)
    if len(key) < 16:
        key = secrets.token_hex(32)
    (tmp / "routes.toml").write_text(
        '[models.bench]\nbackend = "vllm"\n'
        f'upstreams = [{{ base_url = "{upstream_base}/v1", served_model = "bench" }}]\n'
    )
    (tmp / "agl-lite.toml").write_text(
        f'routes = "routes.toml"\n\n[server]\nhost = "127.0.0.1"\nport = {port}\n\n'
        f'[log]\nlevel = "info"\n\n[addons]\nchain = {json.dumps(list(chain))}\n'
        + ('\n[addons.store]\npath = "bench-store.db"\n' if "store" in chain else "")
    )
    # -P: `python -m` puts the working directory first on sys.path, ahead of PYTHONPATH; run from a checkout, the
    # baseline would import that checkout's agl_lite, and the A/B would measure one build twice (until 2026-12-05
    # it did: docs/performance.md).
    argv = agl_lite_argv() if source is None else [PY, "-P", "-m", "agl_lite"]
    env = {"AGL_KEY": key} if source is None else {"AGL_KEY": key, "PYTHONPATH": str(source)}
    if source is not None:
        check_source(source)
    children.spawn(name, [*argv, "run", "--config", str(tmp / "agl-lite.toml")], cpus=cpus, env=env)
    children.wait_ready(name, f"http://127.0.0.1:{port}/healthz", 30)
    base = f"http://127.0.0.1:{port}"
    if not agent_path:
        return Target(
            name, base + "/v1/chat/completions", {"Authorization": f"Bearer {key}"}, pid=children.pid(name)
        )
    if "store" not in chain:
        raise BenchError(
            "--agent-path needs `store` (and `store_api`) in the chain: the calls go to a rollout"
        )
    rollout = {"rollouts": [{"input": "bench", "rollout_id": AGENT_ROLLOUT}]}
    _admin_post(base + "/api/rollouts", key, rollout)
    _admin_post(base + "/api/runner/claim", key, {"runner_id": "bench", "limit": 1})
    from agl_lite.core.contract import derive_key  # (the bench runs in agl-lite's venv)

    return Target(
        name,
        f"{base}/r/{AGENT_ROLLOUT}/a/bench-attempt/v1/chat/completions",
        {"Authorization": f"Bearer {derive_key(key, AGENT_ROLLOUT)}"},
        pid=children.pid(name),
    )


def _admin_post(url: str, key: str, body: object) -> None:
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=10) as resp:  # loopback only
        if resp.status >= 300:
            raise BenchError(f"POST {url}: {resp.status}")


def litellm_argv() -> list[str] | None:
    beside = Path(PY).parent / "litellm"
    if beside.exists():
        return [str(beside)]
    if importlib.util.find_spec("litellm") is not None:
        return [PY, "-m", "litellm.proxy.proxy_cli"]
    found = shutil.which("litellm")
    return [found] if found else None


def start_litellm(
    children: Children, upstream_base: str, tmp: Path, cpus: frozenset[int] | None
) -> Target | None:
    argv = litellm_argv()
    if argv is None:
        return None
    port = free_port()
    master = "sk-bench-" + secrets.token_hex(16)
    (tmp / "litellm.yaml").write_text(
        "model_list:\n"
        "  - model_name: bench\n"
        "    litellm_params:\n"
        "      model: openai/bench\n"
        f"      api_base: {upstream_base}/v1\n"
        "      api_key: bench\n"
        "litellm_settings:\n"
        "  drop_params: true\n"
        "general_settings:\n"
        f"  master_key: {master}\n"
    )
    children.spawn(
        "litellm",
        [
            *argv,
            "--config",
            str(tmp / "litellm.yaml"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--num_workers",
            "1",
        ],
        cpus=cpus,
        env={"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"},
        cwd=tmp,
    )
    children.wait_ready("litellm", f"http://127.0.0.1:{port}/health/liveliness", 120)
    return Target(
        "litellm",
        f"http://127.0.0.1:{port}/v1/chat/completions",
        {"Authorization": f"Bearer {master}"},
        pid=children.pid("litellm"),
        reshapes=True,
    )


def check_answers(target: Target) -> None:
    """One request per mode: a 200 with the expected shape, so that no cell measures error responses."""
    for mode in MODES:
        req = urllib.request.Request(
            target.url,
            data=request_body(mode, target.api),
            method="POST",
            headers={"Content-Type": "application/json", **target.headers},
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                status, body = resp.status, resp.read()
        except OSError as exc:
            raise BenchError(f"{target.name} ({mode}) failed: {exc}") from exc
        if status != 200:
            raise BenchError(f"{target.name} ({mode}) answered {status}: {body[:300]!r}")
        if target.api == "responses":
            done = (
                b"event: response.completed" in body if mode == "stream" else b'"status":"completed"' in body
            )
            if not done:
                raise BenchError(f"{target.name} did not complete a Response: {body[-300:]!r}")
        elif mode == "stream":
            events = body.count(b"data: ")
            if not body.endswith(b"data: [DONE]\n\n") or (not target.reshapes and events != STREAM_EVENTS):
                raise BenchError(
                    f"{target.name} streamed an unexpected body ({events} events): {body[-200:]!r}"
                )
        elif not target.reshapes and "token_ids" not in json.loads(body)["choices"][0]:
            raise BenchError(f"{target.name} lost the token ids: {body[:300]!r}")
