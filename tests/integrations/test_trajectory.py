"""The prefix-tree merge, to the token: hand-computed rows, a property test over random agents, and agents
rendered with a real tokenizer and chat template."""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agl_lite.integrations.mismatch import Mismatch
from agl_lite.integrations.trajectory import Row, merge_trajectories, single_rows
from agl_lite.store.records import CallOutcome, ChoiceRecord, LLMCall, Rollout
from agl_lite.store.triplets import RewardInfo, build_triplets
from tests.integrations.conftest import tri


def spans(row: Row) -> list[tuple[int, int, int, bool]]:
    return [(s.start, s.end, s.triplet.order_key, s.trained) for s in row.spans]


# --- hand-computed -------------------------------------------------------------------------------------------------


def test_a_turn_that_extends_the_last_one_continues_its_row_with_the_observation_masked() -> None:
    t1 = tri(1, [1, 2, 3], [4, 5], logprobs=[-0.5, -0.25])
    t2 = tri(2, [1, 2, 3, 4, 5, 6, 7], [8, 9], logprobs=[-0.125, -1.0])
    (row,), stats = merge_trajectories([t2, t1])  # any order in: request order out
    assert row.prompt_ids.tolist() == [1, 2, 3]
    assert row.response_ids.tolist() == [4, 5, 6, 7, 8, 9]
    assert row.response_mask.tolist() == [1, 1, 0, 0, 1, 1]
    assert row.logprobs is not None
    assert row.logprobs.tolist() == [-0.5, -0.25, 0.0, 0.0, -0.125, -1.0]
    assert spans(row) == [(0, 2, 1, True), (4, 6, 2, True)]
    assert (stats.rows, stats.merged_steps, stats.merged_rows, stats.split_mismatch) == (1, 1, 1, 0)


def test_a_new_model_version_starts_a_new_row() -> None:
    t1 = tri(1, [1, 2], [3], version="v1")
    t2 = tri(2, [1, 2, 3, 4], [5], version="v2")
    rows, stats = merge_trajectories([t1, t2])
    assert [(r.prompt_ids.tolist(), r.response_ids.tolist(), r.model_version) for r in rows] == [
        ([1, 2], [3], "v1"),
        ([1, 2, 3, 4], [5], "v2"),
    ]
    assert (stats.split_version, stats.merged_steps, stats.split_mismatch) == (1, 0, 0)


def test_a_side_call_on_another_context_is_its_own_branch() -> None:
    main1 = tri(1, [1, 2], [3])
    side = tri(2, [50, 51], [52])
    main2 = tri(3, [1, 2, 3, 4], [5])
    rows, stats = merge_trajectories([main1, side, main2])
    assert [(r.prompt_ids.tolist(), r.response_ids.tolist(), r.response_mask.tolist()) for r in rows] == [
        ([50, 51], [52], [1]),
        ([1, 2], [3, 4, 5], [1, 0, 1]),
    ]
    assert (stats.branches, stats.split_mismatch, stats.merged_steps) == (1, 0, 1)


def test_a_fork_trains_the_shared_step_once_on_the_branch_that_went_on() -> None:
    t1 = tri(1, [1, 2], [3], logprobs=[-1.0])
    fork = tri(2, [1, 2, 3, 60], [61], logprobs=[-2.0])
    t3 = tri(3, [1, 2, 3, 4], [5], logprobs=[-3.0])
    rows, stats = merge_trajectories([t1, fork, t3])
    assert [(r.response_ids.tolist(), r.response_mask.tolist()) for r in rows] == [
        ([3, 60, 61], [0, 0, 1]),
        ([3, 4, 5], [1, 0, 1]),
    ]
    assert [r.logprobs.tolist() if r.logprobs is not None else None for r in rows] == [
        [0.0, 0.0, -2.0],
        [-1.0, 0.0, -3.0],
    ]
    assert [spans(r) for r in rows] == [
        [(0, 1, 1, False), (2, 3, 2, True)],
        [(0, 1, 1, True), (2, 3, 3, True)],
    ]
    assert stats.shared_steps == 1


