"""A vLLM-shaped server in front of a real policy (`tiny_policy`): what agl-lite relies on of vLLM, for real
sampling from weights that training changes, on CPU.

It speaks vLLM 0.32's chat completions (streamed and not) through the mock's own wire code (`mock_vllm.wire`,
`mock_vllm.http_io`): `return_token_ids` (`prompt_token_ids`, `choices[].token_ids`), `logprobs`/`top_logprobs`, `n`,
`temperature`, `seed`, `max_tokens`, usage, the chat template applied server-side, and vLLM's error bodies. Beyond
vLLM it loads new weights without a restart and says which weights served each reply:

- `POST /update_weights_from_disk` `{"model_path": FILE, "version": NAME}` (SGLang's name for it): the file is a
  `tiny_policy.policy_bytes` payload; the swap happens between two requests, never inside one;
- `GET /weights_version` → `{"version": NAME, "loads": N}`;
- `GET /served_versions?after=N` → `{"served": [[response_id, version, [tokens per choice]], ...], "next": M}`,
  the replies after the N-th (the most recent ones are kept, bounded): how the learning demo checks that no call
  is stamped with another version than the one that served it, and that the batch trains exactly the tokens that
  were sampled;
- every reply carries the header `x-weights-version`.

Requests that arrive together are sampled together (`sample_batch`: one forward of the whole batch per token, with
a KV cache), on the event loop: at this size a batch takes milliseconds, and a batch is one weights version, read
once when it starts, so a reply is never torn between two versions.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from typing import Any

import torch
from aiohttp import web

from agl_lite.testing.mock_vllm.generate import ChoiceOutput
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
    model_card,
    read_json,
)
from agl_lite.testing.mock_vllm.scenario import ErrorReply
from agl_lite.testing.mock_vllm.wire import Envelope, chat_body, chat_frames
from agl_lite.testing.tiny_policy import (
    SPECIAL_IDS,
    CharTokenizer,
    Request,
    Sampled,
    TinyGPT,
    load_policy,
    sample_batch,
)

__all__ = ["TinyVLLM", "create_app", "main", "running_tiny"]

_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
SERVED_LOG = 200_000
MAX_BATCH = 64


class TinyVLLM:
    """The server's state: the policy, its version, and which version served which reply."""

    def __init__(self, model: TinyGPT, *, served_model: str = "tiny", version: str = "initial") -> None:
        self.model = model
        self.served_model = served_model
        self.version = version
        self.loads = 0
        self.tokenizer = CharTokenizer()
        self.served: deque[tuple[int, str, str, list[int]]] = deque(maxlen=SERVED_LOG)
        """(number, response id, weights version, tokens sampled per choice) of the latest replies."""
        self.served_total = 0
        self.requests_total = 0
        self.batches = 0
        self._log: deque[RecordedRequest] = deque(maxlen=64)
        self._queue: list[tuple[list[Request], asyncio.Future[tuple[list[Sampled], str]]]] = []
        self._wake: asyncio.Event | None = None
        self._batcher: asyncio.Task[None] | None = None

    @property
    def max_model_len(self) -> int:
        return int(self.model.cfg.max_len)

    def swap(self, model: TinyGPT, version: str) -> None:
        """Serve `model` from the next request on (the event loop runs one request at a time)."""
        self.model, self.version = model, version
        self.loads += 1

    # --- generation ------------------------------------------------------------------------------------------

    def _request(self, prompt: Sequence[int], index: int, body: dict[str, Any], seed: int | None) -> Request:
        params = gen_params(body, prompt, "chat", max_model_len=self.max_model_len)
        temperature = body.get("temperature", 1.0)
        if isinstance(temperature, bool) or not isinstance(temperature, int | float) or temperature < 0:
            raise ApiError(
                400, f"temperature must be a non-negative number, got {temperature!r}", "temperature"
            )
        generator = torch.Generator().manual_seed(
            secrets.randbits(63) if seed is None else (seed * 1_000_003 + index) % 2**63
        )
        return Request(
            prompt, params.max_tokens, float(temperature), params.top_k if params.logprobs else 0, generator
        )

    def _choice(self, s: Sampled, index: int) -> ChoiceOutput:
        tok = self.tokenizer
        # vLLM's text skips special tokens; its logprobs name them.
        texts = ["" if t < SPECIAL_IDS else tok.token_str(t) for t in s.token_ids]
        return ChoiceOutput(
            index=index,
            token_ids=s.token_ids,
            texts=texts,
            token_strs=[tok.token_str(t) for t in s.token_ids],
            text="".join(texts),
            finish_reason=s.finish_reason,
            stop_reason=None,
            logprobs=s.logprobs,
            alternates=[
                [(tok.token_str(t), lp) for t, lp in step if t != tid]
                for step, tid in zip(s.alternates, s.token_ids, strict=True)
            ],
        )

    async def _sample(self, requests: list[Request]) -> tuple[list[Sampled], str]:
        fut: asyncio.Future[tuple[list[Sampled], str]] = asyncio.get_running_loop().create_future()
        self._queue.append((requests, fut))
        if self._wake is None:
            self._wake = asyncio.Event()
            self._batcher = asyncio.ensure_future(self._run_batches(self._wake))
        self._wake.set()
        return await fut

    async def _run_batches(self, wake: asyncio.Event) -> None:
        while True:
            await wake.wait()
            wake.clear()
            jobs, self._queue = self._queue, []
            model, version = self.model, self.version  # one version for the whole batch
            flat = [r for requests, _ in jobs for r in requests]
            try:
                results = [
                    x
                    for i in range(0, len(flat), MAX_BATCH)
                    for x in sample_batch(model, flat[i : i + MAX_BATCH])
                ]
            except Exception as exc:  # a bug must fail its requests, not hang them
                for _, fut in jobs:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            self.batches += 1
            at = 0
            for requests, fut in jobs:
                if not fut.done():
                    fut.set_result((results[at : at + len(requests)], version))
                at += len(requests)
            await asyncio.sleep(0)  # let the requests that came meanwhile queue up

    async def close(self) -> None:
        if self._batcher is not None:
            self._batcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._batcher

    async def handle_chat(self, request: web.Request) -> web.StreamResponse:
        self.requests_total += 1
        try:
            body = await read_json(request, self._log.append)
            model = check_model([self.served_model], body)
            n = choice_count(body)
            messages, add_gen = chat_messages(body)
            seed = int_field(body, "seed", None)
            prompt = self.tokenizer.chat_prompt_ids(messages, add_gen)
            requests = [self._request(prompt, j, body, seed) for j in range(n)]
        except ApiError as exc:
            return error_response(exc.reply)
        sampled, version = await self._sample(requests)
        outs = [self._choice(x, j) for j, x in enumerate(sampled)]
        env = Envelope(
            id=f"chatcmpl-{secrets.token_hex(8)}",
            created=int(time.time()),
            model=model,
            fingerprint=f"tiny-{version}",
            prompt_ids=prompt,
            return_ids=bool(body.get("return_token_ids")),
            logprobs=bool(body.get("logprobs")),
            top_k=int_field(body, "top_logprobs", 0) or 0,
        )
        self.served_total += 1
        self.served.append((self.served_total, env.id, version, [len(o.token_ids) for o in outs]))
        headers = {"x-weights-version": version}
        if not body.get("stream"):
            resp = json_response(chat_body(env, outs))
            resp.headers.update(headers)
            return resp
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        stream = web.StreamResponse(status=200, headers=_SSE_HEADERS | headers)
        await stream.prepare(request)
        for data in chat_frames(env, outs, usage):
            await stream.write(data)
        await stream.write_eof()
        return stream

    # --- weights ---------------------------------------------------------------------------------------------

    async def handle_update(self, request: web.Request) -> web.Response:
        try:
            body = await read_json(request, self._log.append)
            path, version = body.get("model_path"), body.get("version")
            if not isinstance(path, str) or not isinstance(version, str) or not version:
                raise ApiError(400, "model_path and version (strings) are required", "model_path")
            try:
                model = await asyncio.to_thread(load_policy, path)
            except (OSError, RuntimeError, KeyError, TypeError, ValueError) as exc:
                raise ApiError(400, f"cannot load weights from {path}: {exc}", "model_path") from None
        except ApiError as exc:
            return error_response(exc.reply)
        self.swap(model, version)
        return json_response({"success": True, "version": version, "loads": self.loads})

    async def handle_version(self, _request: web.Request) -> web.Response:
        return json_response({"version": self.version, "loads": self.loads})

    async def handle_served(self, request: web.Request) -> web.Response:
        try:
            after = int(request.query.get("after", "0"))
        except ValueError:
            return error_response(ErrorReply(400, "after must be an integer", "after"))
        rows = [[rid, version, counts] for n, rid, version, counts in self.served if n > after]
        return json_response({"served": rows, "next": self.served_total})

    async def handle_models(self, _request: web.Request) -> web.Response:
        card = model_card(self.served_model, self.served_model, self.max_model_len, int(time.time()))
        return json_response({"object": "list", "data": [card]})


