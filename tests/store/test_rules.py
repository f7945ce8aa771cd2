"""The store's rules, once, against every backend (tests/store/conftest.py parametrises `store`)."""

from __future__ import annotations

import asyncio
from array import array
from types import SimpleNamespace
from typing import Any

import pytest

from agl_lite.errors import BadRequest, Conflict, Forbidden, NotFound, PayloadTooLarge, QuotaExceeded
from agl_lite.store import rules
from agl_lite.store.memory import MemoryRepo, MemoryStore
from agl_lite.store.records import (
    AttemptStatus,
    CallOutcome,
    ChoiceRecord,
    LLMCall,
    RolloutConfig,
    RolloutStatus,
)
from agl_lite.store.rules import EventSpec, RolloutFilter, RolloutSpec, Store
from agl_lite.store.sqlite import SQLiteRepo


class HeldRead:
    """The store's next read held once it has read (its snapshot taken) until `release` is set; the reads after it
    run as usual."""

    def __init__(self, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
        self.read, self.release = asyncio.Event(), asyncio.Event()
        read = store._read

        async def held(fn: Any) -> Any:
            monkeypatch.setattr(store, "_read", read)
            value = await read(fn)
            self.read.set()
            await self.release.wait()
            return value

        monkeypatch.setattr(store, "_read", held)


async def running_rollout(store: Store, rid: str = "r1", **config: object) -> None:
    await store.enqueue([RolloutSpec(input={"q": 1}, id=rid, config=RolloutConfig(**config))])  # type: ignore[arg-type]
    claimed = await store.claim("runner-a", 100)
    assert rid in {r.id for r in claimed}


async def test_enqueue_creates_queuing_rollouts_in_order(store: Store) -> None:
    created = await store.enqueue([RolloutSpec(input=i) for i in range(3)])
    assert [r.status for r in created] == [RolloutStatus.QUEUING] * 3
    assert [r.enqueue_seq for r in created] == [1, 2, 3]
    assert (await store.get_rollout(created[1].id)).input == 1


async def test_enqueue_with_an_existing_id_is_idempotent(store: Store) -> None:
    (first,) = await store.enqueue([RolloutSpec(input="a", id="same")])
    (again,) = await store.enqueue([RolloutSpec(input="b", id="same")])
    assert again.input == "a"
    assert again.enqueue_seq == first.enqueue_seq
    assert len(await store.list_rollouts()) == 1


# "completed": a rollout so named would hide behind `/api/rollouts/completed` (issue #15)
@pytest.mark.parametrize("bad_id", ["has space", "dot.ted", "", "x" * 129, "completed"])
async def test_enqueue_rejects_unsafe_ids_and_changes_nothing(store: Store, bad_id: str) -> None:
    with pytest.raises(BadRequest):
        await store.enqueue([RolloutSpec(input=1, id="ok"), RolloutSpec(input=2, id=bad_id)])
    assert await store.list_rollouts() == []


async def test_claim_is_fifo_and_moves_to_running(store: Store) -> None:
    await store.enqueue([RolloutSpec(input=i, id=f"r{i}") for i in range(5)])
    first = await store.claim("runner-a", 2)
    assert [r.id for r in first] == ["r0", "r1"]
    assert all(r.status is RolloutStatus.RUNNING and r.runner_id == "runner-a" for r in first)
    assert [r.id for r in await store.claim("runner-b", 10)] == ["r2", "r3", "r4"]
    assert await store.claim("runner-b", 10) == []


async def test_list_filters_and_paginates_by_keyset(store: Store) -> None:
    await store.enqueue(
        [
            RolloutSpec(input=i, id=f"r{i}", mode="val" if i % 2 else "train", group_id=f"g{i // 2}")
            for i in range(6)
        ]
    )
    page1 = await store.list_rollouts(RolloutFilter(limit=4))
    page2 = await store.list_rollouts(RolloutFilter(after=page1[-1].enqueue_seq, limit=4))
    assert [r.id for r in page1 + page2] == [f"r{i}" for i in range(6)]
    assert [r.id for r in await store.list_rollouts(RolloutFilter(mode="val"))] == ["r1", "r3", "r5"]
    assert [r.id for r in await store.list_rollouts(RolloutFilter(group_id="g1"))] == ["r2", "r3"]


async def test_list_filters_by_reward_time_and_model_version_in_pages(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(rules, "time", SimpleNamespace(time=lambda: clock[0]))
    for i in range(8):  # r0 at t=1000, r1 at 1010, ... in enqueue order
        clock[0] = 1000.0 + 10 * i
        await store.enqueue([RolloutSpec(input=i, id=f"r{i}")])
    await store.claim("runner", 8)
    for i in range(6):  # r6, r7: no reward
        await store.add_events(f"r{i}", [EventSpec("reward", {"value": i / 2})])
    for i, version in [(1, "v1"), (1, "v1"), (1, "v2"), (3, "v2"), (4, "v1"), (6, "v2")]:
        await store.add_call(call(f"r{i}", 10 * i + len(version), [1, 2], [[3]], model_version=version))

    async def ids(**filters: object) -> list[str]:
        out, after = [], 0
        while page := await store.list_rollouts(RolloutFilter(after=after, limit=2, **filters)):  # type: ignore[arg-type]
            out += [r.id for r in page]
            after = page[-1].enqueue_seq
        return out

    assert await ids(reward_min=1.0) == ["r2", "r3", "r4", "r5"]
    assert await ids(reward_max=0.5) == ["r0", "r1"]  # a rollout without a reward matches no reward range
    assert await ids(reward_min=0.5, reward_max=1.5) == ["r1", "r2", "r3"]
    assert await ids(created_after=1020.0) == ["r2", "r3", "r4", "r5", "r6", "r7"]
    assert await ids(created_after=1015.0, created_before=1040.0) == ["r2", "r3"]
    assert await ids(created_after=2000.0) == []
    assert await ids(created_before=1000.0) == []
    assert await ids(model_version="v2") == ["r1", "r3", "r6"]
    assert await ids(model_version="v1") == ["r1", "r4"]
    assert await ids(model_version="v1", reward_min=1.0, created_after=1020.0) == ["r4"]
    assert await ids(model_version="v9") == []


async def test_time_windows_hold_whole_batches_and_survive_a_clock_set_back(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch shares one creation time, and its rows are rewritten by claims and finishes (new row ids in SQLite):
    a window's bounds still take the whole batch. A clock set back cannot put a rollout before an earlier one."""
    clock = [1000.0]
    monkeypatch.setattr(rules, "time", SimpleNamespace(time=lambda: clock[0]))
    await store.enqueue([RolloutSpec(input=i, id=f"a{i}") for i in range(3)])
    clock[0] = 500.0  # set back
    await store.enqueue([RolloutSpec(input=0, id="late")])
    clock[0] = 2000.0
    await store.enqueue([RolloutSpec(input=i, id=f"b{i}") for i in range(3)])
    await store.claim("runner", 5)
    await store.finish("a0", RolloutStatus.SUCCEEDED)

    async def ids(**filters: float) -> list[str]:
        return [r.id for r in await store.list_rollouts(RolloutFilter(**filters))]  # type: ignore[arg-type]

    assert (await store.get_rollout("late")).created_at == 1000.0
    assert await ids(created_after=1500.0) == ["b0", "b1", "b2"]
    assert await ids(created_before=1500.0) == ["a0", "a1", "a2", "late"]
    assert await ids(created_after=400.0, created_before=1001.0) == ["a0", "a1", "a2", "late"]
    with pytest.raises(BadRequest, match="finite"):
        await store.list_rollouts(RolloutFilter(reward_min=float("nan")))


async def test_a_model_version_first_seen_before_its_rollout_existed_is_listed_once_it_does(
    store: Store,
) -> None:
    early = call("later", 1, [1], [[2]], model_version="v1")
    await store.add_call(early)
    await store.enqueue([RolloutSpec(input=1, id="later")])
    await store.add_call(call("later", 2, [1, 2], [[3]], model_version="v1"))
    assert [r.id for r in await store.list_rollouts(RolloutFilter(model_version="v1"))] == ["later"]


async def test_finish_and_illegal_transitions(store: Store) -> None:
    await store.enqueue([RolloutSpec(input=1, id="q")])
    with pytest.raises(Conflict, match="queuing; it cannot become succeeded"):
        await store.finish("q", RolloutStatus.SUCCEEDED)
    await store.claim("runner", 1)
    done = await store.finish("q", RolloutStatus.SUCCEEDED)
    assert done.status is RolloutStatus.SUCCEEDED
    assert done.completion_seq == 1
    with pytest.raises(Conflict):
        await store.finish("q", RolloutStatus.FAILED)
    with pytest.raises(Conflict):
        await store.cancel("q")
    assert (await store.get_rollout("q")).status is RolloutStatus.SUCCEEDED


async def test_finish_rejects_a_non_verdict_status(store: Store) -> None:
    await running_rollout(store)
    with pytest.raises(BadRequest):
        await store.finish("r1", RolloutStatus.QUEUING)


async def test_unknown_rollout_is_not_found(store: Store) -> None:
    with pytest.raises(NotFound):
        await store.get_rollout("nope")
    with pytest.raises(NotFound):
        await store.cancel("nope")
    with pytest.raises(NotFound):
        await store.add_events("nope", [EventSpec("x")])


async def test_cancel_cancels_running_attempts(store: Store) -> None:
    await running_rollout(store, max_attempts=2)
    attempt = await store.start_attempt("r1")
    cancelled = await store.cancel("r1", "user asked")
    assert cancelled.status is RolloutStatus.CANCELLED
    assert cancelled.message == "user asked"
    (after,) = await store.attempts("r1")
    assert (after.id, after.status) == (attempt.id, AttemptStatus.CANCELLED)


async def test_attempts_respect_the_cap_and_upsert_by_id(store: Store) -> None:
    await running_rollout(store, max_attempts=2, timeout_s=30)
    a1 = await store.start_attempt("r1", "pod-uid-1")
    assert (a1.seq, a1.status) == (1, AttemptStatus.RUNNING)
    assert a1.deadline is not None
    assert a1.deadline == pytest.approx(a1.started_at + 30)
    assert (await store.start_attempt("r1", "pod-uid-1")).seq == 1  # first sight again: the same attempt
    a2 = await store.start_attempt("r1")
    assert a2.seq == 2
    with pytest.raises(Conflict, match="used all 2 attempts"):
        await store.start_attempt("r1")
    assert [a.id for a in await store.attempts("r1")] == ["pod-uid-1", a2.id]


async def test_lost_attempts_do_not_use_up_the_cap(store: Store) -> None:
    """An evicted pod or a runner restart is not the agent's failure: its replacement still gets an attempt."""
    await running_rollout(store, max_attempts=1)
    first = await store.start_attempt("r1", "pod-evicted")
    await store.update_attempt("r1", first.id, AttemptStatus.LOST, message="evicted")
    second = await store.start_attempt("r1", "pod-replacement")
    assert second.seq == 2
    await store.update_attempt("r1", second.id, AttemptStatus.FAILED, exit_code=1)
    with pytest.raises(Conflict, match="used all 1 attempts"):  # a failed attempt does use one up
        await store.start_attempt("r1", "pod-third")


async def test_attempts_start_only_while_running(store: Store) -> None:
    await store.enqueue([RolloutSpec(input=1, id="q")])
    with pytest.raises(Conflict, match="only while running"):
        await store.start_attempt("q")
    await store.claim("runner", 1)
    await store.finish("q", RolloutStatus.FAILED)
    with pytest.raises(Conflict):
        await store.start_attempt("q", "late-pod")


async def test_attempt_transitions(store: Store) -> None:
    await running_rollout(store)
    a = await store.start_attempt("r1")
    done = await store.update_attempt("r1", a.id, AttemptStatus.FAILED, exit_code=3, message="boom")
    assert (done.status, done.exit_code, done.message) == (AttemptStatus.FAILED, 3, "boom")
    with pytest.raises(Conflict):
        await store.update_attempt("r1", a.id, AttemptStatus.SUCCEEDED)
    with pytest.raises(NotFound):
        await store.update_attempt("r1", "nope", AttemptStatus.SUCCEEDED)


async def test_running_lists_rollouts_with_attempts(store: Store) -> None:
    await running_rollout(store, max_attempts=3)
    a = await store.start_attempt("r1")
    ((rollout, attempts),) = await store.running()
    assert rollout.id == "r1"
    assert [x.id for x in attempts] == [a.id]


async def test_events_have_a_per_rollout_sequence_and_filters(store: Store) -> None:
    await store.enqueue([RolloutSpec(input=1, id="a"), RolloutSpec(input=2, id="b")])
    await store.add_events("a", [EventSpec("note", {"x": 1}), EventSpec("note", {"x": 2})])
    await store.add_events("b", [EventSpec("note")])
    (third,) = await store.add_events("a", [EventSpec("other")])
    assert third.seq == 3
    assert [e.seq for e in await store.events("a", kind="note")] == [1, 2]
    assert [e.seq for e in await store.events("a", after_seq=1)] == [2, 3]
    assert [e.seq for e in await store.events("b")] == [1]


async def test_reward_event_sets_the_rollout_reward_last_one_wins(store: Store) -> None:
    await store.enqueue([RolloutSpec(input=1, id="a")])
    await store.add_events("a", [EventSpec("reward", {"value": 0.5}), EventSpec("reward", 1)])
    assert (await store.get_rollout("a")).reward == 1.0


@pytest.mark.parametrize("data", [None, "high", {"value": "1"}, {"value": True}, {}])
async def test_reward_needs_a_number_and_bad_batches_change_nothing(store: Store, data: object) -> None:
    await store.enqueue([RolloutSpec(input=1, id="a")])
    with pytest.raises(BadRequest, match="numeric value"):
        await store.add_events("a", [EventSpec("note"), EventSpec("reward", data)])
    assert await store.events("a") == []


async def test_completion_cursor_orders_terminal_rollouts(store: Store) -> None:
    await store.enqueue([RolloutSpec(input=i, id=f"r{i}") for i in range(3)])
    await store.claim("runner", 3)
    await store.finish("r2", RolloutStatus.SUCCEEDED)
    await store.cancel("r0")
    rows, cursor = await store.completed(after=0)
    assert [r.id for r in rows] == ["r2", "r0"]
    assert cursor == 2
    assert await store.completed(after=cursor) == ([], 2)


async def test_completed_long_poll_wakes_on_a_completion(store: Store) -> None:
    await running_rollout(store)
    waiter = asyncio.ensure_future(store.completed(after=0, wait=30))

    async def waiting() -> None:
        while store.completion_waiters == 0:  # noqa: ASYNC110 — a counter, not an event, is what the store has
            await asyncio.sleep(0.001)

    await asyncio.wait_for(waiting(), 5)  # the long-poll is parked: only a wake-up can end it early
    await store.finish("r1", RolloutStatus.SUCCEEDED)
    rows, cursor = await asyncio.wait_for(waiter, 5)
    assert ([r.id for r in rows], cursor) == (["r1"], 1)


async def test_completed_long_poll_returns_empty_after_wait(store: Store) -> None:
    assert await store.completed(after=0, wait=0.05) == ([], 0)


async def test_resources_are_versioned(store: Store) -> None:
    assert (await store.put_resource("prompt", {"t": "v1"})).version == 1
    assert (await store.put_resource("prompt", {"t": "v2"})).version == 2
    await store.put_resource("sampling", {"temperature": 0.7})
    assert (await store.get_resource("prompt")).value == {"t": "v2"}
    assert (await store.get_resource("prompt", 1)).value == {"t": "v1"}
    assert [(r.name, r.version) for r in await store.latest_resources()] == [("prompt", 2), ("sampling", 1)]
    with pytest.raises(NotFound):
        await store.get_resource("prompt", 9)


async def test_models_register_and_update(store: Store) -> None:
    await store.put_model("qwen", ["http://127.0.0.1:8000/v1"], "step-1")
    await store.put_model("qwen", ["http://127.0.0.1:8000/v1"], "step-2")
    (model,) = await store.models()
    assert (model.name, model.version) == ("qwen", "step-2")


async def test_a_registration_keeps_its_served_name_and_can_be_taken_back(store: Store) -> None:
    removed: list[str] = []
    store.on_model_removed(lambda m: removed.append(m.name))
    await store.put_model("policy", ["http://127.0.0.1:8000/v1"], "step-3", "Qwen/Qwen3-8B")
    (model,) = await store.models()
    assert (model.version, model.served_model) == ("step-3", "Qwen/Qwen3-8B")
    assert (await store.remove_model("policy")).version == "step-3"
    assert await store.models() == []
    assert removed == ["policy"]
    with pytest.raises(NotFound):
        await store.remove_model("policy")


def call(
    rollout: str | None, order: int, prompt: list[int], completions: list[list[int]], **kw: object
) -> LLMCall:
    return LLMCall(
        id=f"c{order}",
        order_key=order,
        outcome=CallOutcome.OK,
        api="chat",
        rollout_id=rollout,
        attempt_id="a1" if rollout else None,
        prompt_token_ids=array("I", prompt),
        choices=[
            ChoiceRecord(index=i, text="t", token_ids=array("I", c), logprobs=array("f", [-0.5] * len(c)))
            for i, c in enumerate(completions)
        ],
        usage={"completion_tokens": sum(map(len, completions))},
        complete=True,
        request={"m": 1},
        **kw,  # type: ignore[arg-type]
    )


async def test_calls_round_trip_exactly_in_request_order(store: Store) -> None:
    await store.enqueue([RolloutSpec(input=1, id="r")])
    second = call("r", 20, list(range(100, 140)), [[7, 8, 9]])
    first = call("r", 10, list(range(100, 120)), [[1, 2], [3, 4, 5]])
    await store.add_call(second)
    await store.add_call(first)
    assert await store.calls("r") == [first, second]
    events = await store.events("r", kind="llm_call")
    assert [e.data["call_id"] for e in events] == ["c20", "c10"]  # events in commit order; calls by order_key


async def test_a_responses_call_is_read_back_by_its_response_id_with_its_prefix_shared_ids(
    store: Store,
) -> None:
    await store.enqueue([RolloutSpec(input=1, id="r")])
    first = call("r", 10, list(range(100, 120)), [[1, 2]])
    second = call("r", 20, [*range(100, 120), 1, 2, 7], [[8, 9]])  # its prompt extends the first: shared ids
    unattributed = call(None, 30, [5, 6], [[7]])
    chat = call("r", 40, [5], [[6]])
    for c, response_id in ((first, "resp_1"), (second, "resp_2"), (unattributed, "resp_3")):
        c.id = response_id
    for c in (first, second, unattributed, chat):
        await store.add_call(c)
    assert await store.response_call("resp_2") == second
    assert await store.response_call("resp_3") == unattributed
    with pytest.raises(NotFound, match="resp_9"):
        await store.response_call("resp_9")
    with pytest.raises(NotFound, match="c40"):
        await store.response_call("c40")  # a chat call's id is no response id: never looked up


async def test_a_deleted_response_is_deleted_once_and_its_call_stays(store: Store) -> None:
    await store.enqueue([RolloutSpec(input=1, id="r")])
    kept = call("r", 10, [1, 2], [[3]])
    kept.id = "resp_1"
    await store.add_call(kept)
    assert not await store.response_deleted("resp_1")
    assert await store.delete_response("resp_1")
    assert not await store.delete_response("resp_1")  # already: the API's second DELETE is a 404
    assert await store.response_deleted("resp_1")
    assert not await store.response_deleted("resp_2")
    assert await store.response_call("resp_1") == kept


async def test_labels_are_stored_with_their_call_and_filter_its_reads(store: Store) -> None:
    await store.enqueue([RolloutSpec(input=1, id="r")])
    await store.add_call(call("r", 1, [1], [[2]], labels={"tool": "search", "turn": "1"}))
    await store.add_call(call("r", 2, [1, 2, 3], [[4]], labels={"tool": "python"}))
    await store.add_call(call("r", 3, [1, 2, 3, 4, 5], [[6]]))
    await store.add_call(call("r", 4, [9], [[9]], labels={"note": "a:b:c"}))
    assert [c.labels for c in await store.calls("r")] == [
        {"tool": "search", "turn": "1"},
        {"tool": "python"},
        {},
        {"note": "a:b:c"},
    ]
    assert [c.id for c in await store.calls("r", label=("tool", "search"))] == ["c1"]
    assert [c.id for c in await store.calls("r", label=("tool", "python"), after_order_key=1)] == ["c2"]
    assert await store.calls("r", label=("tool", "python"), after_order_key=2) == []
    assert [c.id for c in await store.calls("r", label=("note", "a:b:c"))] == ["c4"]
    assert await store.calls("r", label=("tool", "Search")) == []  # values compare exactly
    with pytest.raises(BadRequest, match="invalid label key"):
        await store.calls("r", label=('tool"]', "x"))


@pytest.mark.parametrize(
    "labels",
    [{"k": 1}, {"bad key": "v"}, {"k": "v" * 257}, {f"k{i}": "v" for i in range(33)}, ["k"]],
)
async def test_labels_an_addon_got_wrong_are_dropped_and_the_call_kept(store: Store, labels: object) -> None:
    """A bug in an addon must not cost the call its record (nothing answered goes unrecorded)."""
    await store.enqueue([RolloutSpec(input=1, id="r")])
    await store.add_call(call("r", 1, [1], [[2]], labels=labels))
    (stored,) = await store.calls("r")
    assert stored.labels == {}
    assert stored.choices[0].token_ids == array("I", [2])


async def test_call_events_take_their_place_in_the_rollouts_sequence(store: Store) -> None:
    """A captured call's `llm_call` event (kept with the call in SQLite) and posted events share one sequence:
    every read (a kind, a cursor, a page, a byte bound) sees them merged in commit order."""
    await store.enqueue([RolloutSpec(input=1, id="r")])
    await store.add_events("r", [EventSpec("note", 1)])
    await store.add_call(call("r", 10, [1, 2], [[3]]))
    await store.add_events("r", [EventSpec("reward", 0.5)])
    await store.add_events("r", [EventSpec("llm_call", {"call_id": "posted"})])  # the admin key may post one
    await store.add_call(call("r", 5, [1, 2, 3, 4], [[5]]))
    (last,) = await store.add_events("r", [EventSpec("note", 2)])
    events = await store.events("r")
    assert [(e.seq, e.kind) for e in events] == [
        (1, "note"),
        (2, "llm_call"),
        (3, "reward"),
        (4, "llm_call"),
        (5, "llm_call"),
        (6, "note"),
    ]
    assert last.seq == 6
    assert events[1].data == {
        "call_id": "c10",
        "outcome": "ok",
        "response_id": None,
        "model": None,
        "order_key": 10,
    }
    assert (events[1].source, events[1].attempt_id, events[3].source) == ("gateway", "a1", "admin")
    calls = await store.events("r", kind="llm_call")
    assert [(e.seq, e.data["call_id"]) for e in calls] == [(2, "c10"), (4, "posted"), (5, "c5")]
    assert [e.seq for e in await store.events("r", kind="note")] == [1, 6]
    assert [e.seq for e in await store.events("r", after_seq=2, limit=2)] == [3, 4]
    assert [e.seq for e in await store.events("r", after_seq=3, limit=10, max_bytes=1)] == [4]
    assert [e.seq for e in await store.events("r", kind="llm_call", after_seq=4)] == [5]


async def test_unattributed_calls_are_kept_apart(store: Store) -> None:
    admin_call = call(None, 5, [1, 2, 3], [[4]])
    await store.add_call(admin_call)
    assert await store.calls(None) == [admin_call]


async def test_agent_gate_follows_the_rollout_through_its_life(store: Store) -> None:
    await store.enqueue([RolloutSpec(input=1, id="r", config=RolloutConfig(max_attempts=1))])
    with pytest.raises(Forbidden, match="queuing"):
        await store.agent_gate("r", "pod-1")
    await store.claim("runner", 1)
    await store.agent_gate("r", "pod-1")  # first sight: the attempt is upserted
    await store.agent_gate("r", "pod-1")
    assert [a.id for a in await store.attempts("r")] == ["pod-1"]
    with pytest.raises(Conflict, match="used all 1 attempts"):
        await store.agent_gate("r", "pod-2")
    await store.cancel("r")
    with pytest.raises(Forbidden, match="cancelled"):
        await store.agent_gate("r", "pod-1")
    with pytest.raises(Forbidden, match="does not exist"):
        await store.agent_gate("nope", "pod-1")


async def test_a_status_read_that_resumes_after_the_rollout_ended_does_not_reopen_its_key(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gate's status read (a replica that had not seen the rollout, or one that forgot its states) took its
    snapshot while the rollout ran; the rollout ended before the read came back. What the read brings must not
    take the place of the end this store already knows: kept, the key worked for good."""
    await running_rollout(store)
    store._status.clear()  # not seen yet here
    held = HeldRead(store, monkeypatch)
    asking = asyncio.ensure_future(store.rollout_status("r1"))
    await held.read.wait()  # the read saw it running
    await store.cancel("r1")
    held.release.set()
    await asking
    with pytest.raises(Forbidden, match="cancelled"):
        await store.agent_gate("r1", "pod-1")
    assert await store.rollout_status("r1") is RolloutStatus.CANCELLED


async def test_agent_gate_refuses_an_attempt_that_ended(store: Store) -> None:
    await running_rollout(store, max_attempts=2)
    await store.agent_gate("r1", "pod-1")
    await store.update_attempt("r1", "pod-1", AttemptStatus.FAILED, exit_code=1)
    with pytest.raises(Forbidden, match="failed"):
        await store.agent_gate("r1", "pod-1")


async def test_an_attempt_ended_while_its_first_call_was_let_in_stays_shut(store: Store) -> None:
    """The agent's first request and the runner's verdict race: the gate saw the attempt running in a write
    committed before the verdict's, and must not keep it open once the verdict is in."""
    await running_rollout(store, max_attempts=2)
    await store.start_attempt("r1", "pod-1")  # the runner's (admin): the gate has not seen it yet
    await asyncio.gather(
        store.agent_gate("r1", "pod-1"),
        store.update_attempt("r1", "pod-1", AttemptStatus.TIMEOUT),
        return_exceptions=True,
    )
    with pytest.raises(Forbidden, match="timeout"):
        await store.agent_gate("r1", "pod-1")


@pytest.mark.parametrize("source", ["agent", "grader"])
async def test_an_agents_or_graders_events_come_only_while_the_rollout_runs(
    store: Store, source: str
) -> None:
    """Their keys are checked when a request's headers arrive; its body may come after the rollout ended."""
    await running_rollout(store, trust_agent_rewards=True)
    await store.add_events("r1", [EventSpec("reward", {"value": 0.0})], source="admin")
    await store.finish("r1", RolloutStatus.SUCCEEDED)
    with pytest.raises(Forbidden, match="succeeded"):
        await store.add_events("r1", [EventSpec("reward", {"value": 1.0})], source=source)
    with pytest.raises(Forbidden, match="succeeded"):
        await store.add_events("r1", [EventSpec("note", {"x": 1})], source=source)
    assert (await store.get_rollout("r1")).reward == 0.0
    await store.add_events("r1", [EventSpec("reward", {"value": 0.5})], source="admin")  # the trainer may
    assert (await store.get_rollout("r1")).reward == 0.5


async def test_only_a_reward_that_counts_for_the_rollout_sets_its_reward(store: Store) -> None:
    await running_rollout(store)
    await store.add_events("r1", [EventSpec("reward", {"value": 1.0})], source="admin")
    step = {"value": 0.0, "response_id": "chatcmpl-x", "choice": 0}
    await store.add_events(
        "r1", [EventSpec("reward", step)], source="grader"
    )  # one step's, not the rollout's
    await store.add_events(
        "r1", [EventSpec("reward", {"value": 9.0})], source="agent"
    )  # an untrusted agent's
    assert (await store.get_rollout("r1")).reward == 1.0
    assert [r.id for r in await store.list_rollouts(RolloutFilter(reward_min=1.0))] == ["r1"]


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 10**400])
async def test_a_reward_must_be_finite_on_every_backend(store: Store, value: float) -> None:
    await running_rollout(store)
    with pytest.raises(BadRequest, match="finite numeric value"):
        await store.add_events("r1", [EventSpec("reward", {"value": value})])
    assert (await store.get_rollout("r1")).reward is None


async def test_a_response_id_with_nul_is_not_found_on_every_backend(store: Store) -> None:
    with pytest.raises(NotFound):
        await store.response_call("resp_a\x00b")


@pytest.mark.parametrize(
    "read",
    [
        lambda store, s: store.list_rollouts(RolloutFilter(mode=s)),
        lambda store, s: store.list_rollouts(RolloutFilter(group_id=s)),
        lambda store, s: store.list_rollouts(RolloutFilter(model_version=s)),
        lambda store, s: store.events("r1", kind=s),
        lambda store, s: store.calls("r1", s),
        lambda store, s: store.calls("r1", None, label=("k", s)),
        lambda store, s: store.put_model(s, ["http://127.0.0.1:1/v1"], "v1"),
        lambda store, s: store.put_model("m", ["http://127.0.0.1:1/v1"], s),
        lambda store, s: store.remove_model(s),
        lambda store, s: store.delete_response("resp_" + s),
        lambda store, s: store.response_deleted("resp_" + s),
    ],
    ids=[
        "mode",
        "group",
        "model_version",
        "kind",
        "attempt",
        "label",
        "model",
        "version",
        "remove",
        "delete",
        "deleted",
    ],
)
async def test_text_with_nul_is_refused_alike_by_every_backend(store: Store, read: Any) -> None:
    """PostgreSQL's text cannot hold NUL: a 400 everywhere rather than a 500 there (and a model version that
    would make every later call of the model fail to commit)."""
    await running_rollout(store)
    with pytest.raises(BadRequest, match="NUL"):
        await read(store, "a\x00b")
    assert await store.models() == []


async def test_a_rollouts_token_total_is_read_once_however_many_ask_and_then_kept_by_the_writes(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue #15: the tokens addon read a rollout's whole call history on first sight, once per concurrent call
    # (p99 of 3-5 s at c=32). Now one read, shared, and never again for that rollout.
    if type(store).__name__ == "PostgresStore":
        pytest.skip(
            "shared by replicas, PostgreSQL keeps each total in a row and reads it every time (one row)"
        )
    await running_rollout(store)
    for i in range(50):
        await store.add_call(call("r1", i, [1, 2, 3], [[4, 5]]))
    reads = 0
    target = MemoryRepo if isinstance(store, MemoryStore) else SQLiteRepo  # (PostgreSQL's repo is SQLite's)
    original = target.rollout_tokens

    def counting(self: object, rollout_id: str) -> int:
        nonlocal reads
        reads += 1
        return original(self, rollout_id)  # type: ignore[arg-type]

    monkeypatch.setattr(target, "rollout_tokens", counting)
    totals = await asyncio.gather(*(store.tokens_used("r1") for _ in range(32)))
    assert totals == [50 * (3 + 2)] * 32
    await store.add_call(call("r1", 99, [1, 2, 3, 4, 5, 6], [[7]]))
    assert await store.tokens_used("r1") == 50 * 5 + 7
    assert reads == 1


async def test_a_resource_cannot_take_the_name_of_the_latest_route(store: Store) -> None:
    with pytest.raises(BadRequest, match="reserved"):
        await store.put_resource("latest", {"lr": 1})
    assert await store.latest_resources() == []


async def test_a_rollouts_storage_quota_stops_its_agent_not_the_admin(store: Store) -> None:
    # Issue #15 M4: agents could store without bound.
    await running_rollout(store)
    store.max_rollout_bytes = 20_000
    for _ in range(5):
        await store.add_events("r1", [EventSpec("note", "x" * 3000)], source="agent")
    used = await store.rollout_bytes("r1")
    assert 15_000 <= used < 20_000
    await store.add_call(call("r1", 1, list(range(1000)), [[1, 2, 3]]))  # a call in flight is always recorded
    assert await store.rollout_bytes("r1") >= 20_000
    with pytest.raises(QuotaExceeded, match="storage quota of 20000 bytes"):
        await store.add_events("r1", [EventSpec("note", "one more")], source="agent")
    await store.add_events("r1", [EventSpec("verdict", "admin writes are not the agent's")], source="admin")
    assert [e.kind for e in await store.events("r1")][-1] == "verdict"


async def test_the_bytes_counted_match_what_a_fresh_read_finds(store: Store) -> None:
    await running_rollout(store)
    await store.add_events("r1", [EventSpec("note", {"a": list(range(100))})])
    await store.add_call(call("r1", 1, list(range(300)), [[1, 2], [3]]))
    counted = await store.rollout_bytes("r1")
    store._bytes.clear()
    assert await store.rollout_bytes("r1") == counted > 0


async def test_an_event_larger_than_max_event_bytes_is_a_413_and_nothing_is_written(store: Store) -> None:
    # Issue #15 M4: one 28 MiB event stalled the event loop for about 3 s.
    await running_rollout(store)
    store.max_event_bytes = 1000
    with pytest.raises(PayloadTooLarge, match="at most 1000"):
        await store.add_events("r1", [EventSpec("note", "ok"), EventSpec("note", "x" * 2000)])
    assert await store.events("r1") == []


async def test_what_the_store_keeps_of_a_write_holds_even_when_its_caller_stops_waiting(store: Store) -> None:
    # Review of issue #15: a cancel whose client left while the write was queued committed the cancel, but the
    # status cache still said running and the rollout-ended listeners never heard of it.
    await running_rollout(store)
    heard: list[str] = []
    told = asyncio.Event()
    store.on_rollout_ended(lambda rid: (heard.append(rid), told.set()))
    cancelling = asyncio.ensure_future(store.cancel("r1"))
    await asyncio.sleep(0)  # (one turn: the cancel starts and queues its write) then its caller goes away
    if cancelling.cancel():
        with pytest.raises(asyncio.CancelledError):
            await cancelling
    else:  # (the memory store's writes do not suspend: it was done already)
        await cancelling
    await asyncio.wait_for(told.wait(), 5)  # the shielded write finishes on its own
    assert heard == ["r1"]
    assert await store.rollout_status("r1") is RolloutStatus.CANCELLED


async def test_a_resources_versions_are_read_in_pages_oldest_first(store: Store) -> None:
    for k in range(5):
        await store.put_resource("training", {"iteration": k})
    await store.put_resource("other", 1)
    assert [r.value["iteration"] for r in await store.resource_versions("training")] == [0, 1, 2, 3, 4]
    page = await store.resource_versions("training", after=2, limit=2)
    assert [(r.version, r.value["iteration"]) for r in page] == [(3, 2), (4, 3)]
    assert await store.resource_versions("missing") == []
    with pytest.raises(BadRequest):
        await store.resource_versions("training", limit=0)
