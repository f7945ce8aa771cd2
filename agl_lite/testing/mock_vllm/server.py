"""A scriptable mock of vLLM 0.32's OpenAI-compatible server (aiohttp), wire-compatible with the real captures.

It owns the mock's state, the generation endpoints, scenario selection, fault injection and connection
accounting; it must not import the gateway or anything outside agl_lite.testing, so tests can pit one against it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from aiohttp import web

from agl_lite.testing.mock_vllm.generate import ChoiceOutput, GenParams, generate_choice
from agl_lite.testing.mock_vllm.http_io import (
    ApiError,
    RecordedRequest,
    chat_messages,
    check_model,
    choice_count,
    error_response,
    gen_params,
    int_field,
    json_response,
    read_json,
)
from agl_lite.testing.mock_vllm.scenario import (
    ErrorReply,
    RequestPredicate,
    Scenario,
    ScenarioHook,
    ScenarioQueue,
)
from agl_lite.testing.mock_vllm.side_routes import add_side_routes
from agl_lite.testing.mock_vllm.tokenizer import FakeTokenizer
from agl_lite.testing.mock_vllm.wire import (
    DONE_FRAME,
    Envelope,
    chat_body,
    chat_frames,
    completion_body,
    completion_frames,
    frame,
)

__all__ = ["MockVLLM", "RecordedRequest", "create_app", "running_mock", "serve"]

_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
_PEER_POLL_S = 0.02


class MockVLLM:
    """State of one mock server: model names, seed, scenario queue, request log and live counters."""

    def __init__(
        self,
        served_models: Sequence[str] = ("smollm2",),
        *,
        seed: int = 0,
        max_model_len: int = 2048,
        root: str | None = None,
        hook: ScenarioHook | None = None,
        request_log_size: int = 256,
    ) -> None:
        self.served_models = tuple(served_models)
        self.seed = seed
        self.max_model_len = max_model_len
        self.root = root
        self.hook = hook
        """Asked for a scenario when no queued one matches; returning None means the default reply."""
        self.tokenizer = FakeTokenizer()
        self.fingerprint = "vllm-0.32.0-" + hashlib.blake2b(str(seed).encode(), digest_size=4).hexdigest()
        self.scenarios = ScenarioQueue()
        self._log: deque[RecordedRequest] = deque(maxlen=request_log_size)
        self.requests_total = 0
        self.in_flight = 0
        self.open_streams = 0
        self.stalled_streams = 0
        self.peer_disconnects = 0
        self.chunks_sent = 0
        self._tick = asyncio.Event()
        self._stopping = asyncio.Event()

    # -- scripting -------------------------------------------------------------------------------------------

    def enqueue(
        self,
        scenario: Scenario,
        *,
        match: str | None = None,
        when: RequestPredicate | None = None,
        times: int | None = 1,
    ) -> None:
        """Serve the next `times` (None: all) generation requests that match with `scenario`, in FIFO order."""
        self.scenarios.add(scenario, match=match, when=when, times=times)

    def clear_scenarios(self) -> None:
        self.scenarios.clear()

    @property
    def requests(self) -> list[RecordedRequest]:
        return list(self._log)

    def record(self, entry: RecordedRequest) -> None:
        """Log a received API request (the server calls this; tests may too, to fake traffic)."""
        self._log.append(entry)

    def clear_requests(self) -> None:
        self._log.clear()

    def stats(self) -> dict[str, int]:
        return {
            "requests_total": self.requests_total,
            "in_flight": self.in_flight,
            "open_streams": self.open_streams,
            "stalled_streams": self.stalled_streams,
            "peer_disconnects": self.peer_disconnects,
            "chunks_sent": self.chunks_sent,
            "queued_scenarios": len(self.scenarios),
        }

    async def wait_until(self, predicate: Callable[[MockVLLM], bool], timeout: float = 5.0) -> None:
        """Return once `predicate(self)` holds; it is re-checked whenever a counter changes."""
        async with asyncio.timeout(timeout):
            while not predicate(self):
                await self._tick.wait()

    async def wait_streams_closed(self, timeout: float = 5.0) -> None:
        await self.wait_until(lambda m: m.open_streams == 0, timeout)

    # -- internals -------------------------------------------------------------------------------------------

    def _changed(self) -> None:
        # Swap in a fresh event so waiters wake once and then wait for the next change.
        tick, self._tick = self._tick, asyncio.Event()
        tick.set()

    async def _on_startup(self, _app: web.Application) -> None:
        # Events bind to the loop that first waits on them; a fresh pair per app start keeps reuse safe.
        self._tick, self._stopping = asyncio.Event(), asyncio.Event()

    async def _on_shutdown(self, _app: web.Application) -> None:
        self._stopping.set()  # wakes stalls and delays so graceful shutdown does not wait on them

    async def _pause(self, seconds: float) -> None:
        if seconds > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), seconds)

    def _pick(self, body: dict[str, Any]) -> Scenario | None:
        scenario = self.scenarios.take(body)
        if scenario is None and self.hook is not None:
            scenario = self.hook(body)
        return scenario

    def _gen_params(self, body: dict[str, Any], prompt_ids: Sequence[int], endpoint: str) -> GenParams:
        return gen_params(body, prompt_ids, endpoint, max_model_len=self.max_model_len, seed=self.seed)

    def _envelope(self, prefix: str, model: str, prompt_ids: Sequence[int], body: dict[str, Any]) -> Envelope:
        params_lp = body.get("logprobs")
        return Envelope(
            id=f"{prefix}-{secrets.token_hex(8)}",
            created=int(time.time()),
            model=model,
            fingerprint=self.fingerprint,
            prompt_ids=prompt_ids,
            return_ids=bool(body.get("return_token_ids")),
            logprobs=bool(params_lp) or (prefix == "cmpl" and params_lp is not None),
            top_k=int_field(body, "top_logprobs", 0) or 0,
        )

    def _completion_prompts(self, body: dict[str, Any]) -> list[list[int]]:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return [self.tokenizer.encode(prompt)]
        if isinstance(prompt, list) and prompt and all(isinstance(p, int) for p in prompt):
            return [list(prompt)]
        if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            return [self.tokenizer.encode(p) for p in prompt]
        if isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
            return [[int(t) for t in p] for p in prompt]
        raise ApiError(400, "prompt must be a string, a list of strings or a list of token ids", "prompt")

    # -- handlers --------------------------------------------------------------------------------------------

    async def handle_chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve_generation(request, "chat")

    async def handle_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve_generation(request, "completions")

    async def _serve_generation(self, request: web.Request, endpoint: str) -> web.StreamResponse:
        self.requests_total += 1
        self.in_flight += 1
        self._changed()
        try:
            return await self._generation(request, endpoint)
        except ApiError as exc:
            return error_response(exc.reply)
        except asyncio.CancelledError:
            # With handler_cancellation on, this is how aiohttp tells us the peer went away.
            self.peer_disconnects += 1
            raise
        finally:
            self.in_flight -= 1
            self._changed()

    async def _generation(self, request: web.Request, endpoint: str) -> web.StreamResponse:
        body = await read_json(request, self.record)
        model = check_model(self.served_models, body)
        n = choice_count(body)
        if endpoint == "chat":
            messages, add_gen = chat_messages(body)
            prompts = [self.tokenizer.chat_prompt_ids(messages, add_gen)]
        else:
            prompts = self._completion_prompts(body)
        params = [self._gen_params(body, p, endpoint) for p in prompts]
        scenario = self._pick(body)
        if scenario is not None:
            await self._pause(scenario.latency_s)
            if scenario.error is not None:
                return error_response(scenario.error)
        outs: list[ChoiceOutput] = []
        for p_index, p in enumerate(params):
            for j in range(n):
                out = generate_choice(self.tokenizer, p, j, scenario, body)
                out.index = p_index * n + j
                outs.append(out)
        flat_prompts = [list(p.prompt_ids) for p in params for _ in range(n)]
        env = self._envelope("chatcmpl" if endpoint == "chat" else "cmpl", model, prompts[0], body)
        if not body.get("stream"):
            return await self._reply_whole(request, env, outs, flat_prompts, scenario, endpoint)
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        if endpoint == "chat":
            frames = chat_frames(env, outs, usage)
        else:
            frames = completion_frames(env, outs, flat_prompts, usage)
        return await self._stream(request, frames, scenario)

    async def _reply_whole(
        self,
        request: web.Request,
        env: Envelope,
        outs: list[ChoiceOutput],
        prompts: list[list[int]],
        scenario: Scenario | None,
        endpoint: str,
    ) -> web.StreamResponse:
        if scenario is not None:
            await self._pause(scenario.ttft_s)
            if scenario.reset_after is not None:
                return self._reset(request)
            if scenario.stall_after is not None:
                await self._stall(request)
                return web.Response(status=500)
            if scenario.error_frame_after is not None:
                return error_response(ErrorReply(500, scenario.error_frame_message))
        body = chat_body(env, outs) if endpoint == "chat" else completion_body(env, outs, prompts)
        return json_response(body)

    def _reset(self, request: web.Request) -> web.Response:
        if request.transport is not None:
            request.transport.abort()
        return web.Response(status=500)  # never sent: the connection is gone

    async def _stall(self, request: web.Request) -> None:
        self.stalled_streams += 1
        self._changed()
        try:
            # Handler cancellation ends this sooner where enabled; polling covers runners that leave it off.
            while not self._stopping.is_set():
                transport = request.transport
                if transport is None or transport.is_closing():
                    self.peer_disconnects += 1
                    break
                await self._pause(_PEER_POLL_S)
        finally:
            self.stalled_streams -= 1
            self._changed()

    async def _stream(
        self, request: web.Request, frames: list[bytes], sc: Scenario | None
    ) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers=_SSE_HEADERS)
        await resp.prepare(request)
        self.open_streams += 1
        self._changed()
        try:
            if sc is not None:
                await self._pause(sc.ttft_s)
            for i, data in enumerate(frames):
                if sc is not None:
                    if sc.reset_after == i:
                        self._reset(request)
                        return resp
                    if sc.stall_after == i:
                        await self._stall(request)
                        return resp
                    if sc.error_frame_after == i:
                        err = ErrorReply(500, sc.error_frame_message).to_body()
                        await resp.write(frame(err) + DONE_FRAME)
                        return resp
                    if i:
                        await self._pause(sc.chunk_delay_s)
                await resp.write(data)
                self.chunks_sent += 1
                self._changed()
        except ConnectionError:
            self.peer_disconnects += 1
        finally:
            self.open_streams -= 1
            self._changed()
        return resp


def create_app(mock: MockVLLM) -> web.Application:
    """The aiohttp app; run it with handler_cancellation=True so a vanished peer ends its handler at once."""
    app = web.Application()
    app.on_startup.append(mock._on_startup)
    app.on_shutdown.append(mock._on_shutdown)
    app.router.add_post("/v1/chat/completions", mock.handle_chat)
    app.router.add_post("/v1/completions", mock.handle_completions)
    add_side_routes(app, mock)
    return app


@contextlib.asynccontextmanager
async def running_mock(mock: MockVLLM, *, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
    """Serve `mock` until the block ends; yields the base URL ("http://127.0.0.1:PORT/v1")."""
    runner = web.AppRunner(create_app(mock), handler_cancellation=True, shutdown_timeout=2.0, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound_port = runner.addresses[0][1]
        yield f"http://{host}:{bound_port}/v1"
    finally:
        await runner.cleanup()


def serve(
    host: str,
    port: int,
    *,
    seed: int = 0,
    models: Sequence[str] = ("smollm2",),
    max_model_len: int = 2048,
    hook: ScenarioHook | None = None,
    print_fn: Callable[..., None] | None = print,
) -> None:
    """Serve a fresh mock until interrupted (the `agl-lite mock-llm` command)."""
    mock = MockVLLM(tuple(models), seed=seed, max_model_len=max_model_len, hook=hook)
    web.run_app(
        create_app(mock),
        host=host,
        port=port,
        handler_cancellation=True,
        shutdown_timeout=2.0,
        print=print_fn,
    )
