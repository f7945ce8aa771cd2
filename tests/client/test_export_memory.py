"""`export` streams: exporting 10x the records peaks within 1.5x the memory, and the file round-trips exactly.

Scaled down from 100k vs 10k records to 5k vs 500 (each ~4k token ids: an agent's 10-turn trajectory of ~3.4k
prompt + 10 x 60 new tokens), so that populating the store and exporting take seconds on a 2-core box. Holding
the big export in memory would take > 80 MB as packed arrays (> 700 MB as Python ints), so a leak shows.

The peak is the export process's own VmHWM (/proc): a forked child's ru_maxrss would include pytest's RSS at the
fork, which would hide the export's.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from array import array
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from agl_lite.core.server import Gateway
from agl_lite.store.records import CallOutcome, ChoiceRecord, LLMCall, RolloutStatus
from agl_lite.store.rules import RolloutSpec, Store
from tests.client.conftest import store_of
from tests.conftest import ADMIN_KEY, gateway_url

TURNS = 10
PROMPT = 3400
COMPLETION = 50
OBSERVATION = 10
# rollouts: 500 and 5,000 records in CI; AGL_EXPORT_MEMORY_ROLLOUTS=1000,10000 runs the full 10k vs 100k
SMALL, BIG = (int(n) for n in os.environ.get("AGL_EXPORT_MEMORY_ROLLOUTS", "50,500").split(","))
POOL = array("I", ((i * 2654435761) % 50021 for i in range(PROMPT + 4 * TURNS * (COMPLETION + OBSERVATION))))

pytestmark = pytest.mark.slow


def trajectory(i: int) -> Iterator[tuple[array[int], array[int]]]:
    """(prompt, completion) of each turn of rollout i: every prompt extends the previous prompt + completion."""
    start = i % 997
    prompt = array("I", POOL[start : start + PROMPT])
    for turn in range(TURNS):
        at = start + PROMPT + turn * (COMPLETION + OBSERVATION)
        completion = array("I", POOL[at : at + COMPLETION])
        yield array("I", prompt), completion
        prompt.extend(completion)
        prompt.extend(POOL[at + COMPLETION : at + COMPLETION + OBSERVATION])


def rid(mode: str, i: int) -> str:
    return f"{mode}-{i:05d}"


async def populate(store: Store, mode: str, count: int) -> None:
    specs = [RolloutSpec({"task": i}, mode=mode, id=rid(mode, i)) for i in range(count)]
    for k in range(0, count, 1000):
        await store.enqueue(specs[k : k + 1000])
        await store.claim("test", 1000)

    async def one(i: int) -> None:
        for turn, (prompt, completion) in enumerate(trajectory(i)):
            logprobs = array("f", [-0.125] * len(completion))
            await store.add_call(
                LLMCall(
                    id=f"{rid(mode, i)}-{turn}",
                    order_key=turn,
                    outcome=CallOutcome.OK,
                    api="chat",
                    rollout_id=rid(mode, i),
                    attempt_id="a",
                    model_version="v1",
                    request={"messages": [{"role": "user", "content": f"turn {turn}"}]},
                    prompt_token_ids=prompt,
                    choices=[ChoiceRecord(index=0, text="t", token_ids=completion, logprobs=logprobs)],
                )
            )
        await store.finish(rid(mode, i), RolloutStatus.SUCCEEDED)

    await asyncio.gather(*(one(i) for i in range(count)))


REPORT_PEAK = """
import atexit, runpy, sys
report = sys.argv.pop(1)
def peak():
    hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    open(report, "w").write(hwm.split()[1])
atexit.register(peak)
sys.argv[0] = "agl-client"
runpy.run_module("agl_lite.client", run_name="__main__")
"""


def export_peak_kib(url: str, mode: str, out: Path) -> int:
    """Run `agl-client export` in a process of its own; its peak RSS in KiB."""
    report = out.with_suffix(".peak")
    cmd = [sys.executable, "-c", REPORT_PEAK, str(report), "--url", url, "--no-progress", "export"]
    result = subprocess.run(
        [*cmd, "--mode", mode, str(out)],
        env={**os.environ, "AGL_KEY": ADMIN_KEY},
        capture_output=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode()
    return int(report.read_text())


def check_round_trip(path: Path, mode: str, count: int) -> None:
    """Line by line (the test's memory stays flat too): every record, in order, with its exact ids."""
    with path.open("rb") as f:
        for i in range(count):
            for turn, (prompt, completion) in enumerate(trajectory(i)):
                row = orjson.loads(f.readline())
                assert (row["rollout_id"], row["seq"]) == (rid(mode, i), turn)
                assert row["prompt_ids"] == prompt.tolist()
                assert row["response_ids"] == completion.tolist()
                assert row["logprobs"] == [-0.125] * COMPLETION
        assert f.readline() == b""


async def test_export_of_ten_times_the_records_peaks_within_1_5x(gateway: Gateway, tmp_path: Path) -> None:
    store = store_of(gateway)
    await populate(store, "small", SMALL)
    await populate(store, "big", BIG)
    url = gateway_url(gateway)
    small = await asyncio.to_thread(export_peak_kib, url, "small", tmp_path / "small.jsonl")
    big = await asyncio.to_thread(export_peak_kib, url, "big", tmp_path / "big.jsonl")
    print(
        f"export peak RSS: {SMALL * TURNS} records {small} KiB, {BIG * TURNS} records {big} KiB ({big / small:.2f}x)"
    )
    assert big <= 1.5 * small
    check_round_trip(tmp_path / "small.jsonl", "small", SMALL)
    await asyncio.to_thread(check_round_trip, tmp_path / "big.jsonl", "big", BIG)
