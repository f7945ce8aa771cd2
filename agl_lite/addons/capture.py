"""Capture: one `LLMCall` record per LLM call that passed auth, with the exact token ids vLLM produced (DESIGN §3).

For vLLM routes it injects `return_token_ids` (usage for streams, logprobs if configured) and gives the client back
only what it asked for; it taps the upstream bytes and decodes them once, at the end. The record goes into
`flow.metadata["capture.record"]`; committing it is the sink's job, never this addon's.
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
from agl_lite.capture.client_view import CLIENT_VIEW, apply_client_view
from agl_lite.capture.strip import Strip, client_view
from agl_lite.core.config import GatewayConfig, option
from agl_lite.core.flow import Flow, Request
from agl_lite.core.routes import RouteKind
from agl_lite.errors import ConfigError, HttpError, ShuttingDown
from agl_lite.store.records import CallOutcome, LLMCall

# A call id unique across processes and restarts without a uuid4 per call: uuid4 reads os.urandom, which showed
# as ~10 % of the gateway's CPU under load on a VM. A random prefix per process, then a counter.
_ID_PREFIX = uuid.uuid4().hex[:16] + "-"
_call_numbers = itertools.count(1)

__all__ = ["SAMPLING_KEYS", "Capture"]

log = structlog.get_logger("agl_lite.capture")

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
_NOTHING = Strip()


@dataclass(slots=True, eq=False)
class _Call:
    """Capture's own per-flow state (`capture.state`): nothing else reads it."""

    api: str
    order_key: int
    original: bytes
    """The client's body as it arrived; decoded once, when the record is built."""
    strip: Strip
    forwarded: bool = True
    """False for a flow that another addon answered before capture's `request` ran."""
    collector: Collector | None = None
    unreadable: str | None = None


def _api(flow: Flow) -> str | None:
    if flow.route.kind is not RouteKind.LLM:
        return None
    path = flow.request.path
    if path.endswith("/chat/completions"):
        return "chat"
    if path.endswith("/completions"):
        return "completions"
    if path.endswith("/messages"):  # an Anthropic call rejected before its translation to chat
        return "messages"
    return None


def _asked(value: Any) -> bool:
    """Whether a client's boolean option is on, as vLLM's (lax) request parsing would read it."""
    return value is True or value == 1 or (isinstance(value, str) and value.strip().lower() in ("true", "1"))


