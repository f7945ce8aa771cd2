"""Limits (issue #9, point 5): what happens when a bounded queue is full, through a real gateway. The in-flight cap
and the pause's hold bound are tested with the control addon (tests/addons/test_control.py), the body size and
the header and body timeouts with hostile input (tests/reliability/test_hostile_input.py); docs/reliability.md
lists every bound.
"""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

import aiohttp

from tests.conftest import ADMIN_KEY, GatewayFactory, gateway_url

AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}


async def test_a_full_store_write_queue_answers_503_with_retry_after_and_keeps_no_refused_write(
    gateway_factory: GatewayFactory,
) -> None:
    async with (
        gateway_factory(
            {},
            chain=("store", "auth", "store_api"),
            addons={"store": {"backend": "sqlite", "path": "limits.db", "queue_size": 1}},
        ) as gw,
        aiohttp.ClientSession(gateway_url(gw), headers=AUTH) as http,
    ):
        async with http.post("/api/rollouts", json={"rollouts": [{"rollout_id": "r1", "input": {}}]}) as r:
            assert r.status == 201

        async def post(n: int) -> tuple[int, Any, str | None]:
            body = {"events": [{"kind": "note", "data": {"n": n}}]}
            async with http.post("/api/rollouts/r1/events", json=body) as r:
                return r.status, await r.json(), r.headers.get("Retry-After")

        # Another connection holds the database's write lock: the store's writer waits on it (its busy timeout is
        # 10 s), so the first write stays in the queue of one and every other one finds it full.
        blocker = sqlite3.connect(gw.config.base_dir / "limits.db", isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            writes = [asyncio.create_task(post(n)) for n in range(6)]
            done: set[asyncio.Task[tuple[int, Any, str | None]]] = set()
            async with asyncio.timeout(8):  # all but one are answered at once; the last waits for the lock
                while len(done) < 5:
                    finished, _ = await asyncio.wait(set(writes) - done, return_when=asyncio.FIRST_COMPLETED)
                    done |= finished
            refused = [t.result() for t in done]
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        (accepted,) = [t for t in writes if t not in done]
        status, got, _ = await asyncio.wait_for(accepted, 15)
        assert status == 201
        for status, body, retry_after in refused:
            assert (status, body["error"]["type"], retry_after) == (503, "service_unavailable", "1")
        async with http.get("/api/rollouts/r1/events") as r:
            events = (await r.json())["events"]
        assert [e["data"] for e in events] == [e["data"] for e in got["events"]]
