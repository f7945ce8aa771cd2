"""Transforms from the upstream's chat completions answer to what a Responses API client is owed.

`StreamTranslator` re-encodes an event stream event by event (only an unfinished upstream event waits for its
bytes) and owes the items' `done` events and `response.completed` until `flush()`, which the core calls before
`response_end` and whose bytes it releases after it: the client sees its response complete only once the record
was committed, as a chat client sees `[DONE]`. A whole body is converted at its end by `response_body`.
"""

from __future__ import annotations

from typing import Any

import orjson

from agl_lite.capture.client_view import ClientView
from agl_lite.core.flow import BodyRefused
from agl_lite.core.jsoncodec import loads_or_none
from agl_lite.errors import HttpError
from agl_lite.translate.chunks import ChatChunks
from agl_lite.translate.responses.builder import Event, ResponseBuilder

__all__ = ["StreamTranslator", "encode", "error_body", "reshape_error", "response_body"]

_CODES = {401: "invalid_api_key", 429: "rate_limit_exceeded"}


def encode(events: list[Event]) -> bytes:
    """Events as server-sent events, each named by its type as the Responses API sends them."""
    return b"".join(b"event: %s\ndata: %s\n\n" % (e["type"].encode(), orjson.dumps(e)) for e in events)


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> bytes:
    """An error in the Responses API's shape: OpenAI's `type` (`invalid_request_error` for what the client can
    mend, as OpenAI answers a bad key too; else `server_error`) and a `code` that says which."""
    kind = "invalid_request_error" if 400 <= status < 500 else "server_error"
    error = {"type": kind, "code": code or _CODES.get(status, kind), "message": message, "param": param}
    return orjson.dumps({"error": error})


def reshape_error(status: int, body: bytes | None) -> bytes:
    """An error answer (the gateway's own, or the upstream's) in the Responses API's shape, its message kept."""
    obj = loads_or_none(body)
    err = obj.get("error") if isinstance(obj, dict) else None
    code = None
    if isinstance(err, dict):
        message, param = err.get("message"), err.get("param")
        code = err.get("type") if isinstance(err.get("type"), str) and 400 <= status < 500 else None
    else:
        message, param = (err if isinstance(err, str) else None), None
    if not isinstance(message, str) or not message:
        message = (body or b"").decode("utf-8", "replace")[:500] or f"the upstream answered {status}"
    return error_body(status, message, param if isinstance(param, str) else None, code)


class StreamTranslator:
    """Transform: a chat completions event stream in (choice 0), the Responses event stream out."""

    __slots__ = ("_builder", "_chunks", "_done", "_failed", "_finish", "_started", "_usage", "_view")

    def __init__(self, builder: ResponseBuilder, view: ClientView) -> None:
        self._builder = builder
        self._view = view
        self._chunks = ChatChunks()
        self._started = self._done = self._failed = False
        self._finish: str | None = None
        self._usage: Any = None

    def __call__(self, chunk: bytes) -> bytes:
        events: list[Event] = []
        for obj in self._chunks.feed(chunk):
            if not self._failed:  # nothing is owed after a failure
                events += self._chunk(obj)
        if not self._failed:  # ([DONE] after an in-band error ends nothing: the error did)
            self._done = self._chunks.done
        return encode(events)

    def _chunk(self, obj: dict[str, Any]) -> list[Event]:
        b = self._builder
        events = [] if self._started else b.start()
        self._started = True
        err = obj.get("error")
        if err is not None:
            message = err.get("message") if isinstance(err, dict) else err
            self._failed = True
            return events + b.fail(str(message or "the upstream failed mid-stream"))
        if obj.get("usage") is not None:
            self._usage = obj["usage"]
        for ch in obj.get("choices") or ():
            if type(ch) is not dict or ch.get("index", 0) != 0:
                continue  # one response per call: the gateway never asks for n > 1 here
            delta = ch.get("delta")
            logprobs = ch.get("logprobs")
            content = logprobs.get("content") if isinstance(logprobs, dict) else None
            if isinstance(delta, dict):
                events += b.delta(delta, content)
            if ch.get("finish_reason") is not None:
                self._finish = ch["finish_reason"]
        return events

    def flush(self) -> bytes:
        b = self._builder
        events = [] if self._started or self._failed else b.start()
        self._started = True
        if self._failed:
            pass
        elif self._done:
            events += b.finish(self._finish, self._usage)
        else:
            self._failed = True
            events += b.fail("the upstream's stream ended before it finished")
        self._view.response = b.response()
        return encode(events)

    def refuse(self, err: HttpError) -> bytes:
        """The end of the stream when the core refuses it (the record could not be committed): `response.failed`
        in place of `response.completed`, so the response does not look complete."""
        self._failed = True
        return encode(self._builder.fail(err.message))

    def ended(self) -> bool:
        """Whether the upstream's `[DONE]` came, no error before it: the stream is whole (`flow.Transform`)."""
        return self._done

    def snapshot(self) -> None:
        """Record what the client received so far (the exchange failed before `flush`)."""
        self._view.response = self._builder.response()


def response_body(raw: bytes, builder: ResponseBuilder, view: ClientView) -> bytes:
    """A whole chat completion (choice 0) as the Response; the view gets the Response too."""
    obj = loads_or_none(raw)
    choices = obj.get("choices") if isinstance(obj, dict) else None
    first = choices[0] if isinstance(choices, list) and choices else None
    if not isinstance(first, dict) or not isinstance(first.get("message"), dict):
        raise BodyRefused(502, error_body(502, "the upstream's answer is not a chat completion"))
    view.response = builder.whole(obj)
    return orjson.dumps(view.response)