def test_the_choices_of_one_call_are_siblings_and_a_turn_extends_the_one_it_chose() -> None:
    c0 = tri(1, [1, 2], [3], choice=0)
    c1 = tri(1, [1, 2], [4], choice=1)
    nxt = tri(2, [1, 2, 4, 9], [10])
    rows, _ = merge_trajectories([c0, c1, nxt])
    assert [(r.response_ids.tolist(), r.response_mask.tolist()) for r in rows] == [
        ([3], [1]),
        ([4, 9, 10], [1, 0, 1]),
    ]


def test_identical_samples_are_kept_as_they_are() -> None:
    a = tri(1, [1, 2], [3])
    b = tri(2, [1, 2], [3])
    rows, stats = merge_trajectories([a, b])
    assert [r.response_ids.tolist() for r in rows] == [[3], [3]]
    assert (stats.branches, stats.split_mismatch) == (1, 0)  # the same prompt again is no continuation


def test_a_step_without_logprobs_leaves_its_row_without() -> None:
    t1 = tri(1, [1], [2], logprobs=[-1.0])
    t2 = tri(2, [1, 2, 3], [4], logprobs=None)
    (row,), _ = merge_trajectories([t1, t2])
    assert row.logprobs is None


def test_attempts_are_merged_apart() -> None:
    a = tri(1, [1, 2], [3], attempt="a1")
    b = tri(2, [1, 2, 3, 4], [5], attempt="a2")
    rows, stats = merge_trajectories([a, b])
    assert len(rows) == 2
    assert stats.merged_steps == 0


def test_single_rows_is_one_row_per_triplet() -> None:
    rows, stats = single_rows([tri(1, [1], [2, 3], logprobs=[-1.0, -2.0]), tri(2, [1, 2, 3, 4], [5])])
    assert [(r.prompt_ids.tolist(), r.response_ids.tolist(), r.response_mask.tolist()) for r in rows] == [
        ([1], [2, 3], [1, 1]),
        ([1, 2, 3, 4], [5], [1]),
    ]
    assert stats.rows == 2


# --- mismatches, from the conversation digests -----------------------------------------------------------------------


def test_a_continued_conversation_whose_prompt_changed_before_the_reply_is_a_template_split() -> None:
    t1 = tri(1, [1, 2, 3], [4, 5], conversation=["user:a"], reply="assistant:r")
    t2 = tri(2, [1, 9, 3, 4, 5, 6], [7], conversation=["user:a", "assistant:r", "user:b"])
    rows, stats = merge_trajectories([t1, t2])
    assert len(rows) == 2
    assert (stats.split_mismatch, stats.mismatches) == (1, {Mismatch.TEMPLATE: 1})


def test_a_continued_conversation_whose_reply_ids_changed_is_a_retokenization_split() -> None:
    t1 = tri(1, [1, 2, 3], [4, 5], conversation=["user:a"], reply="assistant:r")
    t2 = tri(2, [1, 2, 3, 45, 6], [7], conversation=["user:a", "assistant:r", "user:b"])
    _, stats = merge_trajectories([t1, t2])
    assert stats.mismatches == {Mismatch.RETOKENIZATION: 1}


def test_an_edited_reply_is_an_other_split() -> None:
    t1 = tri(1, [1, 2, 3], [4, 5], conversation=["user:a"], reply="assistant:r")
    t2 = tri(2, [1, 2, 3, 44, 6], [7], conversation=["user:a", "assistant:edited", "user:b"])
    _, stats = merge_trajectories([t1, t2])
    assert stats.mismatches == {Mismatch.OTHER: 1}


def test_a_new_conversation_sharing_a_system_prompt_is_a_branch_not_a_mismatch() -> None:
    t1 = tri(1, [1, 2, 3], [4], conversation=["system:s", "user:a"], reply="assistant:r")
    t2 = tri(2, [1, 2, 8], [9], conversation=["system:s", "user:other"])
    _, stats = merge_trajectories([t1, t2])
    assert (stats.branches, stats.split_mismatch) == (1, 0)


# --- a property: random agents ---------------------------------------------------------------------------------------


@dataclass
class _Plan:
    parents: list[int | None]
    """For each call, the earlier call it extends (None: a fresh context)."""
    versions: list[int]


