"""One gateway process's share of the replicas test (run as a script by test_replicas.py): `loops` runner loops on
one `PostgresStore`, each claiming up to 16 rollouts at a time and finishing each, until none is queued. Prints the
ids each claim returned, one JSON line per claim."""

from __future__ import annotations

import asyncio
import sys

import orjson

from agl_lite.store.postgres import PostgresStore
from agl_lite.store.records import RolloutStatus
from agl_lite.store.rules import RolloutFilter


async def main(dsn: str, name: str, loops: int) -> None:
    store = await PostgresStore.open(dsn)

    async def loop(k: int) -> None:
        runner = f"{name}-{k}"
        while True:
            claimed = await store.claim(runner, 16)
            if claimed:
                sys.stdout.write(orjson.dumps([runner, [r.id for r in claimed]]).decode() + "\n")
            elif not await store.list_rollouts(RolloutFilter(status=RolloutStatus.QUEUING, limit=1)):
                return
            for rollout in claimed:
                await store.finish(rollout.id, RolloutStatus.SUCCEEDED)

    try:
        await asyncio.gather(*(loop(k) for k in range(loops)))
    finally:
        sys.stderr.write(f"{name}: {store.commits} commits, {store.conflicts} conflicts retried\n")
        await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
