"""Triplets from the store's records, on every backend: which calls count, in what order, with which reward."""

from __future__ import annotations

import math
from array import array
from typing import Any

import pytest

from agl_lite.errors import BadRequest, NotFound
from agl_lite.store.records import (
    Attempt,
    AttemptStatus,
    CallOutcome,
    ChoiceRecord,
    LLMCall,
    RolloutConfig,
)
from agl_lite.store.rules import EventSpec, RolloutSpec, Store
from agl_lite.store.triplets import (
    AttemptScope,
    RewardPolicy,
    TripletOptions,
    final_attempt,
    rollout_triplets,
)


def call(
    order: int,
    attempt: str = "a1",
    *,
    outcome: CallOutcome = CallOutcome.OK,
    complete: bool | None = True,
    choices: int = 1,
    logprobs: list[float] | None = None,
    messages: list[dict[str, Any]] | None = None,
    client_id: str | None = None,
) -> LLMCall:
    return LLMCall(
        id=f"c{order}",
        order_key=order,
        outcome=outcome,
        api="chat",
        rollout_id="r1",
        attempt_id=attempt,
        status=200,
        model="m",
        model_version="v1",
        response_id=f"resp-{order}",
        client_id=client_id or f"resp-{order}",
        request={"model": "m", "messages": messages or [{"role": "user", "content": f"q{order}"}]},
        sampling={"temperature": 1.0},
        prompt_token_ids=array("I", [order, order + 1]),
        choices=[
            ChoiceRecord(i, f"a{order}.{i}", [], "stop", array("I", [100 * order + i]), None)
            if logprobs is None
            else ChoiceRecord(
                i, f"a{order}.{i}", [], "stop", array("I", [100 * order + i]), array("f", logprobs)
            )
            for i in range(choices)
        ],
        complete=complete,
    )


async def rollout(store: Store, *, trust: bool = False, attempts: tuple[str, ...] = ("a1",)) -> None:
    await store.enqueue(
        [
            RolloutSpec(
                {"q": 1},
                id="r1",
                group_id="g1",
                config=RolloutConfig(max_attempts=3, trust_agent_rewards=trust),
            )
        ]
    )
    await store.claim("runner", 1)
    for a in attempts:
        await store.start_attempt("r1", a)


async def test_only_ok_complete_calls_count_in_request_order_one_per_choice(store: Store) -> None:
    await rollout(store)
    for c in [
        call(3, choices=2),
        call(1),
        call(2, outcome=CallOutcome.UPSTREAM_ERROR),
        call(4, complete=False),
        call(5, complete=None, choices=0),
    ]:
        await store.add_call(c)
    unchecked = call(6, complete=None)  # no usage to check against, but every choice has its ids
    await store.add_call(unchecked)
    rt = await rollout_triplets(store, "r1")
    assert [(t.order_key, t.choice, t.turn, t.response_ids.tolist()) for t in rt.triplets] == [
        (1, 0, 0, [100]),
        (3, 0, 1, [300]),
        (3, 1, 1, [301]),
        (6, 0, 2, [600]),
    ]
    assert rt.skipped == {"not_ok": 1, "incomplete": 2}
    t = rt.triplets[0]
    assert (t.prompt_ids.tolist(), t.group_id, t.model_version, t.sampling) == (
        [1, 2],
        "g1",
        "v1",
        {"temperature": 1.0},
    )


async def test_only_the_final_attempt_counts_unless_all_are_asked_for(store: Store) -> None:
    await rollout(store, attempts=("a1", "a2"))
    await store.add_call(call(1, "a1"))
    await store.add_call(call(2, "a2"))
    final = await rollout_triplets(store, "r1")
    assert ([t.attempt_id for t in final.triplets], final.attempt_ids) == (["a2"], ["a2"])
    every = await rollout_triplets(store, "r1", TripletOptions(attempts=AttemptScope.ALL))
    assert [t.attempt_id for t in every.triplets] == ["a1", "a2"]


async def test_the_final_attempt_is_the_one_that_succeeded_not_a_later_lost_one(store: Store) -> None:
    """A replacement pod that overlapped the one it replaced: the first succeeded, the later one was lost."""
    await rollout(store, attempts=("a1", "a2"))
    await store.add_call(call(1, "a1"))
    await store.add_call(call(2, "a1"))
    await store.add_call(call(3, "a2"))
    await store.update_attempt("r1", "a1", AttemptStatus.SUCCEEDED)
    await store.update_attempt("r1", "a2", AttemptStatus.LOST)
    rt = await rollout_triplets(store, "r1")
    assert (rt.attempt_ids, [t.order_key for t in rt.triplets]) == (["a1"], [1, 2])


def attempt(seq: int, status: AttemptStatus) -> Attempt:
    return Attempt(id=f"a{seq}", rollout_id="r1", seq=seq, started_at=0.0, status=status)


@pytest.mark.parametrize(
    ("statuses", "final"),
    [
        (["failed", "running"], "a2"),  # a retry under way
        (["failed", "timeout"], "a2"),  # the agent's own failures: the last one
        (["succeeded", "lost"], "a1"),
        (["succeeded", "failed", "cancelled"], "a1"),
        (["failed", "lost"], "a1"),  # the infrastructure lost the retry: the agent's last own end
        (["lost", "cancelled"], "a2"),  # nothing of the agent's own: the last started
    ],
)
def test_the_final_attempt_prefers_success_then_the_agents_own_end(statuses: list[str], final: str) -> None:
    attempts = [attempt(i + 1, AttemptStatus(s)) for i, s in enumerate(statuses)]
    assert final_attempt(list(reversed(attempts))).id == final


