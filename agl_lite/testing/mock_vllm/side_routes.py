"""The mock vLLM's side routes: /v1/models, /tokenize, /health and the /mock/* control surface for tests.

It owns those handlers and their wire shapes; it must not generate completions or keep state of its own.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

from aiohttp import web

from agl_lite.testing.mock_vllm.http_io import (
    ApiError,
    RecordedRequest,
    check_model,
    error_response,
    json_response,
    model_card,
    read_json,
)
from agl_lite.testing.mock_vllm.scenario import ErrorReply, Scenario, ScenarioQueue
from agl_lite.testing.mock_vllm.tokenizer import FakeTokenizer

__all__ = ["MockState", "add_side_routes"]


class MockState(Protocol):
    """What these routes read and change of the mock (`server.MockVLLM` is one): declared here, so that this
    module does not import the server that imports it."""

    @property
    def served_models(self) -> Sequence[str]: ...
    @property
    def max_model_len(self) -> int: ...
    @property
    def root(self) -> str | None: ...
    @property
    def tokenizer(self) -> FakeTokenizer: ...
    @property
    def scenarios(self) -> ScenarioQueue: ...
    @property
    def requests(self) -> list[RecordedRequest]: ...
    def record(self, entry: RecordedRequest) -> None: ...
    def enqueue(self, scenario: Scenario, *, match: str | None = None, times: int | None = 1) -> None: ...
    def clear_scenarios(self) -> None: ...
    def clear_requests(self) -> None: ...
    def stats(self) -> dict[str, int]: ...


async def _tokenize(mock: MockState, request: web.Request) -> web.Response:
    try:
        body = await read_json(request, mock.record)
        if "model" in body:
            check_model(mock.served_models, body)
        if isinstance(body.get("messages"), list):
            add_gen = body.get("add_generation_prompt", True) is not False
            tokens = mock.tokenizer.chat_prompt_ids(body["messages"], add_gen)
        elif isinstance(body.get("prompt"), str):
            tokens = mock.tokenizer.encode(body["prompt"])
        else:
            raise ApiError(400, "either prompt (string) or messages (list) is required", "prompt")
    except ApiError as exc:
        return error_response(exc.reply)
    strs = [mock.tokenizer.token_str(t) for t in tokens] if body.get("return_token_strs") else None
    return json_response(
        {"count": len(tokens), "max_model_len": mock.max_model_len, "tokens": tokens, "token_strs": strs}
    )


async def _post_scenarios(mock: MockState, request: web.Request) -> web.Response:
    try:
        data = await request.json()
        parsed = []
        for item in data if isinstance(data, list) else [data]:
            spec = dict(item)
            match, times = spec.pop("match", None), spec.pop("times", 1)
            parsed.append((Scenario.from_json(spec), match, times))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        return error_response(ErrorReply(400, f"bad scenario: {exc}"))
    for scenario, match, times in parsed:  # all or nothing: one bad item queues none
        mock.enqueue(scenario, match=match, times=times)
    return json_response({"queued": len(mock.scenarios)})


def add_side_routes(app: web.Application, mock: MockState) -> None:
    async def models(_request: web.Request) -> web.Response:
        created = int(time.time())
        return json_response(
            {
                "object": "list",
                "data": [
                    model_card(n, mock.root or n, mock.max_model_len, created) for n in mock.served_models
                ],
            }
        )

    async def tokenize(request: web.Request) -> web.Response:
        return await _tokenize(mock, request)

    async def health(_request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def post_scenarios(request: web.Request) -> web.Response:
        return await _post_scenarios(mock, request)

    async def clear_scenarios(_request: web.Request) -> web.Response:
        cleared = len(mock.scenarios)
        mock.clear_scenarios()
        return json_response({"cleared": cleared})

    async def get_requests(_request: web.Request) -> web.Response:
        return json_response([{"path": r.path, "headers": r.headers, "body": r.body} for r in mock.requests])

    async def clear_requests(_request: web.Request) -> web.Response:
        mock.clear_requests()
        return json_response({"cleared": True})

    async def stats(_request: web.Request) -> web.Response:
        return json_response(mock.stats())

    app.router.add_get("/v1/models", models)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_get("/health", health)
    app.router.add_post("/mock/scenarios", post_scenarios)
    app.router.add_delete("/mock/scenarios", clear_scenarios)
    app.router.add_get("/mock/requests", get_requests)
    app.router.add_delete("/mock/requests", clear_requests)
    app.router.add_get("/mock/stats", stats)
