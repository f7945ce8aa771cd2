"""Where the store bench's gateway spends its time: py-spy raw stacks (bench/spy.py) grouped into a few components.

The gateway and its SQLite writer thread share one CPU, so py-spy also samples threads that are runnable but
waiting (for the CPU, a lock, the writer's queue): stacks that end in such a wait are counted apart and left out
of the percentages. Each remaining stack goes to the first component whose marker it contains.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

__all__ = ["COMPONENTS", "components"]

WAITS = (
    "Condition.wait (threading.py",
    "EpollSelector.select (selectors.py",
    "_worker (concurrent/futures/thread.py",
    "Queue.get (queue.py",
)
"""Leaf frames of a thread that waits rather than works."""

COMPONENTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "hand-offs loop <-> threads (queue, call_soon_threadsafe, executor)",
        (
            "call_soon_threadsafe",
            "_write_to_self",
            "_read_from_self",
            "run_in_executor",
            "Condition.notify",
            "ThreadPoolExecutor.submit",
            "Queue.put",
            "_settle (",
        ),
    ),
    (
        "SQLite writer: records to JSON (to_json/asdict, _dump)",
        ("_write_loop+asdict", "_write_loop+to_json", "_write_loop+_dump (", "_write_loop+deepcopy"),
    ),
    ("SQLite writer: SQL statements, commit", ("_write_loop",)),
    ("SQLite readers (thread pool)", ("_run_read",)),
    ("responses to JSON on the loop (to_json/asdict)", ("to_json", "asdict")),
    ("request validation (pydantic)", ("model_validate", "parse_body (agl_lite/core/api.py")),
    ("memory backend copies", ("agl_lite/store/memory.py",)),
    (
        "capture, tokens, sink",
        ("agl_lite/capture/", "addons/capture.py", "addons/tokens.py", "addons/sink.py"),
    ),
    ("socket writes (send syscalls)", ("leaf:_SelectorSocketTransport.write",)),
    (
        "upstream client (aiohttp ClientSession)",
        ("Upstream.open", "ClientSession._request", "client_proto.py"),
    ),
    ("other agl-lite (routing, auth, store API, addon dispatch)", ("leaf:agl_lite/",)),
    ("aiohttp server, asyncio loop, the rest", ("",)),
)


def _matches(marker: str, stack: str, leaf: str) -> bool:
    if marker.startswith("leaf:"):
        return marker[5:] in leaf
    return all(part in stack for part in marker.split("+"))


def components(raw: Path) -> list[str]:
    """Lines: samples, waits left out, and the share of each component in the working samples."""
    by: Counter[str] = Counter()
    total = waits = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        leaf = stack.rsplit(";", 1)[-1]
        if leaf.startswith(WAITS):
            waits += n
            continue
        for name, markers in COMPONENTS:
            if any(_matches(m, stack, leaf) for m in markers):
                by[name] += n
                break
    working = total - waits
    if not working:
        return ["  (no samples)"]
    out = [f"  {total} samples, {waits} of threads waiting (left out); {working} working:"]
    out += [f"    {by[name] * 100 / working:5.1f}%  {name}" for name, _ in COMPONENTS if by[name]]
    return out
