"""AglLiteDaemon against a real gateway, the mock vLLM and real agents: the batch of real captures written out by
hand, groups and stragglers, the weight sync, the number of requests and flat memory over 256 rollouts."""

from __future__ import annotations

import asyncio
import gc
import math
import tracemalloc
from array import array

import pytest

from agl_lite.client import AglLiteClient
from agl_lite.integrations.verl.daemon import AglLiteDaemon, DaemonConfig, Sample
from agl_lite.store.records import CallOutcome, ChoiceRecord, LLMCall, RolloutStatus
from agl_lite.store.rules import EventSpec
from agl_lite.store.triplets import RolloutTriplets
from agl_lite.testing.mock_vllm.tokenizer import EOS_ID, FakeTokenizer
from tests.client.conftest import FAST, store_of
from tests.conftest import ADMIN_KEY, gateway_url
from tests.integrations.verl.conftest import MODEL, Bench, reply_to

P, R, PAD = 64, 48, 0
TOK = FakeTokenizer()


def config(**kw: object) -> DaemonConfig:
    base: dict[str, object] = {
        "model": MODEL,
        "max_prompt_length": P,
        "max_response_length": R,
        "pad_token_id": PAD,
        "n": 2,
        "timeout_s": 30.0,
        "coalesce_s": 0.0,
    }
    return DaemonConfig(**{**base, **kw})  # type: ignore[arg-type]


def expected_row(question: str) -> tuple[list[int], list[int], list[int]]:
    """The prompt, response and mask of the two-turn agent, from the mock's tokenizer (not from agl-lite)."""
    first = [{"role": "user", "content": question}]
    p1 = TOK.chat_prompt_ids(first)
    c1 = [*TOK.encode(reply_to(question)), EOS_ID]
    second = [
        *first,
        {"role": "assistant", "content": reply_to(question)},
        {"role": "user", "content": "and then?"},
    ]
    p2 = TOK.chat_prompt_ids(second)
    c2 = [*TOK.encode(reply_to("and then?")), EOS_ID]
    assert p2[: len(p1) + len(c1)] == p1 + c1  # this template extends exactly
    observation = p2[len(p1) + len(c1) :]
    return p1, c1 + observation + c2, [1] * len(c1) + [0] * len(observation) + [1] * len(c2)


async def test_a_step_of_real_captures_is_the_batch_written_out_by_hand(bench: Bench) -> None:
    daemon = AglLiteDaemon(bench.agents, config())
    result = await daemon.step([Sample({"q": "What is 2+3?"}, {"answer": 5}, group_id="grp-1")])
    b, m = result.batch, result.metrics
    prompt, response, mask = expected_row("What is 2+3?")
    assert len(prompt) <= P
    assert len(response) <= R
    left, right = P - len(prompt), R - len(response)
    assert b.size == 2
    assert b.rows("prompts") == [[PAD] * left + prompt] * 2
    assert b.rows("responses") == [response + [PAD] * right] * 2
    assert b.rows("input_ids") == [[PAD] * left + prompt + response + [PAD] * right] * 2
    assert b.rows("attention_mask") == [[0] * left + [1] * (len(prompt) + len(response)) + [0] * right] * 2
    n = len(prompt) + len(response)
    assert b.rows("position_ids") == [[0] * left + list(range(n)) + [n - 1] * right] * 2
    assert b.rows("response_mask") == [mask + [0] * right] * 2
    score_at = len(response) - 1
    assert b.rows("token_level_scores") == [
        [1.0 if i == score_at else 0.0 for i in range(R)],
        [0.0] * R,
    ]
    assert b.is_drop_mask.tolist() == [0, 0]
    assert b.uid == ["grp-1", "grp-1"]
    (group,) = result.groups
    assert b.rollout_ids == [r.id for r in group]
    # logprobs: the captured ones (what vLLM sent), 0 on observations and padding
    expected_lps = []
    for rollout in group:
        calls = await bench.agents.calls(rollout.id)
        lp1, lp2 = (c.choices[0].logprobs for c in calls)
        assert lp1 is not None
        assert lp2 is not None
        obs = mask.count(0)
        expected_lps.append(lp1.tolist() + [0.0] * obs + lp2.tolist() + [0.0] * right)
    assert b.rows("rollout_log_probs") == expected_lps
    assert (m.rollouts, m.completed, m.trained_rollouts, m.with_reward, m.triplets) == (2, 2, 2, 2, 4)
    assert (m.merge.rows, m.merge.merged_rows, m.merge.merged_steps, m.merge.split_mismatch) == (2, 2, 2, 0)
    assert (m.dropped_groups, m.truncated_responses, m.mean_reward) == (0, 0, 0.5)
    assert m.trained_tokens == 2 * mask.count(1)