async def _not_found(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except web.HTTPNotFound:
        return error_response(ErrorReply(404, "Not Found"))
    except web.HTTPMethodNotAllowed:
        return error_response(ErrorReply(405, "Method Not Allowed"))


def create_app(server: TinyVLLM) -> web.Application:
    app = web.Application(middlewares=[web.middleware(_not_found)])

    async def stop_batches(_app: web.Application) -> None:
        await server.close()

    app.on_cleanup.append(stop_batches)
    app.router.add_post("/v1/chat/completions", server.handle_chat)
    app.router.add_get("/v1/models", server.handle_models)
    app.router.add_get("/health", _ok)
    app.router.add_post("/update_weights_from_disk", server.handle_update)
    app.router.add_get("/weights_version", server.handle_version)
    app.router.add_get("/served_versions", server.handle_served)
    return app


async def _ok(_request: web.Request) -> web.Response:
    return web.Response(status=200)


@contextlib.asynccontextmanager
async def running_tiny(server: TinyVLLM, port: int = 0) -> AsyncIterator[str]:
    """Serve `server` on loopback until the block ends; yields the base URL (`http://127.0.0.1:PORT/v1`)."""
    runner = web.AppRunner(create_app(server), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", port).start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    finally:
        await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m agl_lite.testing.tiny_vllm --weights FILE [--port N] [--model NAME] [--version NAME]`."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--weights", required=True, help="a tiny_policy.policy_bytes file")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model", default="tiny", help="the served model name")
    parser.add_argument("--version", default="initial", help="the name of the weights' version")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    server = TinyVLLM(load_policy(args.weights), served_model=args.model, version=args.version)
    web.run_app(create_app(server), host=args.host, port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
