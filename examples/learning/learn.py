"""The learning demo (`make demo`): a real policy trained with GRPO through the whole agl-lite loop, on CPU.

    python examples/learning/learn.py [--minutes 3] [--prompts 16] [--group 8] [--seed 0] [--workdir DIR]

What runs (docs/learning.md): a 0.8 M-parameter GPT (`agl_lite.testing.tiny_policy`) behind a vLLM-shaped server
(`agl_lite.testing.tiny_vllm`, its own process); the gateway (`agl-lite run`: SQLite store, capture, the local
runner with the fork server) in front of it; `AglLiteDaemon` enqueues each iteration's groups, the runner starts
one agent process per rollout (`agent.py`, the plain `openai` SDK), the gateway captures each call with its token
ids and logprobs, the daemon scores what was captured and posts the rewards with the admin key, merges the
trajectories and builds the batch; `to_dataproto` makes VERL's `DataProto`, and one GRPO update runs with VERL's
own advantage and policy-loss functions. The new weights go to the server through the gateway's weight sync (hold
new calls, drain, load, register the version, resume).

Checked every iteration, and printed: the training-inference mismatch (the logprob of every trained token
recomputed under the weights that sampled it, against the server's), that every call was stamped with the weights
version that served it, and that the response mask covers exactly the sampled tokens. At the end: the curve as a
PNG and as text, the per-iteration figures as JSON, and the trained rows (ids, masks, logprobs, rewards,
advantages, version) as JSONL.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import secrets
import socket
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from agl_lite.client import AglLiteClient
from agl_lite.integrations.verl.cpu_grpo import GRPOConfig, grpo_update
from agl_lite.integrations.verl.daemon import AglLiteDaemon, DaemonConfig, Sample
from agl_lite.integrations.verl.dataproto import to_dataproto
from agl_lite.store.records import RolloutConfig
from agl_lite.store.triplets import RolloutTriplets
from agl_lite.testing.tiny_policy import (
    EOS_ID,
    PAD_ID,
    CharTokenizer,
    TinyGPT,
    greedy_batch,
    parameters,
    policy_bytes,
    token_logprobs,
)

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from task import Problem, score, splits, teacher_answer  # noqa: E402

console = Console(stderr=True, width=None if sys.stderr.isatty() else 140)  # log lines stay whole in files
MODEL = "policy"
MAX_PROMPT, MAX_RESPONSE = 40, 8


@dataclass(slots=True)
class Settings:
    minutes: float = 3.0
    """Training wall time (rollouts and updates together): no iteration is started that would end after it, by
    the last one's time."""
    iterations: int = 0
    """A fixed number of iterations instead (0: as many as fit in `minutes`)."""
    prompts: int = 16
    group: int = 8
    lr: float = 3e-4
    sft_steps: int = 1000
    right_rate: float = 0.3
    seed: int = 0
    concurrency: int = 16
    workdir: Path = HERE / ".run"
    fast_start: bool = True
    """The runner's fork server (`preload = ["openai"]`); off: a fresh interpreter per agent."""
    corrupt: str | None = None
    """Break one thing on purpose, to show the checks fail: `mask` (shift the response mask one token right),
    `version` (load new weights without the gateway's weight sync: calls stamped with the old version)."""
    plot: bool = True
    progress: bool = True
    warm_start: Path | None = None
    """Start from these weights (a `policy_bytes` file) instead of running the warm start."""


@dataclass(slots=True)
class Iteration:
    iteration: int
    version: str
    mean_reward: float
    held_out_accuracy: float
    mismatch: float
    rollouts: int
    rollouts_per_s: float
    seconds: float
    elapsed_s: float
    version_errors: int
    mask_errors: int
    failed_rollouts: int
    group_reward_spread: float = 0.0
    """Mean over the GRPO groups of max - min reward: 0 where a group's samples all agree (no learning signal)."""
    staleness: float = 0.0
    """Mean versions between the weights that sampled a row and the weights it trains (0: on-policy)."""


