"""Capture: one `LLMCall` record per LLM call that passed auth, with the exact token ids vLLM produced (DESIGN §3).

For vLLM routes it injects `return_token_ids` (usage for streams, logprobs if configured) and gives the client back
only what it asked for; it taps the upstream bytes and decodes them once, at the end. The record goes into
`flow.metadata["capture.record"]`; committing it is the sink's job, never this addon's. The work is in
`agl_lite.capture`: `plan` (what to inject), `strip` (the client's view), `assemble` and `record` (the record).
"""

from __future__ import annotations

from dataclasses import dataclass

from agl_lite.capture.assemble import Collector
from agl_lite.capture.client_view import CLIENT_VIEW
from agl_lite.capture.plan import NOTHING, inject, plan
from agl_lite.capture.record import CallState, api_of, new_call, record_of
from agl_lite.capture.strip import client_view
from agl_lite.core.config import GatewayConfig, option
from agl_lite.core.flow import Flow
from agl_lite.errors import ConfigError

__all__ = ["Capture"]


class Capture:
    """Sets `capture.order_key` (int, at request start), `capture.injected` (the top-level fields it set upstream)
    and `capture.record` (the `LLMCall`, in `response_end` or `error`); `capture.state` is its own. Reads
    `auth.role`, `auth.rollout_id`, `auth.attempt_id`, `route.backend`, `route.model`, `route.requested_model`,
    `route.model_version`, and `capture.client_view` (left by a translating addon such as anthropic).
    """

    short_name = "capture"
    """Its name in a chain, and what other addons' `after` call it."""

    after = {
        "route": "capture reads route.backend in request, to know what to ask vLLM for",
        "anthropic": "capture records the chat request anthropic translates, and the client view it leaves",
        "responses": "capture records the chat request responses translates, and the client view it leaves",
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
        api = api_of(flow)
        if api is None:
            return
        req = flow.request
        call = new_call(api, req.upstream_body(), NOTHING)  # the request before capture's own members
        md = flow.metadata
        md["capture.state"] = call
        md["capture.order_key"] = call.order_key
        if md.get("route.backend") != "vllm":
            return
        body = req.json_object()
        if not req.python_only:
            # What orjson reads from `call.original`, as the record keeps it: shallow, as `inject` below sets
            # top-level members only (and `stream_options` whole, never inside the client's own).
            call.request = dict(body)
        opts = self.options
        added, call.strip = plan(body, api, logprobs=opts.logprobs, top_logprobs=opts.top_logprobs)
        if added:
            md["capture.injected"] = added
            inject(req, added)

    def response_headers(self, flow: Flow) -> None:
        call: CallState | None = flow.metadata.get("capture.state")
        resp = flow.response
        if call is None or resp is None or not resp.from_upstream:
            return
        encoded = resp.encoded()
        if encoded is not None:
            # The core asked for identity; bytes capture cannot read are neither rewritten nor parsed.
            call.unreadable = encoded
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
        call: CallState | None = md.get("capture.state")
        if call is None:
            api = api_of(flow)
            if api is None:
                return
            # Answered before capture's `request` ran (unknown model...): ordered by its start, as far as possible.
            call = new_call(
                api,
                flow.request.upstream_body(),
                NOTHING,
                at_ns=int(flow.t_start_wall * 1e9),
                forwarded=False,
            )
        record = record_of(flow, call, md.get(CLIENT_VIEW))
        if record is not None:
            md["capture.record"] = record