class Capture:
    """Sets `capture.order_key` (int, at request start), `capture.injected` (the top-level fields it set upstream)
    and `capture.record` (the `LLMCall`, in `response_end` or `error`); `capture.state` is its own. Reads
    `auth.role`, `auth.rollout_id`, `auth.attempt_id`, `route.backend`, `route.model`, `route.requested_model`,
    `route.model_version`, and `capture.client_view` (left by a translating addon such as anthropic).
    """

    after = {
        "route": "capture reads route.backend in request, to know what to ask vLLM for",
        "anthropic": "capture records the chat request anthropic translates, and the client view it leaves",
    }

    @dataclass(frozen=True, slots=True)
    class Options:
        logprobs: bool = option(
            False,
            "Ask vLLM routes for each sampled token's logprob when the client did not (its reply stays as if "
            "not asked), so that every record carries logprobs.",
        )
        top_logprobs: int = option(
            0, "With `logprobs`: alternatives per token asked for too (0: only the sampled token's logprob)."
        )

    def __init__(self) -> None:
        self.options = Capture.Options()

    def configure(self, config: GatewayConfig, options: Capture.Options | None) -> None:
        options = options or Capture.Options()  # None when added as an instance (tests, extra_addons)
        if options.top_logprobs < 0:
            raise ConfigError(f"{config.source}: addons.capture.top_logprobs must be >= 0")
        self.options = options

    # --- hooks -------------------------------------------------------------------------------------------------

    def request(self, flow: Flow) -> None:
        api = _api(flow)
        if api is None:
            return
        req = flow.request
        call = _Call(api, _clock.next(), req.body, _NOTHING)
        md = flow.metadata
        md["capture.state"] = call
        md["capture.order_key"] = call.order_key
        if md.get("route.backend") != "vllm":
            return
        body = req.json_object()
        added, call.strip = self._plan(body, api)
        if not added:
            return
        md["capture.injected"] = added
        if body and not any(k in body for k in added):
            # Append the new members to the bytes rather than re-encoding a body that can hold a long context.
            raw = req.upstream_body().rstrip()  # (re-encoded here if an earlier addon changed the JSON)
            if raw.endswith(b"}"):
                req.body = raw[:-1] + b"," + orjson.dumps(added)[1:]
                body.update(added)  # the same request, for whoever reads the JSON after us
                return
        body.update(added)
        req.mark_json_changed()

    def _plan(self, body: dict[str, Any], api: str) -> tuple[dict[str, Any], Strip]:
        """The top-level fields to set upstream for the record, and what of it the client did not ask for."""
        added: dict[str, Any] = {}
        if not _asked(body.get("return_token_ids")):
            added["return_token_ids"] = True
        if body.get("stream") is True:  # vLLM rejects stream_options on a non-streamed request
            so = body.get("stream_options")
            if not (isinstance(so, dict) and _asked(so.get("include_usage"))):
                added["stream_options"] = (
                    {**so, "include_usage": True} if isinstance(so, dict) else {"include_usage": True}
                )
        opts = self.options
        if opts.logprobs:
            if api == "chat":
                if not _asked(body.get("logprobs")):
                    added["logprobs"] = True
                    if opts.top_logprobs and body.get("top_logprobs") is None:
                        added["top_logprobs"] = opts.top_logprobs
            elif body.get("logprobs") is None:  # completions: an int, and 0 is a request too
                added["logprobs"] = opts.top_logprobs
        if not added:
            return added, _NOTHING
        return added, Strip("return_token_ids" in added, "stream_options" in added, "logprobs" in added)

    def response_headers(self, flow: Flow) -> None:
        call: _Call | None = flow.metadata.get("capture.state")
        resp = flow.response
        if call is None or resp is None or not resp.from_upstream:
            return
        encoding = resp.headers.get("Content-Encoding", "identity").lower()
        if encoding != "identity":
            # The core asked for identity; bytes capture cannot read are neither rewritten nor parsed.
            call.unreadable = f"the upstream answered with Content-Encoding {encoding}"
            return
        chat = call.api == "chat"
        call.collector = collector = Collector(stream=resp.is_event_stream, chat=chat)
        resp.taps.append(collector.feed)
        if resp.status < 300:
            transform = client_view(call.strip, stream=resp.is_event_stream, chat=chat)
            if transform is not None:
                resp.transforms.append(transform)

    def response_end(self, flow: Flow) -> None:
        self._record(flow)

    def error(self, flow: Flow) -> None:
        self._record(flow)

    # --- the record --------------------------------------------------------------------------------------------

    def _record(self, flow: Flow) -> None:
        md = flow.metadata
        if "capture.record" in md or "auth.role" not in md:
            return
        resp = flow.response
        if flow.upstream is None and resp is not None and not resp.from_upstream and resp.status in _REFUSALS:
            # Refused for load or budget before any upstream (busy, paused, out of tokens): counted by the
            # metrics, not stored one by one, or an agent retrying in a loop floods its rollout.
            return
        call: _Call | None = md.get("capture.state")
        if call is None:
            api = _api(flow)
            if api is None:
                return
            # Answered before capture's `request` ran (unknown model...): ordered by its start, as far as possible.
            call = _Call(api, _clock.next(int(flow.t_start_wall * 1e9)), flow.request.body, _NOTHING, False)
        try:
            record = _build(flow, call)
        except Exception as exc:  # a malformed upstream body must still leave its one record
            # The upstream's bytes, not a bug of ours: one line, no traceback (the record says what went wrong).
            log.warning("capture could not assemble a record", path=flow.request.path, error=repr(exc))
            record = _bare(flow, call, CallOutcome.UPSTREAM_ERROR, f"capture could not assemble: {exc!r}")
        apply_client_view(record, md.get(CLIENT_VIEW))
        if record.outcome is not CallOutcome.OK and len(call.original) > MAX_FAILED_REQUEST_BYTES:
            # Nothing trains on a failed call: it keeps what says what was asked, not a body of up to 64 MiB that
            # an agent could send again and again to fill the store.
            omitted = {"omitted": "the request of a call that did not succeed", "bytes": len(call.original)}
            record.request = record.upstream_request = omitted
        md["capture.record"] = record


def _bare(flow: Flow, call: _Call, outcome: CallOutcome, error: str | None) -> LLMCall:
    md = flow.metadata
    request = _loads(call.original)
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
        stream=request.get("stream") is True
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


def _build(flow: Flow, call: _Call) -> LLMCall:
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


def _loads(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def _short_error(body: bytes | None) -> str | None:
    obj = _loads(body or b"")
    if isinstance(obj, dict) and obj.get("error") is not None:
        return error_message(obj["error"])
    return None
