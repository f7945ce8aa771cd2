"""The Python load of the store bench: one process, N concurrent workers (aiohttp), started by bench/store.py.

Scenarios:
  transitions  claim (limit 1) → start an attempt → the attempt succeeded → finish: 4 state transitions a cycle.
  rollouts     a simulated runner: claim → start an attempt → CALLS chat completions through the gateway with
               the attempt's agent env (OPENAI_BASE_URL, OPENAI_API_KEY), a conversation growing each turn →
               a reward on AGL_EVENT_URL with the agent key → the attempt succeeded → finish.
A feeder keeps enough rollouts queued (one enqueue of 8 x N rollouts whenever fewer than 2 x N are left). After
`--warmup` s it counts what completes in the next `--seconds` s, with the CPU time this process and the given
server and upstream spent meanwhile, and prints one JSON object.
Run alone: `python store_load.py transitions --url http://127.0.0.1:8100 --key $AGL_KEY`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from loadgen import cpu_seconds

__all__ = ["SCENARIOS", "main"]

SCENARIOS = ("transitions", "rollouts")
STOP_GRACE_S = 10.0


class Failed(Exception):
    """A request got a non-2xx answer; the worker drops this cycle and starts the next."""


@dataclass
class Run:
    args: argparse.Namespace
    session: aiohttp.ClientSession
    t_start: float = 0.0
    t_end: float = 0.0
    stopping: bool = False
    units: list[tuple[float, float]] = field(default_factory=list)
    """(end time, latency s) of each counted unit: a transition, or a whole simulated rollout."""
    llm: list[tuple[float, float]] = field(default_factory=list)
    requests: list[float] = field(default_factory=list)
    """End time of every request (enqueues included)."""
    errors: Counter[str] = field(default_factory=Counter)
    empty_claims: int = 0
    queued: int = 0
    need: asyncio.Event = field(default_factory=asyncio.Event)
    fed: asyncio.Event = field(default_factory=asyncio.Event)
    enqueued: int = 0

    @property
    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.args.key}", "Content-Type": "application/json"}

    async def call(self, op: str, method: str, url: str, body: Any, headers: dict[str, str]) -> Any:
        async with self.session.request(method, url, data=orjson.dumps(body), headers=headers) as resp:
            payload = await resp.read()
        self.requests.append(time.perf_counter())
        if not 200 <= resp.status < 300:
            self.errors[f"{op} {resp.status}"] += 1
            if sum(self.errors.values()) <= 3:
                print(f"{op}: {resp.status} {payload[:200]!r}", file=sys.stderr)
            raise Failed
        return orjson.loads(payload)

    async def admin_call(self, op: str, method: str, path: str, body: Any) -> Any:
        return await self.call(op, method, self.args.url + path, body, self.admin)


# --- the feeder ---------------------------------------------------------------------------------------------------


async def feed(run: Run) -> None:
    low, batch = 2 * run.args.concurrency, 8 * run.args.concurrency
    config = {"trust_agent_rewards": True, "max_attempts": 1}
    while not run.stopping:
        if run.queued < low:
            specs = [
                {"input": {"task": f"bench task {run.enqueued + i}", "n": run.enqueued + i}, "config": config}
                for i in range(batch)
            ]
            try:
                await run.admin_call("enqueue", "POST", "/api/rollouts", {"rollouts": specs})
            except Failed:
                await asyncio.sleep(0.1)
                continue
            run.enqueued += batch
            run.queued += batch
            run.fed.set()
            run.fed = asyncio.Event()
        else:
            run.need.clear()
            await run.need.wait()


async def claim(run: Run, runner: str) -> dict[str, Any] | None:
    fed = run.fed
    got = await run.admin_call("claim", "POST", "/api/runner/claim", {"runner_id": runner, "limit": 1})
    if not got["rollouts"]:
        run.empty_claims += 1
        run.need.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(fed.wait(), 1.0)
        return None
    run.queued -= 1
    if run.queued < 2 * run.args.concurrency:
        run.need.set()
    rollout: dict[str, Any] = got["rollouts"][0]
    return rollout


# --- the scenarios --------------------------------------------------------------------------------------------------


async def transitions(run: Run, runner: str) -> None:
    while not run.stopping:
        try:
            t0 = time.perf_counter()
            rollout = await claim(run, runner)
            if rollout is None:
                continue
            t1 = time.perf_counter()
            run.units.append((t1, t1 - t0))
            rid = rollout["id"]
            got = await run.admin_call("attempt", "POST", f"/api/rollouts/{rid}/attempts", {})
            t2 = time.perf_counter()
            run.units.append((t2, t2 - t1))
            aid = got["attempt"]["id"]
            body = {"status": "succeeded", "exit_code": 0}
            await run.admin_call("attempt update", "PATCH", f"/api/rollouts/{rid}/attempts/{aid}", body)
            t3 = time.perf_counter()
            run.units.append((t3, t3 - t2))
            await run.admin_call("finish", "POST", f"/api/rollouts/{rid}/finish", {"status": "succeeded"})
            t4 = time.perf_counter()
            run.units.append((t4, t4 - t3))
        except Failed:
            continue


async def rollouts(run: Run, runner: str) -> None:
    model = run.args.model
    while not run.stopping:
        try:
            t0 = time.perf_counter()
            rollout = await claim(run, runner)
            if rollout is None:
                continue
            rid = rollout["id"]
            got = await run.admin_call("attempt", "POST", f"/api/rollouts/{rid}/attempts", {})
            env, aid = got["env"], got["attempt"]["id"]
            agent = {"Authorization": f"Bearer {env['OPENAI_API_KEY']}", "Content-Type": "application/json"}
            messages: list[dict[str, str]] = [
                {"role": "system", "content": "You are an agent. Think step by step and use the tools."},
                {"role": "user", "content": f"Task: {rollout['input'].get('task', rid)}. Solve it."},
            ]
            for turn in range(run.args.calls):
                body = {"model": model, "messages": messages, "max_tokens": run.args.max_tokens}
                ts = time.perf_counter()
                answer = await run.call(
                    "llm call", "POST", env["OPENAI_BASE_URL"] + "/chat/completions", body, agent
                )
                te = time.perf_counter()
                run.llm.append((te, te - ts))
                messages.append(
                    {"role": "assistant", "content": answer["choices"][0]["message"]["content"] or ""}
                )
                messages.append(
                    {"role": "user", "content": f"Observation {turn}: the tool returned {turn * 7}."}
                )
            await run.call("reward", "POST", env["AGL_EVENT_URL"], {"kind": "reward", "value": 1.0}, agent)
            body = {"status": "succeeded", "exit_code": 0}
            await run.admin_call("attempt update", "PATCH", f"/api/rollouts/{rid}/attempts/{aid}", body)
            await run.admin_call("finish", "POST", f"/api/rollouts/{rid}/finish", {"status": "succeeded"})
            t1 = time.perf_counter()
            run.units.append((t1, t1 - t0))
        except Failed:
            continue


# --- the run --------------------------------------------------------------------------------------------------------


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        run = Run(args, session)
        scenario = transitions if args.scenario == "transitions" else rollouts
        feeder = asyncio.create_task(feed(run))
        workers = [asyncio.create_task(scenario(run, f"bench-{i}")) for i in range(args.concurrency)]
        await asyncio.sleep(args.warmup)
        cpu0 = (time.process_time(), cpu_seconds(args.server_pid), cpu_seconds(args.upstream_pid))
        run.t_start = time.perf_counter()
        await asyncio.sleep(args.seconds)
        run.t_end = time.perf_counter()
        cpu1 = (time.process_time(), cpu_seconds(args.server_pid), cpu_seconds(args.upstream_pid))
        run.stopping = True
        run.need.set()
        _, pending = await asyncio.wait([feeder, *workers], timeout=STOP_GRACE_S)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    for task in [feeder, *workers]:
        error = None if task.cancelled() else task.exception()
        if error is not None:
            raise error

    def within(rows: list[tuple[float, float]]) -> list[float]:
        return [lat * 1000 for end, lat in rows if run.t_start <= end <= run.t_end]

    return {
        "scenario": args.scenario,
        "seconds": run.t_end - run.t_start,
        "units": within(run.units),
        "llm_ms": within(run.llm),
        "requests": sum(1 for end in run.requests if run.t_start <= end <= run.t_end),
        "errors": dict(run.errors),
        "empty_claims": run.empty_claims,
        "load_cpu_s": cpu1[0] - cpu0[0],
        "server_cpu_s": cpu1[1] - cpu0[1],
        "upstream_cpu_s": cpu1[2] - cpu0[2],
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("scenario", choices=SCENARIOS)
    p.add_argument("--url", required=True, help="The gateway, e.g. http://127.0.0.1:8100")
    p.add_argument("--key", required=True, help="The admin key.")
    p.add_argument("--concurrency", type=int, default=32, help="Concurrent workers (runners).")
    p.add_argument("--seconds", type=float, default=5.0, help="The measured window.")
    p.add_argument("--warmup", type=float, default=1.0, help="Seconds of load before the window.")
    p.add_argument("--calls", type=int, default=6, help="rollouts: LLM calls per rollout.")
    p.add_argument("--max-tokens", type=int, default=16, help="rollouts: max_tokens of each call.")
    p.add_argument("--model", default="smollm2", help="rollouts: the model name routed to the upstream.")
    p.add_argument("--server-pid", type=int, help="Also report this process's CPU seconds in the window.")
    p.add_argument("--upstream-pid", type=int, help="...and this one's (the upstream).")
    return p.parse_args(argv)


def main() -> int:
    result = asyncio.run(main_async(parse_args()))
    print(orjson.dumps(result).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
