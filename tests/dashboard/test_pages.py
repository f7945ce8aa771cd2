"""The dashboard's pages' data: a rollout's calls merged into the rows a trainer sees, each token trained or
context by the response mask; the list's keyset pages; everything rendered escaped."""

from __future__ import annotations

from array import array

from agl_lite.dashboard import pages
from agl_lite.integrations.trajectory import Row
from agl_lite.store.memory import MemoryStore
from agl_lite.store.records import RolloutStatus
from agl_lite.store.rules import RolloutFilter, RolloutSpec
from tests.client.conftest import make_call, running


def test_token_cells_follow_the_response_mask_and_shade_by_logprob() -> None:
    row = Row(
        prompt_ids=array("I", [1, 2]),
        response_ids=array("I", [10, 11, 5, 12]),
        response_mask=array("b", [1, 1, 0, 1]),
        logprobs=array("f", [-0.01, -3.0, 0.0, -0.7]),
        spans=[],
        model_version="v1",
    )
    cells = pages.token_cells(row)
    assert [(c.id, c.trained) for c in cells] == [
        (1, False),
        (2, False),
        (10, True),
        (11, True),
        (5, False),
        (12, True),
    ]
    assert [c.shade for c in cells] == ["", "", "lp0", "lp4", "", "lp2"]
    assert "logprob -3.000" in cells[3].title


async def test_a_multi_turn_rollout_renders_one_row_with_its_masked_tokens() -> None:
    store = MemoryStore()
    await running(store, "r")
    prompt = [1, 2, 3]
    first = make_call("r", "a1", 0, prompt, [[10, 11]])
    second = make_call("r", "a1", 1, [*prompt, 10, 11, 7, 8], [[12, 13, 14]])  # observation 7, 8, then more
    for c in (first, second):
        await store.add_call(c)
    await store.finish("r", RolloutStatus.SUCCEEDED)
    context = await pages.rollout_page(store, "r")
    assert context["tokens"] == sum(sum(c.tokens()) for c in (first, second))
    (row,) = context["trajectory"].rows
    assert sum(not c.trained for c in row) == 3 + 2  # the prompt and the observation
    assert sum(c.trained for c in row) == 2 + 3  # both completions
    html = pages.render("rollout.html", csrf="t", **context).decode()
    rows = html[html.index('<section class="row"') : html.index("<h2>Calls")]
    assert rows.count('class="tok trained') == 5
    assert rows.count('class="tok ctx') == 5


async def test_the_list_pages_by_enqueue_order_and_points_at_the_cursor_head() -> None:
    store = MemoryStore()
    await store.enqueue([RolloutSpec({"q": i}, id=f"r{i:03d}") for i in range(pages.PAGE_SIZE + 5)])
    first = await pages.rollouts_page(store, RolloutFilter(limit=pages.PAGE_SIZE), {})
    assert len(first["rollouts"]) == pages.PAGE_SIZE
    rest = await pages.rollouts_page(store, RolloutFilter(after=first["next"], limit=pages.PAGE_SIZE), {})
    assert [r.id for r in rest["rollouts"]] == [
        f"r{i:03d}" for i in range(pages.PAGE_SIZE, pages.PAGE_SIZE + 5)
    ]
    assert rest["next"] is None
    assert first["cursor"] == 0  # nothing ended yet


async def test_the_training_page_draws_one_point_per_version_known_metrics_first() -> None:
    store = MemoryStore()
    for k in range(4):
        value = {
            "iteration": k,
            "version": f"v{k}",
            "throughput": 10.0 + k,
            "mean_reward": 0.2 * k,
            "ok": True,
        }
        await store.put_resource(pages.TRAINING_RESOURCE, value)
    await store.put_resource(pages.TRAINING_RESOURCE, "not a dict: left out")
    context = await pages.training_page(store, pages.TRAINING_RESOURCE)
    assert context["keys"] == [
        "mean_reward",
        "throughput",
    ]  # known first; booleans and iteration are no metric
    reward = context["charts"][0]
    assert reward.title == "Mean reward"
    assert [p.label for p in reward.points] == ["v0: 0", "v1: 0.2", "v2: 0.4", "v3: 0.6"]
    html = pages.render("training.html", csrf="t", **context).decode()
    assert html.count('<circle class="pt"') == 2 * 4
    assert (await pages.training_page(store, "nothing"))["charts"] == []
