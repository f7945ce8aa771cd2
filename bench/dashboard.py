"""The dashboard's first-render time on a large store (#20: under 200 ms of server time with 1M calls).

Fills a SQLite store straight through its repository (big transactions, the way the gateway writes them, without
the gateway): `--rollouts` rollouts of `--calls-per-rollout` short calls each, and `--long` rollouts of a 30-turn
agent whose prompts extend each other. It then starts the gateway (store, auth, store_api, dashboard) over that
store and times, on loopback with the admin key, the first page of the rollouts list, a filtered list, and a 30-turn
rollout's page with its trajectory. Each is asked `--repeat` times, and the medians and maxima are printed. The
gateway's own `agl_request_duration_seconds` gives the server time (its mean over the requests); the client's wall
time on loopback is printed beside it.

    .venv/bin/python bench/dashboard.py                       # 100,000 rollouts x 10 calls + 10 x 30 turns
    .venv/bin/python bench/dashboard.py --store /tmp/big.db   # keep the store, reuse it next time
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sqlite3
import statistics
import tempfile
import time
import urllib.request
from array import array
from pathlib import Path

from agl_lite.service import running_gateway
from agl_lite.store.packed_ids import PrefixIndex
from agl_lite.store.records import CallOutcome, ChoiceRecord, LLMCall, Rollout, RolloutStatus
from agl_lite.store.sqlite import SQLiteStore
from agl_lite.store.sqlite.repo import SQLiteRepo, connect
from agl_lite.testing.gateway import write_config

LONG_TURNS = 30
RARE = 1000
"""One rollout in RARE has the reward the rare filter asks for."""
VERSIONS = 10
CHAIN = ("store", "auth", "store_api", "metrics", "dashboard")


def call(rollout_id: str, turn: int, prompt: list[int], completion: list[int], version: str) -> LLMCall:
    return LLMCall(
        id=f"chatcmpl-{secrets.token_hex(8)}",
        order_key=turn,
        outcome=CallOutcome.OK,
        api="chat",
        rollout_id=rollout_id,
        attempt_id="a1",
        model="policy",
        model_version=version,
        request={
            "model": "policy",
            "messages": [{"role": "user", "content": f"turn {turn} of {rollout_id}"}],
        },
        prompt_token_ids=array("I", prompt),
        choices=[
            ChoiceRecord(
                index=0,
                text="an answer " * 8,
                finish_reason="stop",
                token_ids=array("I", completion),
                logprobs=array("f", [-0.1] * len(completion)),
            )
        ],
        usage={"prompt_tokens": len(prompt), "completion_tokens": len(completion)},
        t_start=1.0,
        t_end=1.05,
    )


def fill(path: Path, rollouts: int, per_rollout: int, long: int) -> list[str]:
    """The store, written in transactions of 5,000 calls; the ids of the long rollouts."""
    asyncio.run(_create(path))
    conn = connect(str(path), "OFF")
    repo = SQLiteRepo(conn, PrefixIndex())
    now = time.time()
    long_ids = [f"ro-long-{k}" for k in range(long)]
    ids = [f"ro-{k:07d}" for k in range(rollouts)] + long_ids
    started = time.monotonic()
    conn.execute("BEGIN")
    for seq, rid in enumerate(ids, 1):
        status = RolloutStatus.FAILED if seq % 7 == 0 else RolloutStatus.SUCCEEDED
        # One rollout a second up to now; a reward of 0.5 for one in RARE (the rare filter's matches).
        created = now - (len(ids) - seq)
        r = Rollout(rid, {"question": f"q{seq}"}, status=status, group_id=f"g{seq // 8}", created_at=created)
        r.enqueue_seq, r.completion_seq, r.reward, r.ended_at = (
            seq,
            seq,
            0.5 if seq % RARE == 0 else float(status is RolloutStatus.SUCCEEDED),
            created,
        )
        repo.put_rollout(r, new=True)
    written = 0
    for n, rid in enumerate(ids):
        turns = LONG_TURNS if rid in long_ids else per_rollout
        version = f"v{n * VERSIONS // len(ids)}"  # the iterations of a training run, in enqueue order
        context = [7] * 40 + [n % 50_000]
        for turn in range(turns):
            completion = [100 + (turn * 7 + i) % 30_000 for i in range(24)]
            repo.add_call(call(rid, turn, context, completion, version))
            if turns == LONG_TURNS:
                context = (
                    context + completion + [9] * 12
                )  # the tool's answer: the next prompt extends this one
            written += 1
            if written % 5000 == 0:
                repo.end_op(True)
                conn.execute("COMMIT")
                repo.index = PrefixIndex()  # (a fresh index per transaction: the filler's memory stays flat)
                conn.execute("BEGIN")
        if n % 20_000 == 0:
            print(f"  {written:,} calls, {time.monotonic() - started:.0f} s", flush=True)
    repo.end_op(True)
    conn.execute("COMMIT")
    conn.close()
    return long_ids


async def _create(path: Path) -> None:
    store = await SQLiteStore.open(path)
    await store.close()


def count_calls(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM calls").fetchone()[0])


async def measure(path: Path, long_id: str, repeat: int) -> list[tuple[str, float, float, float, int]]:
    key = os.environ.setdefault("AGL_KEY", secrets.token_hex(32))
    work = Path(tempfile.mkdtemp(prefix="agl-dash-bench-"))
    config = write_config(work, {}, chain=CHAIN, addons={"store": {"path": str(path)}})
    hour_ago = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 3600))
    pages = {
        "rollouts list, first page": "/dashboard/rollouts",
        "rollouts list, failed only": "/dashboard/rollouts?status=failed",
        "rollouts list, rewarded (most)": "/dashboard/rollouts?reward_min=1",
        f"rollouts list, rare reward (1 in {RARE:,})": "/dashboard/rollouts?reward_min=0.4&reward_max=0.6",
        "rollouts list, a reward none has": "/dashboard/rollouts?reward_min=5",
        f"rollouts list, one model version of {VERSIONS}": f"/dashboard/rollouts?model_version=v{VERSIONS // 2}",
        "rollouts list, created in the last hour": f"/dashboard/rollouts?since={hour_ago}",
        f"a {LONG_TURNS}-turn rollout's page": f"/dashboard/rollouts/{long_id}",
    }
    headers = {"Authorization": f"Bearer {key}"}
    out = []
    async with running_gateway(config) as gw:

        def get(path_: str) -> bytes:
            req = urllib.request.Request(f"http://127.0.0.1:{gw.port}{path_}", headers=headers)
            with urllib.request.urlopen(req, timeout=60) as resp:
                return bytes(resp.read())

        for label, path_ in pages.items():
            route = "dashboard.rollout" if "/rollouts/" in path_ else "dashboard.rollouts"
            before = _server_seconds(await asyncio.to_thread(get, "/metrics"), route)
            walls, size = [], 0
            for _ in range(repeat):
                t0 = time.perf_counter()
                size = len(await asyncio.to_thread(get, path_))
                walls.append(time.perf_counter() - t0)
            after = _server_seconds(await asyncio.to_thread(get, "/metrics"), route)
            server_ms = (after[0] - before[0]) / max(after[1] - before[1], 1) * 1000
            out.append((label, server_ms, statistics.median(walls) * 1000, max(walls) * 1000, size))
    return out


def _server_seconds(metrics: bytes, route: str) -> tuple[float, float]:
    """The gateway's own sum and count of `agl_request_duration_seconds` for `route`."""
    total = count = 0.0
    for line in metrics.decode().splitlines():
        if f'route="{route}"' not in line:
            continue
        if line.startswith("agl_request_duration_seconds_sum"):
            total = float(line.rsplit(" ", 1)[1])
        elif line.startswith("agl_request_duration_seconds_count"):
            count = float(line.rsplit(" ", 1)[1])
    return total, count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=100_000)
    parser.add_argument("--calls-per-rollout", type=int, default=10)
    parser.add_argument("--long", type=int, default=10, help=f"rollouts of {LONG_TURNS} turns")
    parser.add_argument("--store", type=Path, help="the store file (kept; filled only when missing)")
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    path = args.store or Path(tempfile.mkdtemp(prefix="agl-dash-store-")) / "big.db"
    long_ids = [f"ro-long-{k}" for k in range(args.long)]
    if not path.exists():
        print(f"filling {path} ...", flush=True)
        t0 = time.monotonic()
        long_ids = fill(path, args.rollouts, args.calls_per_rollout, args.long)
        print(f"filled in {time.monotonic() - t0:.0f} s", flush=True)
    calls = count_calls(path)
    rows = asyncio.run(measure(path, long_ids[0], args.repeat))
    print(f"\ndashboard first render, {calls:,} calls in the store ({path.stat().st_size / 1e9:.2f} GB), "
          f"{args.repeat} requests each (budget: 200 ms of server time):")  # fmt: skip
    for label, server, median, worst, size in rows:
        verdict = "PASS" if server <= 200 else "MISS"
        print(f"  {label:32s}  server {server:6.1f} ms mean  {verdict}   wall median {median:6.1f} ms, "
              f"max {worst:6.1f} ms   {size / 1024:6.1f} KiB")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
