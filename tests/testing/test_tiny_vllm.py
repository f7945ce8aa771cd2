"""The tiny policy and its vLLM-shaped server: what the learning demo relies on, through the real `openai` SDK
(vLLM's field names and shapes, seeds, errors), the weight reload and its version log, and that the logprobs it
reports are the ones the trainer recomputes. Skipped only where torch is not installed (`make verl` does it)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

torch = pytest.importorskip("torch")

from agl_lite.testing.tiny_policy import (  # noqa: E402
    CharTokenizer,
    Request,
    TinyGPT,
    greedy_batch,
    load_policy,
    policy_bytes,
    sample,
    sample_batch,
    token_logprobs,
)
from agl_lite.testing.tiny_vllm import TinyVLLM, running_tiny  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "vllm-0.32-cpu"
MESSAGES: list[Any] = [{"role": "user", "content": "12+34="}]


def _model(seed: int = 0) -> TinyGPT:
    torch.manual_seed(seed)
    return TinyGPT().eval()


@pytest.fixture
async def served() -> AsyncIterator[tuple[TinyVLLM, str]]:
    server = TinyVLLM(_model(), served_model="tiny", version="v0")
    async with running_tiny(server) as url:
        yield server, url


def test_the_tokenizer_round_trips_text_and_renders_chatml() -> None:
    tok = CharTokenizer()
    assert tok.decode(tok.encode("47+85=132\n")) == "47+85=132\n"
    ids = tok.chat_prompt_ids(MESSAGES)
    assert (
        tok.decode(ids, skip_special_tokens=False)
        == "<|im_start|>user\n12+34=<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tok.encode("é") == tok.encode("?")  # outside its alphabet: never an error


def test_batched_sampling_is_what_each_request_samples_alone_and_its_logprobs_are_the_trainers() -> None:
    model, tok = _model(), CharTokenizer()
    short, long = tok.chat_prompt_ids([{"role": "user", "content": "1+2="}]), tok.chat_prompt_ids(MESSAGES)
    alone = sample(model, long, 6, generator=torch.Generator().manual_seed(5))
    together = sample_batch(
        model,
        [
            Request(short, 6, generator=torch.Generator().manual_seed(1)),
            Request(long, 6, generator=torch.Generator().manual_seed(5)),
        ],
    )[1]
    assert together.token_ids == alone.token_ids
    assert max(abs(a - b) for a, b in zip(alone.logprobs, together.logprobs, strict=True)) < 1e-5
    # The trainer's recomputation on the whole (left-padded) row, against the sampler's KV-cached steps.
    row = torch.tensor([[0, 0, *long, *alone.token_ids]])
    mask = torch.tensor([[0, 0] + [1] * (len(long) + len(alone.token_ids))])
    recomputed = token_logprobs(model, row, mask)[0, -len(alone.token_ids) :].tolist()
    assert max(abs(a - b) for a, b in zip(alone.logprobs, recomputed, strict=True)) < 1e-5
    greedy = sample(model, long, 6, temperature=0)
    assert greedy_batch(model, [short, long], 6)[1] == greedy.token_ids


def test_weights_survive_the_round_trip() -> None:
    model = _model(3)
    again = load_policy(policy_bytes(model))
    ids = torch.tensor([[1, 5, 6, 7]])
    assert torch.equal(model(ids), again(ids))


async def test_the_openai_sdk_reads_its_replies_as_vllms(served: tuple[TinyVLLM, str]) -> None:
    _server, url = served
    async with openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0) as sdk:
        whole = await sdk.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            max_tokens=5,
            n=2,
            logprobs=True,
            top_logprobs=2,
            seed=7,
            extra_body={"return_token_ids": True},
        )
        again = await sdk.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=5, n=2, seed=7, extra_body={"return_token_ids": True}
        )
        chunks = [
            c
            async for c in await sdk.chat.completions.create(
                model="tiny",
                messages=MESSAGES,
                max_tokens=4,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"return_token_ids": True},
            )
        ]
    body: dict[str, Any] = whole.model_dump()
    assert len(body["choices"]) == 2
    prompt = CharTokenizer().chat_prompt_ids(MESSAGES)
    assert body["prompt_token_ids"] == prompt
    for choice in body["choices"]:
        assert len(choice["token_ids"]) == len(choice["logprobs"]["content"]) <= 5
        assert all(len(e["top_logprobs"]) == 2 for e in choice["logprobs"]["content"])
    assert [c["token_ids"] for c in body["choices"]] == [c.token_ids for c in again.choices]  # type: ignore[attr-defined]
    assert whole.usage is not None
    assert whole.usage.prompt_tokens == len(prompt)
    streamed = [t for c in chunks for ch in c.choices for t in (getattr(ch, "token_ids", None) or [])]
    assert chunks[-1].usage is not None
    assert len(streamed) == chunks[-1].usage.completion_tokens


async def test_its_bodies_have_the_keys_of_a_real_vllms(served: tuple[TinyVLLM, str]) -> None:
    _server, url = served
    fixture = json.loads((FIXTURES / "chat-nonstream-n2-ids-logprobs.json").read_text())
    request = {
        "model": "tiny",
        "messages": MESSAGES,
        "max_tokens": 4,
        "n": 2,
        "logprobs": True,
        "top_logprobs": 2,
        "return_token_ids": True,
    }
    async with aiohttp.ClientSession() as http, http.post(f"{url}/chat/completions", json=request) as reply:
        body = await reply.json()
    assert list(body) == list(fixture)
    assert list(body["choices"][0]) == list(fixture["choices"][0])
    assert set(body["choices"][0]["message"]) == set(fixture["choices"][0]["message"])
    assert list(body["choices"][0]["logprobs"]["content"][0]) == list(
        fixture["choices"][0]["logprobs"]["content"][0]
    )
    assert list(body["usage"]) == list(fixture["usage"])


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ({"model": "other", "messages": MESSAGES}, 404, "does not exist"),
        ({"model": "tiny", "messages": MESSAGES, "max_tokens": 500}, 400, "max_model_len"),
        ({"model": "tiny", "messages": MESSAGES, "temperature": "hot"}, 400, "temperature"),
        ({"model": "tiny", "messages": "hi"}, 400, "messages"),
        ({"model": "tiny", "messages": MESSAGES, "n": 0}, 400, "n must be"),
    ],
)
async def test_bad_requests_get_vllms_error_bodies(
    served: tuple[TinyVLLM, str], body: dict[str, Any], status: int, says: str
) -> None:
    _server, url = served
    async with aiohttp.ClientSession() as http, http.post(f"{url}/chat/completions", json=body) as reply:
        assert reply.status == status
        error = (await reply.json())["error"]
    assert says in error["message"]
    assert error["code"] == status


async def test_new_weights_load_without_a_restart_and_every_reply_says_which_served_it(
    served: tuple[TinyVLLM, str], tmp_path: Path
) -> None:
    server, url = served
    base = url.removesuffix("/v1")
    weights = tmp_path / "w.pt"
    weights.write_bytes(policy_bytes(_model(9)))
    async with aiohttp.ClientSession() as http:
        request = {"model": "tiny", "messages": MESSAGES, "max_tokens": 3}
        async with http.post(f"{url}/chat/completions", json=request) as reply:
            first = await reply.json()
            assert reply.headers["x-weights-version"] == "v0"
        async with http.post(
            f"{base}/update_weights_from_disk", json={"model_path": str(weights), "version": "v1"}
        ) as r:
            assert (await r.json())["version"] == "v1"
        async with http.post(f"{url}/chat/completions", json=request) as reply:
            second = await reply.json()
            assert reply.headers["x-weights-version"] == "v1"
        async with http.get(f"{base}/weights_version") as r:
            assert await r.json() == {"version": "v1", "loads": 1}
        async with http.get(f"{base}/served_versions", params={"after": "1"}) as r:
            log = await r.json()
        async with http.post(
            f"{base}/update_weights_from_disk", json={"model_path": str(tmp_path / "no"), "version": "v2"}
        ) as r:
            assert r.status == 400
    assert log == {"served": [[second["id"], "v1", [second["usage"]["completion_tokens"]]]], "next": 2}
    assert first["id"] != second["id"]
    assert server.version == "v1"  # a file that does not load leaves the served weights as they were
