"""A minimal vLLM-shaped upstream for the gateway bench: raw asyncio, HTTP/1.1 keep-alive, pre-serialised answers.

It must never be the bottleneck, so it does almost nothing: split requests on Content-Length, look for
`"stream": true` in the body, and write bytes built once at start-up. Streams are chunked SSE (one chunk per
event) sent in `--stream-writes` writes, each on its own loop iteration, like tokens leaving a scheduler.
Run: `python upstream.py --port N`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from collections.abc import Callable
from typing import Any

MODEL = "bench"
# Ids and text shaped like the SmolLM2 answers in fixtures/vllm-0.32-cpu (the prompt ids are a real prompt's).
# fmt: off
PROMPT_IDS = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712,
              8182, 2, 198, 1, 4093, 198, 1780, 314, 216, 34, 27, 35, 47, 19842, 351, 260, 1230, 30, 2, 198, 1, 520,
              9531, 198]
WORDS = ["The", " number", " we", " want", " is", " ", "2", " +", " ", "3", ",", " which", " gives", " us", " ",
         "5", ".", " That", " is", " the", " final", " answer"]
TOKEN_IDS = [504, 1230, 392, 1277, 314, 216, 34, 1232, 216, 35, 28, 527, 3959, 550, 216, 37, 30, 1072, 314, 260, 1932,
             3037]
# fmt: on
CHAT_ID = "chatcmpl-869e265e3b2cae15"
CREATED = 1796056150


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def completion_body() -> bytes:
    """A non-streamed chat completion as vLLM 0.32 sends it with `return_token_ids` (top-level prompt ids)."""
    return _dumps(
        {
            "id": CHAT_ID,
            "object": "chat.completion",
            "created": CREATED,
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": "".join(WORDS),
                        "refusal": None,
                        "annotations": None,
                        "audio": None,
                        "function_call": None,
                        "tool_calls": [],
                        "reasoning": None,
                    },
                    "logprobs": None,
                    "finish_reason": "stop",
                    "stop_reason": None,
                    "token_ids": [*TOKEN_IDS, 2],
                    "routed_experts": None,
                }
            ],
            "service_tier": None,
            "system_fingerprint": "vllm-0.32.0-c0a109bf",
            "usage": {
                "prompt_tokens": len(PROMPT_IDS),
                "total_tokens": len(PROMPT_IDS) + len(TOKEN_IDS) + 1,
                "completion_tokens": len(TOKEN_IDS) + 1,
                "prompt_tokens_details": None,
            },
            "prompt_logprobs": None,
            "prompt_token_ids": PROMPT_IDS,
            "prompt_text": None,
            "kv_transfer_params": None,
        }
    )


def stream_events() -> list[bytes]:
    """The SSE events of a streamed chat completion (24 chunks + `[DONE]`), shaped like vLLM 0.32's."""
    head = {"id": CHAT_ID, "object": "chat.completion.chunk", "created": CREATED, "model": MODEL}
    chunks: list[dict[str, Any]] = [
        {
            **head,
            "choices": [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
            "prompt_token_ids": PROMPT_IDS,
            "prompt_text": None,
        }
    ]
    for word, tid in zip(WORDS, TOKEN_IDS, strict=True):
        chunks.append(
            {
                **head,
                "choices": [
                    {
                        "index": 0,
                        "delta": {"content": word},
                        "logprobs": None,
                        "finish_reason": None,
                        "token_ids": [tid],
                    }
                ],
            }
        )
    chunks.append(
        {
            **head,
            "choices": [
                {
                    "index": 0,
                    "delta": {},
                    "logprobs": None,
                    "finish_reason": "stop",
                    "stop_reason": None,
                    "token_ids": [2],
                }
            ],
        }
    )
    return [b"data: " + _dumps(c) + b"\n\n" for c in chunks] + [b"data: [DONE]\n\n"]


def _head(status: str, ctype: str, extra: str) -> bytes:
    return f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n{extra}\r\n".encode()


PLAIN = (
    _head("200 OK", "application/json", f"Content-Length: {len(completion_body())}\r\n") + completion_body()
)
_MODELS_BODY = _dumps({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "bench"}]})
MODELS = _head("200 OK", "application/json", f"Content-Length: {len(_MODELS_BODY)}\r\n") + _MODELS_BODY
_NOT_FOUND_BODY = b'{"error":{"message":"not found","type":"NotFoundError","code":404}}'
NOT_FOUND = (
    _head("404 Not Found", "application/json", f"Content-Length: {len(_NOT_FOUND_BODY)}\r\n")
    + _NOT_FOUND_BODY
)


