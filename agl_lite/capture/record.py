"""The `LLMCall` record of one finished flow: what was asked, what the upstream answered (assembled from its bytes),
how the call ended, and its timings. It reads the flow; it never changes it and never stores anything.
"""

from __future__ import annotations

import itertools
import time
import uuid
from dataclasses import dataclass
from typing import Any

import orjson
import structlog

from agl_lite.capture.assemble import Assembly, Collector, error_message
from agl_lite.capture.client_view import ClientView, apply_client_view
from agl_lite.capture.plan import asked
from agl_lite.capture.strip import Strip
from agl_lite.core.flow import Flow, Request
from agl_lite.core.jsoncodec import loads_or_none
from agl_lite.core.routes import RouteKind
from agl_lite.errors import HttpError, ShuttingDown
from agl_lite.store.records import CallOutcome, LLMCall

__all__ = ["MAX_FAILED_REQUEST_BYTES", "SAMPLING_KEYS", "CallState", "api_of", "new_call", "record_of"]

log = structlog.get_logger("agl_lite.capture")

# A call id unique across processes and restarts without a uuid4 per call: uuid4 reads os.urandom, which showed
# as ~10 % of the gateway's CPU under load on a VM. A random prefix per process, then a counter.
_ID_PREFIX = uuid.uuid4().hex[:16] + "-"
_call_numbers = itertools.count(1)


SAMPLING_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "max_tokens",
    "max_completion_tokens",
    "min_tokens",
    "n",
    "best_of",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "length_penalty",
    "logit_bias",
    "allowed_token_ids",
    "bad_words",
    "logprobs",
    "top_logprobs",
    "prompt_logprobs",
    "stream",
    "stream_options",
    "return_token_ids",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "include_stop_str_in_output",
    "echo",
)
"""Request fields recorded as `sampling` when present in what was sent upstream."""
_SAMPLING = frozenset(SAMPLING_KEYS)


class _OrderClock:
    """Ordering keys: nanoseconds since the epoch, made strictly increasing across the process."""

    def __init__(self) -> None:
        self._last = 0

    def next(self, at_ns: int | None = None) -> int:
        key = time.time_ns() if at_ns is None else at_ns
        if key <= self._last:
            key = self._last + 1
        self._last = key
        return key


_clock = _OrderClock()
MAX_FAILED_REQUEST_BYTES = 64 * 1024
"""Largest request body a call that did not succeed keeps in its record."""
_REFUSALS = frozenset({429, 503, 507})
"""Statuses of the gateway's own refusals (budget, busy, paused, storage quota) that leave no record."""


@dataclass(slots=True, eq=False)
class CallState:
    """Capture's own state of one flow (`capture.state`): nothing else reads it."""

    api: str
    order_key: int
    original: bytes
    """The client's body as it arrived; decoded once, when the record is built."""
    strip: Strip
    forwarded: bool = True
    """False for a flow that another addon answered before capture's `request` ran."""
    request: dict[str, Any] | None = None
    """`original` as orjson reads it, when capture had it parsed already (a conversation is not parsed twice)."""
    collector: Collector | None = None
    unreadable: str | None = None


def api_of(flow: Flow) -> str | None:
    """The API of an LLM route's call (`chat`, `completions`, `messages`, `responses`), None for anything else."""
    if flow.route.kind is not RouteKind.LLM:
        return None
    path = flow.request.path
    if path.endswith("/chat/completions"):
        return "chat"
    if path.endswith("/completions"):
        return "completions"
    if path.endswith("/messages"):  # an Anthropic call rejected before its translation to chat
        return "messages"
    if path.endswith("/responses"):  # likewise a Responses API call
        return "responses"
    return None


def new_call(
    api: str, original: bytes, strip: Strip, *, at_ns: int | None = None, forwarded: bool = True
) -> CallState:
    """The state of a call starting now (or, answered before capture saw it, at `at_ns`), in order with the rest."""
    return CallState(api, _clock.next(at_ns), original, strip, forwarded)


def record_of(flow: Flow, call: CallState, view: ClientView | None) -> LLMCall | None:
    """The flow's record; None for the gateway's own refusals (budget, busy, paused, quota) before any upstream,
    which the metrics count and the store does not keep one by one (an agent retrying in a loop would flood it)."""
    resp = flow.response
    if flow.upstream is None and resp is not None and not resp.from_upstream and resp.status in _REFUSALS:
        return None
    try:
        record = _build(flow, call)
    except Exception as exc:  # a malformed upstream body must still leave its one record
        # The upstream's bytes, not a bug of ours: one line, no traceback (the record says what went wrong).
        log.warning("capture could not assemble a record", path=flow.request.path, error=repr(exc))
        record = _bare(flow, call, CallOutcome.UPSTREAM_ERROR, f"capture could not assemble: {exc!r}")
    apply_client_view(record, view)
    if record.outcome is not CallOutcome.OK and len(call.original) > MAX_FAILED_REQUEST_BYTES:
        # Nothing trains on a failed call: it keeps what says what was asked, not a body of up to 64 MiB that
        # an agent could send again and again to fill the store.
        omitted = {"omitted": "the request of a call that did not succeed", "bytes": len(call.original)}
        record.request = record.upstream_request = omitted
    return record


