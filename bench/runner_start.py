"""Rollouts/s of the local runner with a trivial Python agent, side by side: a fresh interpreter per attempt, and
the fork server (`preload`), with and without a warm-up script. The agent does what every agent does first:
imports the `openai` SDK, builds a client and makes one call (to the mock vLLM, on loopback); each attempt runs in
the sandbox, as by default. The runner's own work (claims, attempts, the store) is in the figure: it drives
`LocalBackend.launch`, the same call the runner makes.

    .venv/bin/python bench/runner_start.py [--rollouts 64] [--concurrency 8] [--markdown]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from agl_lite.runner.env import ContractEnv
from agl_lite.runner.local import LocalBackend
from agl_lite.runner.plan import resolve
from agl_lite.runner.seams import RunnerSettings
from agl_lite.store.records import Attempt, AttemptStatus, Rollout, RolloutConfig, RolloutStatus
from agl_lite.testing import MockVLLM, running_mock

AGENT = """
import os
from openai import OpenAI
client = OpenAI(base_url=os.environ["MOCK_URL"], api_key="bench", max_retries=0)
client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "hi"}], max_tokens=1)
"""
WARMUP = """
from openai import OpenAI
from openai.types.chat import ChatCompletion
OpenAI(api_key="warm-up", base_url="http://127.0.0.1:1/v1").chat.completions
ChatCompletion.model_validate({"id": "w", "object": "chat.completion", "created": 0, "model": "w", "choices": [
    {"index": 0, "message": {"role": "assistant", "content": ""}, "finish_reason": "stop"}]})
"""


async def measure(mode: str, rollouts: int, concurrency: int, work: Path, url: str) -> tuple[float, int]:
    preload: tuple[str, ...] = ()
    if mode == "fork":
        preload = ("openai",)
    elif mode == "fork+warm-up":
        preload = ("openai", str(work / "warmup.py"))
    settings = RunnerSettings(
        runner_id="bench",
        public_url="http://127.0.0.1:9",
        pass_env=("PATH",),
        workdir=work,
        env={"MOCK_URL": url},
        preload=preload,
    )
    backend = LocalBackend(settings, {})
    await backend.open(None, "bench")  # type: ignore[arg-type]  # (the local backend needs no store)
    contract = ContractEnv(settings.public_url, "bench-" + "0" * 58)
    command = {"command": [sys.executable, str(work / "agent.py")]}
    gate = asyncio.Semaphore(concurrency)
    failed = 0

    async def one(i: int) -> None:
        nonlocal failed
        rollout = Rollout(
            f"ro-{mode}-{i}", {}, status=RolloutStatus.RUNNING, config=RolloutConfig(runner=command)
        )
        attempt = Attempt(f"at-{i}", rollout.id, 1)
        launch = _launch(settings, rollout, attempt, contract)
        async with gate:
            outcome = await backend.launch(launch)
        if outcome.status is not AttemptStatus.SUCCEEDED:
            failed += 1
            if failed == 1:
                print(f"  {mode}: an attempt failed: {outcome.message}", file=sys.stderr)

    await one(-1)  # the fork server starts (and imports) once, before the clock
    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(rollouts)))
    elapsed = time.perf_counter() - start
    await backend.close()
    return rollouts / elapsed, failed


def _launch(settings: RunnerSettings, rollout: Rollout, attempt: Attempt, contract: ContractEnv) -> object:
    from agl_lite.runner.seams import Launch

    return Launch(
        rollout,
        resolve(settings, rollout),
        attempt,
        contract.agent(rollout, attempt.id),
        contract.grader(rollout, attempt.id),
    )


async def main_async(args: argparse.Namespace) -> int:
    work = Path(tempfile.mkdtemp(prefix="agl-bench-runner-"))
    (work / "agent.py").write_text(AGENT)
    (work / "warmup.py").write_text(WARMUP)
    rows = []
    async with running_mock(MockVLLM()) as url:
        for mode in ("fresh", "fork", "fork+warm-up"):
            n = max(8, args.rollouts // 4) if mode == "fresh" else args.rollouts
            rate, failed = await measure(mode, n, args.concurrency, work, url)
            rows.append((mode, n, rate, failed))
            print(f"{mode:>13}: {rate:7.1f} rollouts/s ({n} rollouts, {failed} failed)", file=sys.stderr)
    base = rows[0][2]
    print(
        f"\nlocal runner, trivial openai agent, sandboxed, concurrency {args.concurrency}, {os.cpu_count()} CPUs"
    )
    header = "| start | rollouts | rollouts/s | vs fresh |"
    print(header if args.markdown else header.replace("|", " "))
    if args.markdown:
        print("|---|---:|---:|---:|")
    for mode, n, rate, failed in rows:
        line = f"| {mode} | {n} | {rate:.1f} | {rate / base:.1f}× |" + (
            f" ({failed} failed)" if failed else ""
        )
        print(line if args.markdown else line.replace("|", " "))
    if args.markdown:
        print(f"\n{platform.platform()}, Python {platform.python_version()}")
    return 1 if any(r[3] for r in rows) else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--markdown", action="store_true")
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
