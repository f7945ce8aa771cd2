"""Export captured LLM calls as training rows, streaming: rollouts by keyset pages, each rollout's calls by
`order_key` pages, each row written before the next page is read — memory stays flat however big the export.

One row per call and choice (n > 1 gives n rows): rollout, attempt, group, call order, prompt ids, response
ids, logprobs, the rollout's reward, the model version and the request's messages.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from agl_lite.client.client import AglLiteClient
from agl_lite.client.writers import RowWriter
from agl_lite.store.records import CallOutcome, LLMCall, Rollout, RolloutStatus

__all__ = ["ExportStats", "call_rows", "export_calls"]


_AHEAD = 2
"""Pages of calls fetched ahead of the one being written."""


@dataclass(frozen=True, slots=True)
class _Page:
    rollout: Rollout
    calls: list[LLMCall]
    last: bool
    """The rollout's last page of calls."""


@dataclass(slots=True)
class ExportStats:
    rollouts: int = 0
    calls: int = 0
    rows: int = 0


def call_rows(rollout: Rollout, call: LLMCall, seq: int) -> Iterator[dict[str, Any]]:
    """The rows of one call; `seq` is the call's position among its rollout's calls (from 0)."""
    request = call.request if isinstance(call.request, dict) else {}
    messages = request.get("messages")
    for choice in call.choices:
        yield {
            "rollout_id": rollout.id,
            "attempt_id": call.attempt_id,
            "group_id": rollout.group_id,
            "mode": rollout.mode,
            "call_id": call.id,
            "seq": seq,
            "order_key": call.order_key,
            "choice": choice.index,
            "outcome": call.outcome.value,
            "model": call.model,
            "model_version": call.model_version,
            "response_id": call.response_id,
            "reward": rollout.reward,
            "prompt_ids": call.prompt_token_ids,
            "response_ids": choice.token_ids,
            "logprobs": choice.logprobs,
            "finish_reason": choice.finish_reason,
            "text": choice.text,
            "messages": messages,
            "labels": call.labels,
        }


async def export_calls(
    client: AglLiteClient,
    writer: RowWriter,
    *,
    status: RolloutStatus | None = RolloutStatus.SUCCEEDED,
    mode: str | None = None,
    group_id: str | None = None,
    only_ok: bool = True,
    page_size: int = 100,
    progress: Callable[[ExportStats], None] | None = None,
) -> ExportStats:
    """Write the rows of every matching rollout's calls (only calls whose whole response reached the client,
    unless `only_ok` is False). The caller closes the writer.

    The next pages are fetched while this one is written (at most `_AHEAD` pages ahead), so the gateway's work
    and the writing overlap while memory stays bounded.
    """
    pages: asyncio.Queue[_Page | BaseException | None] = asyncio.Queue(maxsize=_AHEAD)

    async def fetch() -> None:
        try:
            async for rollout in client.iter_rollouts(
                status=status, mode=mode, group_id=group_id, page_size=page_size
            ):
                after = -1
                while True:
                    # The gateway also ends a page at its byte cap: only its `more` says whether calls are left.
                    calls, more = await client._calls_page(rollout.id, None, after, page_size)
                    last = not more or not calls
                    await pages.put(_Page(rollout, calls, last))
                    if last:
                        break
                    after = calls[-1].order_key
        except Exception as exc:  # handed to the writing side, which raises it
            await pages.put(exc)
        else:
            await pages.put(None)

    stats = ExportStats()
    fetcher = asyncio.ensure_future(fetch())
    try:
        seq = 0
        while (page := await pages.get()) is not None:
            if isinstance(page, BaseException):
                raise page
            for call in page.calls:
                stats.calls += 1
                if not only_ok or call.outcome is CallOutcome.OK:
                    for row in call_rows(page.rollout, call, seq):
                        writer.write(row)
                        stats.rows += 1
                seq += 1
            if page.last:
                seq = 0
                stats.rollouts += 1
                if progress is not None:
                    progress(stats)
    finally:
        if not fetcher.done():
            fetcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await fetcher
    return stats