@st.composite
def plans(draw: st.DrawFn) -> _Plan:
    n = draw(st.integers(1, 12))
    parents: list[int | None] = []
    for i in range(n):
        parents.append(draw(st.none() | st.integers(0, i - 1)) if i else None)
    versions = draw(st.lists(st.integers(0, 1), min_size=n, max_size=n))
    return _Plan(parents, versions)


@settings(max_examples=60, deadline=None)
@given(plans(), st.data())
def test_rows_rebuild_every_chain_and_train_every_step_exactly_once(plan: _Plan, data: st.DataObject) -> None:
    counter = iter(range(1000, 10**6))  # every token unique: the only prefixes are the planned ones

    def fresh(k: int) -> list[int]:
        return [next(counter) for _ in range(k)]

    calls, seqs = [], []
    for i, parent in enumerate(plan.parents):
        obs = fresh(data.draw(st.integers(0 if parent is not None else 1, 3)))
        prompt = (seqs[parent] if parent is not None else []) + obs
        response = fresh(data.draw(st.integers(1, 3)))
        calls.append(tri(i + 1, prompt, response, version=f"v{plan.versions[i]}", logprobs=[-(i + 1)] * 3))
        calls[-1].logprobs = calls[-1].logprobs[: len(response)]  # type: ignore[index]
        seqs.append(prompt + response)
    rows, stats = merge_trajectories(calls)

    def attaches(i: int) -> bool:
        p = plan.parents[i]
        return p is not None and plan.versions[p] == plan.versions[i]

    assert stats.merged_steps == sum(attaches(i) for i in range(len(calls)))
    has_child = {plan.parents[i] for i in range(len(calls)) if attaches(i)}
    assert len(rows) == stats.rows == len(calls) - len(has_child)
    trained = []
    for row in rows:
        last = row.spans[-1].triplet
        assert (row.prompt_ids + row.response_ids).tolist() == seqs[last.order_key - 1]
        assert row.spans[0].triplet.prompt_ids == row.prompt_ids
        assert row.spans[-1].trained
        for s in row.spans:
            assert row.response_ids[s.start : s.end] == s.triplet.response_ids
            assert set(row.response_mask[s.start : s.end]) == {1 if s.trained else 0}
            if s.trained:
                trained.append(s.triplet.order_key)
        assert sum(row.response_mask) == sum(len(s.triplet.response_ids) for s in row.spans if s.trained)
        assert row.logprobs is not None
        assert all(lp == 0.0 for lp, m in zip(row.logprobs, row.response_mask, strict=True) if not m)
    assert sorted(trained) == [t.order_key for t in calls]


# --- a real tokenizer and chat template ------------------------------------------------------------------------------

QUESTIONS = [f"Step {i}: what is {i} plus {i * 3}?" for i in range(10)]
REPLIES = [f"It is {i + i * 3}. Next?" for i in range(10)]
OTHER_TEMPLATE_SYSTEM = "You are a helpful assistant."


def _call(
    order: int, messages: list[dict[str, Any]], prompt: list[int], reply: str, ids: list[int]
) -> LLMCall:
    return LLMCall(
        id=f"c{order}",
        order_key=order,
        outcome=CallOutcome.OK,
        api="chat",
        rollout_id="r1",
        attempt_id="a1",
        status=200,
        model="qwen",
        model_version="v1",
        response_id=f"chatcmpl-{order}",
        request={"model": "qwen", "messages": messages},
        prompt_token_ids=array("I", prompt),
        choices=[ChoiceRecord(0, reply, [], "stop", array("I", ids))],
        complete=True,
    )


