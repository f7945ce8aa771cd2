"""The stream bench's upstream: vLLM-shaped chat streams whose text deltas carry the moment they were sent.

Raw asyncio, HTTP/1.1 keep-alive, one chunked-encoding chunk per SSE event, like `upstream.py`. What it answers
depends on the request's `user` field (which every gateway forwards untouched):

- `"user": "tick"`: the role event, then `TICK_EVENTS` text deltas `TICK_INTERVAL_S` apart, each written on its
  own and holding `time.monotonic_ns()` of its write as its text (the clock is the machine's, shared by the
  client), then the finish event, the usage event if asked for, and `[DONE]`;
- `"user": "hold"`: the role event, then nothing until the client goes away (an idle stream).

Run: `python stream_upstream.py --port N`.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from upstream import (
    CHAT_ID,
    CREATED,
    MODEL,
    MODELS,
    NOT_FOUND,
    PROMPT_IDS,
    SSE_HEAD,
    chunk,
    next_request,
    serve,
)

TICK_EVENTS = 40
TICK_INTERVAL_S = 0.010

_PREFIX = b'data: {"id":"%s","object":"chat.completion.chunk","created":%d,"model":"%s","choices":[' % (
    CHAT_ID.encode(),
    CREATED,
    MODEL.encode(),
)
_ROLE = (
    _PREFIX + b'{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],'
    b'"prompt_token_ids":[' + b",".join(b"%d" % i for i in PROMPT_IDS) + b'],"prompt_text":null}\n\n'
)
_TEXT = (
    _PREFIX
    + b'{"index":0,"delta":{"content":"%d"},"logprobs":null,"finish_reason":null,"token_ids":[%d]}]}\n\n'
)
_FINISH = (
    _PREFIX
    + b'{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":[2]}]}\n\n'
)
_USAGE = _PREFIX + (
    b'],"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}}\n\n'
    % (len(PROMPT_IDS), len(PROMPT_IDS) + TICK_EVENTS + 1, TICK_EVENTS + 1)
)
_DONE = b"data: [DONE]\n\n"


class StreamUpstream(asyncio.Protocol):
    """One connection: requests answered in order, one stream in flight at a time."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.busy:
            self._serve()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def _serve(self) -> None:
        while self.transport is not None and not self.busy:
            request = next_request(self.buf)
            if request is None:
                return
            head, body = request
            if head.startswith(b"get "):
                self.transport.write(MODELS)
            elif b'"user":"hold"' in body:
                self.busy = True  # nothing more on this connection: the client closes it
                self.transport.write(SSE_HEAD + chunk(_ROLE))
            elif b'"user":"tick"' in body:
                self.busy = True
                self.transport.write(SSE_HEAD + chunk(_ROLE))
                usage = b'"include_usage":true' in body
                asyncio.get_running_loop().call_later(TICK_INTERVAL_S, self._tick, 0, usage)
            else:
                self.transport.write(NOT_FOUND)

    def _tick(self, i: int, usage: bool) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if i < TICK_EVENTS:
            transport.write(chunk(_TEXT % (time.monotonic_ns(), 1000 + i)))
            asyncio.get_running_loop().call_later(TICK_INTERVAL_S, self._tick, i + 1, usage)
            return
        tail = chunk(_FINISH) + (chunk(_USAGE) if usage else b"") + chunk(_DONE) + b"0\r\n\r\n"
        transport.write(tail)
        self.busy = False
        if self.buf:
            self._serve()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    asyncio.run(serve(StreamUpstream, args.host, args.port))


if __name__ == "__main__":
    main()