SSE_HEAD = _head("200 OK", "text/event-stream", "Transfer-Encoding: chunked\r\nCache-Control: no-cache\r\n")
"""The head of a streamed answer: chunked, one chunk per SSE event."""


def chunk(event: bytes) -> bytes:
    """One chunked-encoding chunk."""
    return b"%x\r\n%s\r\n" % (len(event), event)


def stream_writes(n: int) -> list[bytes]:
    """The stream as `n` writes of whole SSE events, one chunked-encoding chunk per event; the headers ride with
    the first write, the terminating chunk with the last."""
    events = [chunk(ev) for ev in stream_events()]
    n = max(1, min(n, len(events)))
    writes = [b"".join(events[i * len(events) // n : (i + 1) * len(events) // n]) for i in range(n)]
    writes[0] = SSE_HEAD + writes[0]
    writes[-1] += b"0\r\n\r\n"
    return writes


STREAM_EVENTS = len(stream_events())


def next_request(buf: bytearray) -> tuple[bytes, bytes] | None:
    """Take the first whole request out of `buf`: (its head, lower-cased; its body), or None until it is whole."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = bytes(buf[:end]).lower()
    length = 0
    i = head.find(b"\r\ncontent-length:")
    if i >= 0:
        j = head.find(b"\r\n", i + 2)
        length = int(head[i + 17 : j if j >= 0 else len(head)])
    if len(buf) < end + 4 + length:
        return None
    body = bytes(buf[end + 4 : end + 4 + length])
    del buf[: end + 4 + length]
    return head, body


class BenchUpstream(asyncio.Protocol):
    """One connection: keep-alive, requests answered in order, one stream in flight at a time."""

    def __init__(self, stream: list[bytes]) -> None:
        self.stream = stream
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.streaming = False
        self.close_after = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.streaming:
            self._serve()

    def _serve(self) -> None:
        transport = self.transport
        while transport is not None and not transport.is_closing():
            request = next_request(self.buf)
            if request is None:
                return
            head, body = request
            self.close_after = b"\r\nconnection: close" in head
            if head.startswith(b"post ") and b"/chat/completions" in head[: head.find(b"\r\n")]:
                if b'"stream":true' in body or b'"stream": true' in body:
                    self.streaming = True
                    self._emit(0)
                    return
                transport.write(PLAIN)
            elif head.startswith(b"get "):
                transport.write(MODELS)  # /v1/models, /health and friends: enough for readiness probes
            else:
                transport.write(NOT_FOUND)
            if self.close_after:
                transport.close()

    def _emit(self, i: int) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        transport.write(self.stream[i])
        if i + 1 < len(self.stream):
            asyncio.get_running_loop().call_soon(self._emit, i + 1)
            return
        self.streaming = False
        if self.close_after:
            transport.close()
        elif self.buf:
            self._serve()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


async def serve(factory: Callable[[], asyncio.Protocol], host: str, port: int) -> None:
    """Serve connections with `factory`'s protocol until SIGINT or SIGTERM."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(factory, host, port, backlog=4096, reuse_address=True)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--stream-writes",
        type=int,
        default=8,
        help=f"Writes per streamed answer (1-{STREAM_EVENTS}, each on its own loop iteration).",
    )
    args = parser.parse_args()
    stream = stream_writes(args.stream_writes)
    asyncio.run(serve(lambda: BenchUpstream(stream), args.host, args.port))


if __name__ == "__main__":
    main()
