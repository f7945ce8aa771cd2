"""Transforms from the upstream's chat completions response to what an Anthropic client is owed.

`StreamTranslator` re-encodes an event stream event by event (only an unfinished upstream event waits for its
bytes) and owes `message_delta` + `message_stop` until `flush()`, which the core calls before `response_end`: so the
client sees the end of its message only after the record was committed, as an OpenAI client sees `[DONE]`.
A whole body is converted at its end by `message_body` or `token_count_body` in a `core.flow.WholeBody`.
"""

from __future__ import annotations

from typing import Any

import orjson

from agl_lite.capture.client_view import ClientView
from agl_lite.core.flow import BodyRefused
from agl_lite.core.jsoncodec import loads_or_none
from agl_lite.errors import HttpError
from agl_lite.translate.anthropic.errors import error_event, error_status, reshape_error
from agl_lite.translate.anthropic.message import MessageBuilder
from agl_lite.translate.chunks import ChatChunks

__all__ = ["StreamTranslator", "message_body", "token_count_body"]


class StreamTranslator:
    """Transform: a chat completions event stream in (choice 0), the Anthropic event stream out."""

    __slots__ = ("_builder", "_chunks", "_done", "_ids", "_usage", "_view")

    def __init__(self, builder: MessageBuilder, view: ClientView) -> None:
        self._builder = builder
        self._view = view
        self._chunks = ChatChunks()
        self._done = False
        self._usage = False
        self._ids = 0

    def __call__(self, chunk: bytes) -> bytes:
        b = self._builder
        for obj in self._chunks.feed(chunk):
            if not b.failed:  # nothing is owed after an error
                self._chunk(obj)
        if not b.failed:  # ([DONE] after an in-band error ends nothing: the error did)
            self._done = self._chunks.done
        return b.take()

    def _chunk(self, obj: dict[str, Any]) -> None:
        b = self._builder
        err = obj.get("error")
        if err is not None:
            message = err.get("message") if isinstance(err, dict) else err
            b.fail(error_status(obj, 500), str(message or "the upstream failed mid-stream"))
            return
        usage = obj.get("usage")
        if not b.started:
            prompt = obj.get("prompt_token_ids")  # vLLM's first chunk, when token ids were asked for
            count = len(prompt) if isinstance(prompt, list) and prompt else None
            if count is None and isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
                count = usage["prompt_tokens"]
            model = obj.get("model")
            b.start(model if isinstance(model, str) else None, count)
        if isinstance(usage, dict):
            self._usage = True
            b.usage(usage.get("prompt_tokens"), usage.get("completion_tokens"))
        for ch in obj.get("choices") or ():
            if type(ch) is not dict or ch.get("index", 0) != 0:
                continue  # Anthropic has one message per call; the gateway never asks for n > 1
            ids = ch.get("token_ids")
            if isinstance(ids, list):
                self._ids += len(ids)
            delta = ch.get("delta")
            if isinstance(delta, dict):
                _delta(b, delta)
            finish = ch.get("finish_reason")
            if finish is not None:
                b.finished(finish, ch.get("stop_reason"))

    def flush(self) -> bytes:
        b = self._builder
        if self._done:
            if not self._usage:
                b.output_tokens = self._ids
            b.end()
        else:
            b.fail(502, "the upstream's stream ended before it finished")
        self._view.response = b.message()
        return b.take()

    def refuse(self, err: HttpError) -> bytes:
        """The end of the stream when the core refuses its end (the record could not be committed): what is still
        owed, then an `event: error` in place of `message_delta` and `message_stop`."""
        owed = self._builder.take()
        self._builder.failed = self._done = True
        return owed + error_event(err.status, err.message)

    def ended(self) -> bool:
        """Whether the upstream's `[DONE]` came, no error before it: the stream is whole (`flow.Transform`)."""
        return self._done

    def snapshot(self) -> None:
        """Record what the client received so far (the exchange failed before `flush`)."""
        self._view.response = self._builder.message()


def _delta(b: MessageBuilder, delta: dict[str, Any]) -> None:
    reasoning = delta.get("reasoning") or delta.get("reasoning_content")  # vLLM's new name, then its old one
    if isinstance(reasoning, str):
        b.thinking(reasoning)
    content = delta.get("content")
    if isinstance(content, str):
        b.text(content)
    for call in delta.get("tool_calls") or ():
        if not isinstance(call, dict):
            continue
        fn = call.get("function")
        if not isinstance(fn, dict):
            fn = {}
        index = call.get("index", 0)
        b.tool(index if isinstance(index, int) else 0, call.get("id"), fn.get("name"), fn.get("arguments"))


def message_body(raw: bytes, builder: MessageBuilder, view: ClientView) -> bytes:
    """A whole chat completion (choice 0) as the Anthropic message; the view gets the message too."""
    obj = loads_or_none(raw)
    choices = obj.get("choices") if isinstance(obj, dict) else None
    choice = next((c for c in choices or () if isinstance(c, dict) and c.get("index", 0) == 0), None)
    if not isinstance(obj, dict) or choice is None or not isinstance(choice.get("message"), dict):
        raise BodyRefused(502, reshape_error(502, b"the upstream's answer is not a chat completion"))
    model = obj.get("model")
    builder.start(model if isinstance(model, str) else None)
    message = choice.get("message")
    if isinstance(message, dict):
        calls = message.get("tool_calls")
        calls = (
            [{**c, "index": i} for i, c in enumerate(calls) if isinstance(c, dict)]
            if isinstance(calls, list)
            else []
        )
        _delta(builder, {**message, "tool_calls": calls})
    builder.finished(choice.get("finish_reason"), choice.get("stop_reason"))
    usage = obj.get("usage")
    if isinstance(usage, dict):
        builder.usage(usage.get("prompt_tokens"), usage.get("completion_tokens"))
    builder.end()
    view.response = builder.message()
    return orjson.dumps(view.response)


def token_count_body(raw: bytes) -> bytes:
    """vLLM's `/tokenize` answer as Anthropic's `{"input_tokens": N}`."""
    obj = loads_or_none(raw)
    count = obj.get("count") if isinstance(obj, dict) else None
    if not isinstance(count, int) and isinstance(obj, dict) and isinstance(obj.get("tokens"), list):
        count = len(obj["tokens"])
    if not isinstance(count, int):
        raise BodyRefused(502, reshape_error(502, b"the upstream's /tokenize answer holds no count"))
    return orjson.dumps({"input_tokens": count})