async def test_over_long_prompts_and_responses_are_marked_cut_and_counted(bench: Bench) -> None:
    prompt, response, _ = expected_row("What is 2+3?")
    daemon = AglLiteDaemon(bench.agents, config(max_prompt_length=len(prompt) - 2, max_response_length=5))
    result = await daemon.step([Sample({"q": "What is 2+3?"})])
    b = result.batch
    assert b.rows("prompts") == [prompt[2:]] * 2
    assert b.rows("responses") == [response[:5]] * 2
    assert b.is_drop_mask.tolist() == [1, 1]
    assert b.rows("token_level_scores")[0] == [0, 0, 0, 0, 1.0]
    assert (result.metrics.dropped_prompts, result.metrics.truncated_responses) == (2, 2)


async def test_merge_none_gives_one_row_per_call(bench: Bench) -> None:
    daemon = AglLiteDaemon(bench.agents, config(merge="none", n=1))
    result = await daemon.step([Sample({"q": "Hi"})])
    assert result.batch.size == 2
    assert result.batch.rows("token_level_scores")[0] == [0.0] * R  # the reward is on the last call's row


async def test_a_group_with_a_straggler_is_dropped_whole_and_the_straggler_cancelled(bench: Bench) -> None:
    bench.agents.held.add("slow")
    daemon = AglLiteDaemon(bench.agents, config(timeout_s=8.0))
    result = await daemon.step(
        [Sample({"q": "fast"}, group_id="g-fast"), Sample({"q": "slow"}, group_id="g-slow")]
    )
    assert result.dropped == ["g-slow"]
    assert set(result.batch.uid) == {"g-fast"}
    assert result.batch.size == 2
    m = result.metrics
    assert (m.groups, m.dropped_groups, m.stragglers, m.trained_rollouts) == (2, 1, 2, 2)
    for rollout in result.groups[1]:
        assert (await bench.agents.get_rollout(rollout.id)).status is RolloutStatus.CANCELLED


async def test_rollouts_without_reward_are_counted_and_filled(bench: Bench) -> None:
    bench.agents.reward_of = lambda rollout, index: None
    daemon = AglLiteDaemon(bench.agents, config(missing_reward=-1.0))
    result = await daemon.step([Sample({"q": "Hi"})])
    assert (result.metrics.without_reward, result.metrics.mean_reward) == (2, -1.0)
    assert [min(r) for r in result.batch.rows("token_level_scores")] == [-1.0, -1.0]


async def test_a_scorer_rewards_each_rollout_from_what_it_said_and_posts_the_reward(bench: Bench) -> None:
    bench.agents.reward_of = lambda rollout, index: None  # nobody else rewards: the algorithm does
    seen: list[tuple[str | None, object]] = []

    def score(rt: RolloutTriplets, sample: Sample) -> float:
        seen.append((rt.triplets[-1].text, sample.metadata["answer"]))
        return 0.25

    daemon = AglLiteDaemon(bench.agents, config(merge="none", n=2))
    result = await daemon.step([Sample({"q": "Hi"}, {"answer": "x"})], score=score)
    assert seen == [(reply_to("and then?"), "x")] * 2
    assert (result.metrics.with_reward, result.metrics.mean_reward) == (2, 0.25)
    assert sorted(max(r) for r in result.batch.rows("token_level_scores")) == [0.0, 0.0, 0.25, 0.25]
    for rollout in result.groups[0]:
        rewards = await bench.agents.events(rollout.id, kind="reward")
        assert [e.data["value"] for e in rewards] == [0.25]


@pytest.mark.parametrize("policy", ["drop", "train"])
async def test_a_rollout_whose_agent_failed_is_left_out_unless_asked(bench: Bench, policy: str) -> None:
    bench.agents.failing.add("Hi")
    daemon = AglLiteDaemon(bench.agents, config(failed_rollouts=policy))
    result = await daemon.step([Sample({"q": "Hi"}, group_id="g")])
    (group,) = result.groups
    assert [r.status for r in group] == [RolloutStatus.SUCCEEDED, RolloutStatus.FAILED]
    if policy == "drop":
        assert result.batch.rollout_ids == [group[0].id]
        assert (result.metrics.failed_rollouts, result.metrics.trained_rollouts) == (1, 1)
    else:
        assert result.batch.rollout_ids == [group[0].id, group[1].id]
        assert (result.metrics.failed_rollouts, result.metrics.trained_rollouts) == (0, 2)
    assert result.dropped == []


async def test_the_weight_sync_holds_calls_drains_registers_the_version_and_resumes(bench: Bench) -> None:
    daemon = AglLiteDaemon(bench.agents, config())
    async with daemon.weight_sync(["http://127.0.0.1:9/v1"], "step-7") as state:
        assert (state.paused, state.mode, state.in_flight) == (True, "hold", 0)
        assert [m.version for m in await bench.agents.models()] == []  # registered only after the block
    (model,) = await bench.agents.models()
    assert (model.name, model.endpoints, model.version) == (MODEL, ["http://127.0.0.1:9/v1"], "step-7")
    assert not (await bench.agents.gateway_state()).paused
    assert daemon.model_version == "step-7"


