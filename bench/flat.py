"""The claim's and the completion cursor's cost on a small and on a large store, SQLite and PostgreSQL (#21: flat).

`measure_flat(dsn, tmp, calls)` fills a store of 1,000 calls and one of `calls` on each engine (rollouts of 10 calls,
all ended, written through the repository in large transactions, as bench/dashboard.py fills its store), then on
each: enqueues 400 rollouts, times 200 claims of one, finishes them, and times 200 reads of the cursor's last page.
Used by bench/replicas.py --flat.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path

import psycopg
from dashboard import call

from agl_lite.store.packed_ids import PrefixIndex
from agl_lite.store.postgres import PostgresStore
from agl_lite.store.postgres.repo import PostgresRepo
from agl_lite.store.records import Rollout, RolloutStatus
from agl_lite.store.rules import RolloutSpec, Store
from agl_lite.store.sqlite import SQLiteRepo, SQLiteStore
from agl_lite.store.sqlite.repo import connect

__all__ = ["measure_flat"]

PER_ROLLOUT = 10


def _fill(repo: SQLiteRepo, commit: object, calls: int) -> None:
    now = time.time()
    rollouts = max(1, calls // PER_ROLLOUT)
    for seq in range(1, rollouts + 1):
        rid = f"ro-{seq:08d}"
        r = Rollout(rid, {"q": seq}, status=RolloutStatus.SUCCEEDED, created_at=now)
        r.enqueue_seq, r.completion_seq, r.reward, r.ended_at = seq, seq, 1.0, now
        repo.put_rollout(r, new=True)
        context = [7] * 40 + [seq % 50_000]
        for turn in range(PER_ROLLOUT):
            repo.add_call(call(rid, turn, context, [100 + turn] * 24, "v1"))
        if seq % 500 == 0:
            repo.end_op(True)
            commit()  # type: ignore[operator]
            repo.index = PrefixIndex()
    repo.end_op(True)
    commit()  # type: ignore[operator]


def _fill_sqlite(path: Path, calls: int) -> None:
    asyncio.run(_touch(SQLiteStore.open(path)))
    conn = connect(str(path), "OFF")
    conn.execute("BEGIN")

    def commit() -> None:
        conn.execute("COMMIT")
        conn.execute("BEGIN")

    _fill(SQLiteRepo(conn, PrefixIndex()), commit, calls)
    conn.execute("COMMIT")
    conn.close()


def _fill_postgres(dsn: str, calls: int) -> None:
    asyncio.run(_touch(PostgresStore.open(dsn)))
    with psycopg.connect(dsn) as conn:
        _fill(PostgresRepo(conn, PrefixIndex()), conn.commit, calls)
        conn.execute("ANALYZE")


async def _touch(opening: object) -> None:
    store = await opening  # type: ignore[misc]
    await store.close()


async def _time(store: Store) -> tuple[float, float]:
    await store.enqueue([RolloutSpec(input=i, id=f"flat-{i}") for i in range(400)])
    claims = []
    for _ in range(200):
        t0 = time.perf_counter()
        (claimed,) = await store.claim("flat", 1)
        claims.append(time.perf_counter() - t0)
        await store.finish(claimed.id, RolloutStatus.SUCCEEDED)
    _, head = await store.completed(0, 0)
    cursor = []
    for _ in range(200):
        t0 = time.perf_counter()
        await store.completed(head - 100, 100)
        cursor.append(time.perf_counter() - t0)
    return statistics.median(claims) * 1000, statistics.median(cursor) * 1000


def measure_flat(admin_dsn: str, tmp: Path, calls: int) -> list[tuple[str, str, float, float]]:
    out = []
    for size in (1_000, calls):
        path = tmp / f"flat-{size}.db"
        print(f"flat: filling SQLite with {size:,} calls ...", flush=True)
        _fill_sqlite(path, size)
        claim, cursor = asyncio.run(_measure(SQLiteStore.open(path)))
        out.append(("sqlite", f"{size:,}", claim, cursor))
        name = f"flat_{size}"
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}".encode())
        dsn = admin_dsn.rsplit("/", 1)[0] + "/" + name
        print(f"flat: filling PostgreSQL with {size:,} calls ...", flush=True)
        _fill_postgres(dsn, size)
        claim, cursor = asyncio.run(_measure(PostgresStore.open(dsn)))
        out.append(("postgres", f"{size:,}", claim, cursor))
    return out


async def _measure(opening: object) -> tuple[float, float]:
    store = await opening  # type: ignore[misc]
    try:
        return await _time(store)
    finally:
        await store.close()
