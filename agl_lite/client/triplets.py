"""Triplets of many rollouts over HTTP with flat memory: `POST /api/triplets` answers NDJSON (one line per rollout,
in the order asked) up to a byte budget, and this pages through the rest, yielding rollout by rollout.

So a training step over any number of rollouts makes one request per budget-full of triplets, and holds one page.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import orjson

from agl_lite.client.errors import ClientError
from agl_lite.client.transport import Transport
from agl_lite.store.triplets import RolloutTriplets, TripletOptions

__all__ = ["DEFAULT_PAGE_BYTES", "MAX_IDS", "iter_triplets"]

DEFAULT_PAGE_BYTES = 8 * 1024 * 1024
"""The response size after which the server stops adding rollouts to a page."""
MAX_IDS = 1000
"""Most rollout ids one request names."""


async def iter_triplets(
    http: Transport, rollout_ids: Sequence[str], options: TripletOptions, max_bytes: int = DEFAULT_PAGE_BYTES
) -> AsyncIterator[RolloutTriplets]:
    """Each rollout's triplets in the order of `rollout_ids`; a page is fetched only when the last is used up."""
    done = 0
    while done < len(rollout_ids):
        body = {
            "rollout_ids": list(rollout_ids[done : done + MAX_IDS]),
            **options.to_json(),
            "max_bytes": max_bytes,
        }
        page: bytes = await http.request("POST", "/api/triplets", body=body, idempotent=True, as_bytes=True)
        count = 0
        start = 0
        while (end := page.find(b"\n", start)) >= 0:
            if end > start:
                yield RolloutTriplets.from_json(orjson.loads(page[start:end]))
                count += 1
            start = end + 1
        if count == 0:
            raise ClientError("POST /api/triplets: the server answered a page without any rollout")
        done += count
