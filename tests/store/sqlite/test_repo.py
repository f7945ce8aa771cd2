"""What the SQLite store's row format promises: prefix-shared token ids, call events in the rollout's sequence."""

from __future__ import annotations

import random
from array import array
from pathlib import Path

from agl_lite.store.rules import EventSpec, RolloutSpec
from agl_lite.store.sqlite import SQLiteStore
from tests.store.sqlite.conftest import TurnCall


async def test_thirty_turn_agent_stores_only_new_tokens(tmp_path: Path, turn_call: TurnCall) -> None:
    rng = random.Random(0)
    store = await SQLiteStore.open(tmp_path / "s.db")
    try:
        await store.enqueue([RolloutSpec(input=1, id="r")])
        context = [rng.randrange(50_000) for _ in range(300)]  # system prompt + task
        new_tokens = len(context)
        calls = []
        for turn in range(30):
            completion = [rng.randrange(50_000) for _ in range(rng.randrange(20, 80))]
            calls.append(turn_call(turn, list(context), completion))
            observation = [rng.randrange(50_000) for _ in range(rng.randrange(10, 60))]
            context += completion + observation  # the next prompt extends prompt + completion exactly
            new_tokens += len(completion) + len(observation)
        for c in calls:
            await store.add_call(c)
        stored = store.token_bytes()
        naive = 4 * sum(len(c.prompt_token_ids or []) + len(c.choices[0].token_ids) for c in calls)
        assert stored <= 4 * new_tokens  # O(new tokens) ...
        assert stored * 8 < naive  # ... not O(turns x context)
        assert await store.calls("r") == calls  # and every call's full ids read back exactly
    finally:
        await store.close()


async def test_parallel_side_call_shares_the_common_prefix(tmp_path: Path, turn_call: TurnCall) -> None:
    store = await SQLiteStore.open(tmp_path / "s.db")
    try:
        await store.enqueue([RolloutSpec(input=1, id="r")])
        main = list(range(1000, 1400))
        await store.add_call(turn_call(1, main, [1, 2, 3]))
        before = store.token_bytes()
        side = [*main[:350], 7, 7, 7]  # a summariser call that forks the conversation
        await store.add_call(turn_call(2, side, [9]))
        assert store.token_bytes() - before <= 4 * (3 + 1)
        assert (await store.calls("r"))[1].prompt_token_ids == array("I", side)
    finally:
        await store.close()


async def test_the_sequence_goes_on_after_a_call_event_when_the_store_reopens(
    tmp_path: Path, turn_call: TurnCall
) -> None:
    """The writer remembers each rollout's last seq; a reopened store reads it from both tables."""
    db = tmp_path / "s.db"
    store = await SQLiteStore.open(db)
    try:
        await store.enqueue([RolloutSpec(input=1, id="r")])
        await store.add_events("r", [EventSpec("note")])
        await store.add_call(turn_call(1, [1], [2]))
    finally:
        await store.close()
    store = await SQLiteStore.open(db)
    try:
        (note,) = await store.add_events("r", [EventSpec("note")])
        assert note.seq == 3
    finally:
        await store.close()