async def test_a_failed_weight_sync_leaves_the_registry_and_resumes(bench: Bench) -> None:
    daemon = AglLiteDaemon(bench.agents, config())
    with pytest.raises(RuntimeError, match="load failed"):
        async with daemon.weight_sync(["http://127.0.0.1:9/v1"], "step-8"):
            raise RuntimeError("load failed")
    assert await bench.agents.models() == []
    assert not (await bench.agents.gateway_state()).paused


# --- 256 rollouts: requests and memory ------------------------------------------------------------------------------


PROMPT_IDS = 600


class Finisher(AglLiteClient):
    """Runs every rollout it enqueues to its end at once, straight in the store: a big prompt per call, 2 calls."""

    def __init__(self, url: str, store: object, prompt_ids: int) -> None:
        super().__init__(url, ADMIN_KEY, retry=FAST)
        self.store = store
        self.prompt_ids = prompt_ids

    async def enqueue_group(self, inputs, **kwargs):  # type: ignore[no-untyped-def]
        groups = await super().enqueue_group(inputs, **kwargs)
        ids = [r.id for g in groups for r in g]
        await self.store.claim("bulk", len(ids))  # type: ignore[attr-defined]
        # all at once: the store's writer commits them in groups
        await asyncio.gather(*(self._finish(k, rid) for k, rid in enumerate(ids)))
        return groups

    async def _finish(self, k: int, rid: str) -> None:
        store = self.store
        attempt = await store.start_attempt(rid)  # type: ignore[attr-defined]
        prompt = array("I", range(k, k + self.prompt_ids))
        for turn in (1, 2):
            body = prompt if turn == 1 else prompt + array("I", [7, 8, 9])
            await store.add_call(  # type: ignore[attr-defined]
                LLMCall(
                    id=f"{rid}-{turn}",
                    order_key=turn,
                    outcome=CallOutcome.OK,
                    api="chat",
                    rollout_id=rid,
                    attempt_id=attempt.id,
                    status=200,
                    model=MODEL,
                    response_id=f"{rid}-{turn}",
                    prompt_token_ids=body,
                    choices=[ChoiceRecord(0, "x", [], "stop", array("I", [7, 8] if turn == 1 else [5]))],
                    complete=True,
                )
            )
        await store.add_events(rid, [EventSpec("reward", {"value": float(k % 2)})])  # type: ignore[attr-defined]
        await store.finish(rid, RolloutStatus.SUCCEEDED)  # type: ignore[attr-defined]


async def run_bulk(bench: Bench, samples: int, page_bytes: int) -> tuple[int, int, int]:
    """(requests, transient peak bytes, batch rows) of one step over `samples` × 4 rollouts."""
    finisher = Finisher(gateway_url(bench.gateway), store_of(bench.gateway), prompt_ids=PROMPT_IDS)
    daemon = AglLiteDaemon(
        finisher,
        config(n=4, page_size=64, triplet_page_bytes=page_bytes, max_prompt_length=16, max_response_length=8),
    )
    try:
        await daemon.step([Sample({"q": "warm"})])  # connections, caches, first-use allocations
        # The collector stays off inside the window: when a collection runs there (it depends on what earlier
        # tests left) is noise, not the step's memory.
        gc.collect()
        gc.disable()
        tracemalloc.start()
        try:
            result = await daemon.step([Sample({"q": i}) for i in range(samples)])
            current, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
            gc.enable()
    finally:
        await finisher.close()
    assert result.batch.size == samples * 4
    assert result.metrics.merge.merged_rows == samples * 4
    return result.metrics.store_requests, peak - current, result.batch.size


async def test_a_step_over_256_rollouts_makes_a_request_per_page_and_stays_flat(bench: Bench) -> None:
    page_bytes = 64 * 1024
    requests, transient_256, rows = await run_bulk(bench, 64, page_bytes)  # 64 samples × 4 = 256 rollouts
    # The least of three runs each: what a step holds, without a spike of the loop's own buffers (±400 KB, seen;
    # the gateway runs in this process).
    transient_256 = min([transient_256] + [(await run_bulk(bench, 64, page_bytes))[1] for _ in range(2)])
    wire = 256 * 2 * PROMPT_IDS * 5  # about the triplets' size on the wire: 2 calls of PROMPT_IDS ids each
    # enqueue + cursor head + ceil(256 / 64) cursor pages + the triplet pages, and nothing per rollout
    assert requests <= 2 + math.ceil(256 / 64) + math.ceil(wire / page_bytes) + 2
    assert requests < 256 / 4
    transient_64 = min([(await run_bulk(bench, 16, page_bytes))[1] for _ in range(3)])
    # Parsed, the triplets of all 256 rollouts would take about ten times their wire size (Python ints and lists);
    # a step holds one page at a time, so four times the rollouts is not four times the memory.
    assert transient_256 < wire
    assert transient_256 < 1.5 * transient_64 + 256 * 1024
    assert rows == 256