@dataclass(slots=True)
class Summary:
    start_accuracy: float
    warm_start_s: float
    iterations: list[Iteration] = field(default_factory=list)
    workdir: str = ""

    @property
    def final_accuracy(self) -> float:
        return self.iterations[-1].held_out_accuracy if self.iterations else self.start_accuracy


# --- the model side ------------------------------------------------------------------------------------------


def prompt_ids(tok: CharTokenizer, p: Problem) -> list[int]:
    return tok.chat_prompt_ids([{"role": "user", "content": p.question}])


def accuracy(model: TinyGPT, tok: CharTokenizer, problems: Sequence[Problem]) -> float:
    model.eval()
    outs = greedy_batch(model, [prompt_ids(tok, p) for p in problems], MAX_RESPONSE)
    return sum(score(tok.decode(o), p.answer) for o, p in zip(outs, problems, strict=True)) / len(problems)


def warm_start(model: TinyGPT, tok: CharTokenizer, train: Sequence[Problem], s: Settings) -> None:
    """Supervised steps on the noisy teacher: the format, and addition, but no preference for the sum."""
    rng = random.Random(s.seed + 1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    model.train()
    with _progress(s, "warm start (supervised, noisy teacher)", s.sft_steps) as advance:
        for _ in range(s.sft_steps):
            batch = rng.sample(list(train), 64)
            rows = [
                prompt_ids(tok, p) + tok.encode(teacher_answer(p, rng, s.right_rate)) + [EOS_ID]
                for p in batch
            ]
            answers = [len(r) - len(prompt_ids(tok, p)) for r, p in zip(rows, batch, strict=True)]
            width = max(map(len, rows))
            ids = torch.full((len(rows), width), PAD_ID, dtype=torch.long)
            mask = torch.zeros_like(ids)
            target = torch.zeros_like(ids)
            for i, (row, n) in enumerate(zip(rows, answers, strict=True)):
                ids[i, width - len(row) :] = torch.tensor(row)
                mask[i, width - len(row) :] = 1
                target[i, width - n :] = 1
            lp = token_logprobs(model, ids, mask)
            loss = -(lp * target[:, 1:]).sum() / target.sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            advance()
    model.eval()


# --- the services --------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _wait_http(url: str, proc: asyncio.subprocess.Process, log: Path, name: str) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1.0)) as http:
        for _ in range(600):
            if proc.returncode is not None:
                tail = log.read_bytes()[-3000:].decode(errors="replace")  # noqa: ASYNC240 (once, on failure)
                raise SystemExit(f"{name} exited; the end of its log ({log}):\n{tail}")
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with http.get(url) as reply:
                    if reply.status < 500:
                        return
            await asyncio.sleep(0.1)
    raise SystemExit(f"{name} did not answer at {url} within 60 s; see {log}")


@contextlib.asynccontextmanager
async def services(s: Settings, weights: Path, key: str) -> AsyncIterator[tuple[str, str]]:
    """The policy server and the gateway, as processes; yields (gateway URL, policy server base URL)."""
    work = s.workdir
    tiny_port, gw_port = _free_port(), _free_port()
    py = sys.executable
    procs: list[asyncio.subprocess.Process] = []
    env = {**os.environ, "AGL_KEY": key}
    try:
        tiny_log = work / "policy-server.log"
        procs.append(
            await asyncio.create_subprocess_exec(
                py, "-m", "agl_lite.testing.tiny_vllm", "--weights", str(weights), "--port", str(tiny_port),
                "--model", "tiny", "--version", "v0",
                stdout=tiny_log.open("wb"), stderr=asyncio.subprocess.STDOUT, env=env,
            )
        )  # fmt: skip
        tiny = f"http://127.0.0.1:{tiny_port}"
        await _wait_http(f"{tiny}/health", procs[-1], tiny_log, "the policy server")
        (work / "routes.toml").write_text(
            f'[models.{MODEL}]\nbackend = "vllm"\n'
            f'upstreams = [{{ base_url = "{tiny}/v1", served_model = "tiny" }}]\n'
        )
        preload = json.dumps(["openai", str(HERE / "warmup.py")] if s.fast_start else [])
        (work / "agl-lite.toml").write_text(
            f"""routes = "routes.toml"

[server]
host = "127.0.0.1"
port = {gw_port}

[log]
level = "warning"

[addons]
chain = ["store", "auth", "store_api", "control", "metrics", "route", "capture", "tokens", "sink", "runner"]

[addons.store]
path = "agl-lite.db"

[addons.capture]
logprobs = true

[addons.runner]
backend = "local"
command = [{json.dumps(py)}, {json.dumps(str(HERE / "agent.py"))}]
concurrency = {s.concurrency}
preload = {preload}
"""
        )
        gw_log = work / "gateway.log"
        procs.append(
            await asyncio.create_subprocess_exec(
                py, "-m", "agl_lite", "run", "--config", str(work / "agl-lite.toml"),
                stdout=gw_log.open("wb"), stderr=asyncio.subprocess.STDOUT, env=env, cwd=work,
            )
        )  # fmt: skip
        gateway = f"http://127.0.0.1:{gw_port}"
        await _wait_http(f"{gateway}/healthz", procs[-1], gw_log, "the gateway")
        yield gateway, tiny
    finally:
        for proc in reversed(procs):
            if proc.returncode is None:
                proc.terminate()
                try:
                    await asyncio.wait_for(proc.wait(), 20)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()


# --- the checks ----------------------------------------------------------------------------------------------


def fidelity(result_batch: Any, data: Any, served: dict[str, tuple[str, list[int]]]) -> tuple[int, int]:
    """(calls stamped with another version than the one that served them, rows whose mask is not exactly the
    sampled tokens), from the server's own log of what it served."""
    version_errors = mask_errors = 0
    mask = data.batch["response_mask"]
    for i, sources in enumerate(result_batch.sources):
        expected = torch.zeros_like(mask[i])
        for response_id, start, end in sources:
            version, counts = served.get(response_id or "", ("?", [0]))
            if version != result_batch.model_versions[i]:
                version_errors += 1
            if end - start != min(counts[0], MAX_RESPONSE - start):
                mask_errors += 1
            expected[start:end] = 1
        if not torch.equal(expected, mask[i]):
            mask_errors += 1
    return version_errors, mask_errors


# --- the loop ------------------------------------------------------------------------------------------------


async def run(s: Settings) -> Summary:
    torch.manual_seed(s.seed)
    random.seed(s.seed)
    s.workdir.mkdir(parents=True, exist_ok=True)
    for old in ("agl-lite.db", "agl-lite.db-wal", "agl-lite.db-shm", "trained.jsonl"):
        (s.workdir / old).unlink(missing_ok=True)
    tok = CharTokenizer()
    train, held = splits(s.seed)
    model = TinyGPT()
    console.print(f"policy: {parameters(model) / 1e6:.2f} M parameters; task: two-digit addition "
                  f"({len(train)} train, {len(held)} held out)")  # fmt: skip
    t0 = time.monotonic()
    if s.warm_start is not None:
        from agl_lite.testing.tiny_policy import load_policy

        model = load_policy(s.warm_start.read_bytes())
    else:
        warm_start(model, tok, train, s)
    summary = Summary(accuracy(model, tok, held), time.monotonic() - t0, workdir=str(s.workdir))
    console.print(f"after the warm start ({summary.warm_start_s:.0f} s): held-out greedy accuracy "
                  f"{summary.start_accuracy:.1%}")  # fmt: skip
    weights = s.workdir / "weights-v0.pt"
    weights.write_bytes(policy_bytes(model))
    key = os.environ.get("AGL_KEY") or secrets.token_hex(32)
    _dashboard_config(s.workdir, key)
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=s.lr, weight_decay=0.0)
    rng = random.Random(s.seed + 2)

    def logprobs(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return token_logprobs(model, ids, mask)

    def scorer(rt: RolloutTriplets, sample: Sample) -> float:
        text = rt.triplets[-1].text if rt.triplets else None
        return score(text, sample.metadata["answer"])

    async with services(s, weights, key) as (gateway, tiny), AglLiteClient(gateway, key) as client:
        daemon = AglLiteDaemon(
            client,
            DaemonConfig(
                model=MODEL,
                max_prompt_length=MAX_PROMPT,
                max_response_length=MAX_RESPONSE,
                pad_token_id=PAD_ID,
                n=s.group,
                merge="none",
                coalesce_s=0.05,
                rollout_config=RolloutConfig(max_attempts=2, timeout_s=60),
            ),
            decode=lambda ids: tok.decode(ids, skip_special_tokens=False),
        )
        async with aiohttp.ClientSession(tiny, timeout=aiohttp.ClientTimeout(total=60)) as http:
            async with daemon.weight_sync([f"{tiny}/v1"], "v0"):
                pass  # the server starts with v0: register it
            started = time.monotonic()
            deadline = started + s.minutes * 60
            total = s.iterations or None
            with _progress(s, "GRPO", total) as advance:
                k = cursor = 0
                last_s = 0.0  # the last iteration's time: one that would end past the deadline is not started
                while (k < s.iterations) if s.iterations else (time.monotonic() + last_s <= deadline):
                    k += 1
                    t_it = time.monotonic()
                    batch = rng.sample(train, s.prompts)
                    samples = [Sample({"question": p.question}, {"answer": p.answer}) for p in batch]
                    result = await daemon.step(samples, score=scorer)
                    rollout_s = time.monotonic() - t_it
                    data = to_dataproto(result.batch)
                    async with http.get("/served_versions", params={"after": cursor}) as reply:
                        reply.raise_for_status()
                        log = await reply.json()
                    cursor = log["next"]
                    served = {rid: (version, counts) for rid, version, counts in log["served"]}
                    if s.corrupt == "mask":  # on purpose: the mask one token to the right
                        data.batch["response_mask"] = torch.roll(data.batch["response_mask"], 1, dims=1)
                    version_errors, mask_errors = fidelity(result.batch, data, served)
                    metrics = grpo_update(logprobs, params, opt, data, GRPOConfig())
                    _export(s.workdir / "trained.jsonl", k, result.batch, data)
                    version = f"v{k}"
                    path = s.workdir / "weights-latest.pt"
                    path.write_bytes(policy_bytes(model))
                    load = {"model_path": str(path), "version": version}
                    if s.corrupt == "version":  # on purpose: new weights, but the gateway never hears of them
                        await _load(http, load)
                    else:
                        async with daemon.weight_sync([f"{tiny}/v1"], version):
                            await _load(http, load)
                    it = Iteration(
                        iteration=k,
                        version=result.batch.model_versions[0] if result.batch.size else "?",
                        mean_reward=result.metrics.mean_reward,
                        held_out_accuracy=accuracy(model, tok, held),
                        mismatch=metrics.get("mismatch/mean_abs", float("nan")),
                        rollouts=result.metrics.rollouts,
                        rollouts_per_s=result.metrics.rollouts / rollout_s,
                        seconds=time.monotonic() - t_it,
                        elapsed_s=time.monotonic() - started,
                        version_errors=version_errors,
                        mask_errors=mask_errors,
                        failed_rollouts=result.metrics.failed_rollouts,
                        group_reward_spread=_group_spread(result.batch.uid, data),
                        staleness=_staleness(result.batch.model_versions, k - 1),
                    )
                    last_s = it.seconds
                    summary.iterations.append(it)
                    # The dashboard's training page plots these, one point per iteration (docs/dashboard.md).
                    await client.put_resource("training", asdict(it))
                    _report(it)
                    advance()
    (s.workdir / "summary.json").write_text(json.dumps(_summary_json(summary), indent=2))
    return summary


def _group_spread(groups: Sequence[str], data: Any) -> float:
    rewards: dict[str, list[float]] = {}
    for group, reward in zip(groups, data.batch["token_level_scores"].sum(-1).tolist(), strict=True):
        rewards.setdefault(group, []).append(reward)
    return sum(max(r) - min(r) for r in rewards.values()) / len(rewards) if rewards else 0.0


def _staleness(versions: Sequence[str | None], trained: int) -> float:
    """How many versions behind `v{trained}` (the weights this update starts from) the rows were sampled."""
    behind = [trained - int(v[1:]) for v in versions if v and v[:1] == "v" and v[1:].isdigit()]
    return sum(behind) / len(behind) if behind else 0.0


def _dashboard_config(work: Path, key: str) -> None:
    """A gateway config that serves only the store and the dashboard over this run's data, and its admin key in a
    file only this user can read (`AGL_KEY_FILE`): what the run's last line tells the user to start."""
    (work / "dashboard.toml").write_text(
        '[server]\nhost = "127.0.0.1"\nport = 8100\n\n[addons]\nchain = ["store", "auth", "store_api", "dashboard"]\n'
        '\n[addons.store]\npath = "agl-lite.db"\n'
    )
    key_file = work / "admin.key"
    key_file.touch(mode=0o600)
    key_file.chmod(0o600)
    key_file.write_text(key + "\n")


async def _load(http: aiohttp.ClientSession, load: dict[str, str]) -> None:
    """The policy server loads the new weights (their file), between two of its batches."""
    async with http.post("/update_weights_from_disk", json=load) as reply:
        if reply.status != 200:
            raise SystemExit(f"the policy server did not load {load['model_path']}: {await reply.text()}")


def _export(path: Path, iteration: int, batch: Any, data: Any) -> None:
    """The rows as the trainer saw them: ids, masks, the server's logprobs, rewards, advantages, version."""
    b = data.batch
    keys = set(b.keys())  # (a TensorDict refuses `in` itself)
    with path.open("a") as f:
        for i in range(batch.size):
            mask = b["response_mask"][i]
            n = int(b["attention_mask"][i, : batch.prompt_length].sum())
            trained = mask.bool()
            adv = b["advantages"][i][trained] if "advantages" in keys else torch.zeros(0)
            logprobs = b["rollout_log_probs"][i][trained].tolist() if "rollout_log_probs" in keys else None
            row = {
                "iteration": iteration,
                "rollout_id": batch.rollout_ids[i],
                "group": batch.uid[i],
                "model_version": batch.model_versions[i],
                "prompt_ids": b["prompts"][i, batch.prompt_length - n :].tolist(),
                "response_ids": b["responses"][i][trained].tolist(),
                "response_mask": mask.tolist(),
                "logprobs": logprobs,
                "reward": float(b["token_level_scores"][i].sum()),
                "advantage": float(adv[0]) if len(adv) else 0.0,
            }  # fmt: skip
            f.write(json.dumps(row) + "\n")


def _report(it: Iteration) -> None:
    flags = ""
    if it.version_errors or it.mask_errors:
        flags = f"  [red]version errors {it.version_errors}, mask errors {it.mask_errors}[/red]"
    console.print(
        f"it {it.iteration:3d}  {it.version:>4}  reward {it.mean_reward:.3f}  held-out {it.held_out_accuracy:6.1%}"
        f"  mismatch {it.mismatch:.1e}  {it.rollouts_per_s:5.1f} rollouts/s  {it.seconds:4.1f} s{flags}"
    )


def _summary_json(summary: Summary) -> dict[str, Any]:
    return {
        "start_accuracy": summary.start_accuracy,
        "final_accuracy": summary.final_accuracy,
        "warm_start_s": summary.warm_start_s,
        "iterations": [asdict(it) for it in summary.iterations],
    }


@contextlib.contextmanager
def _progress(s: Settings, what: str, total: int | None) -> Any:
    if not s.progress:
        yield lambda: None
        return
    columns = [TextColumn(what), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(what, total=total)
        yield lambda: bar.advance(task)


# --- what the user sees at the end ---------------------------------------------------------------------------


def text_chart(values: Sequence[float], width: int = 60, height: int = 10, label: str = "") -> str:
    """A compact chart of values in [0, 1], one column per iteration (resampled to `width`)."""
    if not values:
        return ""
    n = min(width, len(values))
    cols = [values[min(int(i * len(values) / n), len(values) - 1)] for i in range(n)]
    lines = []
    for level in range(height, 0, -1):
        lo = (level - 1) / height
        row = "".join("█" if v > lo + 0.5 / height else ("▄" if v > lo else " ") for v in cols)
        lines.append(f"{lo + 1 / height:4.0%} │{row}")
    lines.append("     └" + "─" * len(cols) + f" {label}")
    return "\n".join(lines)


def plot(summary: Summary, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        console.print("matplotlib is not installed: no PNG (pip install matplotlib)")
        return False
    its = summary.iterations
    x = [0, *(it.iteration for it in its)]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    ax.plot(
        x, [summary.start_accuracy, *(it.held_out_accuracy for it in its)], label="held-out greedy accuracy"
    )
    ax.plot(
        [it.iteration for it in its], [it.mean_reward for it in its], label="mean reward (sampled)", alpha=0.7
    )
    ax.set_xlabel("GRPO iteration")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title("agl-lite learning demo: two-digit addition, 0.8 M-parameter policy, CPU")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    d = Settings()
    parser.add_argument("--minutes", type=float, default=d.minutes, help="training wall time (default 3)")
    parser.add_argument("--iterations", type=int, default=0, help="a fixed number of iterations instead")
    parser.add_argument("--prompts", type=int, default=d.prompts, help="prompts per iteration")
    parser.add_argument("--group", type=int, default=d.group, help="rollouts per prompt (the GRPO group)")
    parser.add_argument("--lr", type=float, default=d.lr)
    parser.add_argument("--sft-steps", type=int, default=d.sft_steps, help="warm-start steps")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--concurrency", type=int, default=d.concurrency, help="agents at once")
    parser.add_argument("--workdir", type=Path, default=d.workdir)
    parser.add_argument("--no-fast-start", action="store_true", help="a fresh interpreter per agent")
    parser.add_argument("--corrupt", choices=["mask", "version"], help="break one thing on purpose")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    s = Settings(
        minutes=args.minutes,
        iterations=args.iterations,
        prompts=args.prompts,
        group=args.group,
        lr=args.lr,
        sft_steps=args.sft_steps,
        seed=args.seed,
        concurrency=args.concurrency,
        workdir=args.workdir.resolve(),
        fast_start=not args.no_fast_start,
        corrupt=args.corrupt,
        progress=not args.no_progress and sys.stderr.isatty(),
    )
    summary = asyncio.run(run(s))
    its = summary.iterations
    print()
    print(
        text_chart([summary.start_accuracy, *(it.held_out_accuracy for it in its)], label="held-out accuracy")
    )
    rise = summary.final_accuracy - summary.start_accuracy
    print(
        f"\nheld-out greedy accuracy {summary.start_accuracy:.1%} → {summary.final_accuracy:.1%} "
        f"({rise * 100:+.1f} points) in {len(its)} iterations, {its[-1].elapsed_s if its else 0:.0f} s of training"
    )
    if its:
        worst = max(it.mismatch for it in its)
        rate = sum(it.rollouts for it in its) / sum(it.seconds for it in its)
        errors = sum(it.version_errors for it in its), sum(it.mask_errors for it in its)
        print(
            f"logprob mismatch ≤ {worst:.1e} (bound 1e-3); {rate:.1f} rollouts/s over the run (updates included); "
            f"version errors {errors[0]}, mask errors {errors[1]}"
        )
    png = s.workdir / "learning.png"
    if plot(summary, png):
        print(f"curve: {png}")
    print(f"data: {s.workdir}/summary.json (per iteration), {s.workdir}/trained.jsonl (the trained rows), "
          f"{s.workdir}/agl-lite.db (every rollout and captured call: agl-client with AGL_URL/AGL_KEY)")  # fmt: skip
    agl = Path(sys.executable).parent / "agl-lite"
    print(f"dashboard: cd {s.workdir} && AGL_KEY_FILE=admin.key {agl} run --config dashboard.toml, then open "
          "http://127.0.0.1:8100/dashboard/ (log in with the key in admin.key)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