def _bare(flow: Flow, call: CallState, outcome: CallOutcome, error: str | None) -> LLMCall:
    md = flow.metadata
    request = call.request if call.request is not None else loads_or_none(call.original)
    requested = md.get("route.requested_model")
    if requested is None and isinstance(request, dict) and isinstance(request.get("model"), str):
        requested = request["model"]
    resp = flow.response
    now = time.monotonic()
    return LLMCall(
        id=f"{_ID_PREFIX}{next(_call_numbers):x}",
        order_key=call.order_key,
        outcome=outcome,
        api=call.api,
        rollout_id=md.get("auth.rollout_id"),
        attempt_id=md.get("auth.attempt_id"),
        status=resp.status if resp is not None else flow.error.status if flow.error is not None else 0,
        requested_model=requested,
        model=md.get("route.model"),
        upstream=flow.upstream.name if flow.upstream is not None else None,
        model_version=md.get("route.model_version"),
        stream=asked(request.get("stream"))
        if isinstance(request, dict)
        else resp is not None and resp.is_event_stream,
        request=request,
        sampling=_sampling(flow.request) if call.forwarded and outcome is not CallOutcome.REJECTED else {},
        error=error,
        t_start=flow.t_start_wall,
        t_first_byte=None
        if flow.t_first_byte is None
        else flow.t_start_wall + (flow.t_first_byte - flow.t_start),
        t_end=flow.t_start_wall + (now - flow.t_start),
    )


def _build(flow: Flow, call: CallState) -> LLMCall:
    resp, err = flow.response, flow.error
    asm: Assembly | None = call.collector.finish() if call.collector is not None else None
    error: str | None = None
    if flow.client_disconnected:
        outcome = CallOutcome.CLIENT_DISCONNECTED
    elif isinstance(err, ShuttingDown) or (err is not None and err is flow.abort_error):
        outcome, error = CallOutcome.ABORTED, err.message  # the gateway cut it (shutdown, its rollout ended)
    elif err is not None:
        outcome, error = CallOutcome.UPSTREAM_ERROR, err.message
    elif resp is None:
        outcome, error = CallOutcome.UPSTREAM_ERROR, "no response"
    elif not resp.from_upstream:
        outcome, error = CallOutcome.REJECTED, _short_error(resp.body)
    elif asm is None:
        outcome, error = CallOutcome.UPSTREAM_ERROR, call.unreadable
    elif resp.status >= 400:
        outcome, error = CallOutcome.UPSTREAM_ERROR, asm.error or f"the upstream answered {resp.status}"
    elif asm.error is not None:
        outcome, error = CallOutcome.UPSTREAM_ERROR, asm.error
    elif asm.done:
        outcome = CallOutcome.OK
    elif resp.is_event_stream:
        outcome, error = CallOutcome.TRUNCATED, "the stream ended without [DONE]"
    else:
        outcome, error = CallOutcome.UPSTREAM_ERROR, "the upstream body is empty"
    record = _bare(flow, call, outcome, error)
    if asm is not None:
        record.response_id = record.client_id = asm.response_id
        record.served_model = asm.served_model
        record.prompt_token_ids = asm.prompt_token_ids()
        record.choices = asm.choices()
        record.usage = asm.usage
        completion_tokens = (asm.usage or {}).get("completion_tokens")
        ids = asm.completion_ids_count()
        if isinstance(completion_tokens, int) and ids:
            record.complete = ids == completion_tokens
        if not asm.chat and asm.several_prompts():
            # The record keeps the first prompt's ids: the other prompts' choices would train on the wrong prompt.
            record.complete = False
            if record.error is None:  # (a call that failed keeps what it failed of)
                record.error = "several prompts in one call: the record holds the first one's ids only"
    return record


def _sampling(request: Request) -> dict[str, Any]:
    try:
        body = request.json()
    except HttpError:
        return {}
    if not isinstance(body, dict):
        return {}
    sampling = {k: v for k, v in body.items() if k in _SAMPLING}
    return sampling if _storable(sampling) else {k: v for k, v in sampling.items() if _storable(v)}


def _storable(value: Any) -> bool:
    """Whether the store's serialiser (orjson) can hold it: the request was read as Python reads JSON, integers
    past 64 bits and lone surrogates included, and one such value must not cost the call its record."""
    try:
        orjson.dumps(value)
    except TypeError:
        return False
    return True


def _short_error(body: bytes | None) -> str | None:
    obj = loads_or_none(body or b"")
    if isinstance(obj, dict) and obj.get("error") is not None:
        return error_message(obj["error"])
    return None