async def test_a_step_reward_leaves_the_rollouts_reward_as_the_triplets_read_it(store: Store) -> None:
    await rollout(store)
    await store.add_call(call(1))
    await store.add_events("r1", [EventSpec("reward", {"value": 1.0})], source="admin")
    step = {"value": 0.0, "response_id": "resp-1", "choice": 0}
    await store.add_events("r1", [EventSpec("reward", step)], source="grader")
    await store.add_events("r1", [EventSpec("reward", {"value": 7.0})], source="agent")  # untrusted
    rt = await rollout_triplets(store, "r1")
    assert (await store.get_rollout("r1")).reward == rt.reward == 1.0


async def test_the_last_authoritative_reward_is_the_rollouts_and_untrusted_agent_rewards_do_not_count(
    store: Store,
) -> None:
    await rollout(store)
    await store.add_call(call(1))
    await store.add_call(call(2))
    await store.add_events("r1", [EventSpec("reward", {"value": 0.25})], source="admin")
    await store.add_events("r1", [EventSpec("reward", {"value": 0.5})], source="grader")
    await store.add_events("r1", [EventSpec("reward", {"value": 9.0})], source="agent")
    rt = await rollout_triplets(store, "r1")
    assert (rt.reward, rt.reward_source) == (0.5, "grader")
    assert [t.reward for t in rt.triplets] == [0.0, 0.5]
    broadcast = await rollout_triplets(store, "r1", TripletOptions(reward_policy=RewardPolicy.BROADCAST))
    assert [t.reward for t in broadcast.triplets] == [0.5, 0.5]


async def test_a_trusted_agents_reward_counts(store: Store) -> None:
    await rollout(store, trust=True)
    await store.add_call(call(1))
    await store.add_events("r1", [EventSpec("reward", {"value": 0.75})], source="agent")
    assert (await rollout_triplets(store, "r1")).reward == 0.75


async def test_a_reward_naming_a_response_and_choice_rewards_that_step_only(store: Store) -> None:
    await rollout(store)
    await store.add_call(call(1, choices=2, client_id="msg_one"))
    await store.add_call(call(2))
    await store.add_events("r1", [EventSpec("reward", {"value": 1.0})], source="admin")
    step = {"value": 0.5, "response_id": "msg_one", "choice": 1}  # the id an Anthropic client saw
    await store.add_events("r1", [EventSpec("reward", step)], source="grader")
    rt = await rollout_triplets(store, "r1")
    assert rt.reward == 1.0
    assert [(t.order_key, t.choice, t.step_reward, t.reward) for t in rt.triplets] == [
        (1, 0, None, 0.0),
        (1, 1, 0.5, 0.5),
        (2, 0, None, 1.0),
    ]


async def test_a_rollout_without_reward_gets_the_fill_value_and_says_it_has_none(store: Store) -> None:
    await rollout(store)
    await store.add_call(call(1))
    rt = await rollout_triplets(store, "r1", TripletOptions(missing_reward=-1.0))
    assert (rt.reward, [t.reward for t in rt.triplets]) == (None, [-1.0])


async def test_logprobs_with_a_gap_are_left_out_rather_than_poison_a_loss(store: Store) -> None:
    await rollout(store)
    await store.add_call(call(1, logprobs=[math.nan]))
    await store.add_call(call(2, logprobs=[-0.5]))
    lps = [
        t.logprobs.tolist() if t.logprobs is not None else None
        for t in (await rollout_triplets(store, "r1")).triplets
    ]
    assert lps == [None, [-0.5]]


async def test_a_reply_sent_back_verbatim_digests_like_the_next_calls_message(store: Store) -> None:
    await rollout(store)
    first = [{"role": "user", "content": "q"}]
    await store.add_call(call(1, messages=first))
    echoed = {"role": "assistant", "content": "a1.0", "refusal": None, "tool_calls": []}
    await store.add_call(call(2, messages=[*first, echoed, {"role": "user", "content": "more"}]))
    one, two = (await rollout_triplets(store, "r1")).triplets
    assert two.conversation[: len(one.conversation)] == one.conversation
    assert two.conversation[len(one.conversation)] == one.reply


async def test_an_unknown_rollout_is_not_found(store: Store) -> None:
    with pytest.raises(NotFound):
        await rollout_triplets(store, "nope")


def test_options_from_a_bad_query_name_the_parameter() -> None:
    """What `GET .../triplets` declares for its options (the store API's endpoint)."""
    from agl_lite.addons.store_api import StoreApi

    (route,) = [r for r in StoreApi.routes if r.name == "triplets.get"]
    for name, raw in [
        ("attempts", "x"),
        ("reward_policy", "x"),
        ("missing_reward", "nan"),
        ("missing_reward", "x"),
    ]:
        with pytest.raises(BadRequest, match=name):
            route.query[name].parse(name, raw)
    assert {n: p.default for n, p in route.query.items()} == TripletOptions().to_json()