def _agent(
    qwen: Any, *, template_from: int | None = None, side_at: int | None = None, drift_at: int | None = None
):
    """A 10-turn agent: each turn resends the conversation with the model's reply and a new question."""
    end = qwen.convert_tokens_to_ids("<|im_end|>")
    other = qwen.chat_template.replace(
        "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.", OTHER_TEMPLATE_SYSTEM
    )
    messages: list[dict[str, Any]] = []
    calls, order = [], 0
    for turn in range(10):
        messages.append({"role": "user", "content": QUESTIONS[turn]})
        template = other if template_from is not None and turn >= template_from else None
        prompt = qwen.apply_chat_template(
            messages, chat_template=template, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        reply = REPLIES[turn]
        ids = qwen.encode(reply, add_special_tokens=False)
        if drift_at == turn:  # the sampler split a word the tokenizer keeps whole: same text, other ids
            cut = reply.index("Next") + 2  # " Ne" + "xt?": the tokenizer keeps " Next" whole
            ids = qwen.encode(reply[:cut], add_special_tokens=False) + qwen.encode(
                reply[cut:], add_special_tokens=False
            )
            assert qwen.decode(ids) == reply
            assert ids != qwen.encode(reply, add_special_tokens=False)
        order += 1
        calls.append(_call(order, list(messages), list(prompt), reply, [*ids, end]))
        if side_at == turn:
            side = [{"role": "system", "content": "Summarise."}, {"role": "user", "content": QUESTIONS[0]}]
            order += 1
            side_prompt = qwen.apply_chat_template(
                side, add_generation_prompt=True, tokenize=True, return_dict=False
            )
            calls.append(_call(order, side, list(side_prompt), "A sum.", [*qwen.encode("A sum."), end]))
        messages.append({"role": "assistant", "content": reply})
    rollout = Rollout("r1", {}, group_id="g1")
    return build_triplets(rollout, calls, RewardInfo()).triplets


def _decode(qwen: Any) -> Any:
    return lambda ids: qwen.decode(list(ids), skip_special_tokens=False)


def test_ten_turns_that_extend_each_other_are_one_row(qwen: Any) -> None:
    triplets = _agent(qwen)
    (row,), stats = merge_trajectories(triplets, decode=_decode(qwen))
    assert (stats.merged_steps, stats.split_mismatch, stats.branches) == (9, 0, 0)
    assert len(row.spans) == 10
    assert all(s.trained for s in row.spans)
    last = triplets[-1]
    assert (row.prompt_ids + row.response_ids).tolist() == (last.prompt_ids + last.response_ids).tolist()
    assert sum(row.response_mask) == sum(len(t.response_ids) for t in triplets)


def test_a_template_change_at_turn_five_splits_into_two_rows_classified_as_template(qwen: Any) -> None:
    triplets = _agent(qwen, template_from=5)
    for decode in (_decode(qwen), None):
        rows, stats = merge_trajectories(triplets, decode=decode)
        assert [len(r.spans) for r in rows] == [5, 5]
        assert rows[1].prompt_ids == triplets[5].prompt_ids
        assert (stats.split_mismatch, stats.mismatches) == (1, {Mismatch.TEMPLATE: 1})


def test_a_parallel_side_call_is_its_own_branch_and_the_main_chain_stays_whole(qwen: Any) -> None:
    triplets = _agent(qwen, side_at=2)
    rows, stats = merge_trajectories(triplets, decode=_decode(qwen))
    assert sorted(len(r.spans) for r in rows) == [1, 10]
    (main,) = [r for r in rows if len(r.spans) == 10]
    assert [s.triplet.turn for s in main.spans] == [0, 1, 2, 4, 5, 6, 7, 8, 9, 10]  # the side call is turn 3
    assert (stats.branches, stats.split_mismatch, stats.mismatches) == (1, 0, {})


def test_reply_ids_the_tokenizer_would_not_make_are_a_retokenization_split(qwen: Any) -> None:
    triplets = _agent(qwen, drift_at=3)
    for decode in (_decode(qwen), None):
        rows, stats = merge_trajectories(triplets, decode=decode)
        # Turn 4's prompt holds turn 3's reply re-tokenised: it extends turn 2 exactly, so the tree forks there.
        # Turn 3 keeps its row (turns 0-2 as context, its own sampled ids trained); the chain goes on from turn 2.
        assert [[s.triplet.turn for s in r.spans] for r in rows] == [
            [0, 1, 2, 3],
            [0, 1, 2, 4, 5, 6, 7, 8, 9],
        ]
        assert [[s.trained for s in r.spans] for r in rows] == [[False] * 3 + [True], [True] * 9]
        assert (stats.split_mismatch, stats.mismatches, stats.shared_steps) == (
            1,
            {Mismatch.RETOKENIZATION: 1},
            3,
        )
