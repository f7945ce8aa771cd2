"""Anthropic: the Messages API for Anthropic clients (Claude Code), translated to chat completions upstream so that
capture records vLLM's token ids as for any OpenAI call (vLLM's own /v1/messages drops them).

In `request` it turns the Anthropic body into a chat completions body (count_tokens: a /tokenize body) and points
the targets route chose at the matching upstream path; in `response_headers` it attaches the transform that turns
the answer back into Anthropic's shape (events re-encoded as they arrive) and reshapes every error it did not
produce. It sits after `route` (which only reads `model`, common to both APIs) and before `capture`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from multidict import CIMultiDict

from agl_lite.capture.client_view import CLIENT_VIEW, ClientView
from agl_lite.core.config import GatewayConfig, option
from agl_lite.core.contract import ATTRIBUTED_PREFIX
from agl_lite.core.flow import Flow, Refuse, Response, WholeBody
from agl_lite.core.routes import HttpRoute, RouteKind, Scope, model_api_routes
from agl_lite.translate.anthropic import (
    MessageBuilder,
    StreamTranslator,
    message_body,
    model_info,
    models_list,
    new_message_id,
    reshape_error,
    to_chat,
    to_tokenize,
    token_count_body,
)

__all__ = ["Anthropic"]

_MESSAGES = frozenset({"messages", "messages.agent"})
_COUNT = frozenset({"messages_count_tokens", "messages_count_tokens.agent"})
_PROBE = frozenset({"anthropic_probe", "anthropic_probe.agent"})
_MODELS = frozenset({"models", "models.agent"})
"""The route addon's model list, reshaped for requests that carry `anthropic-version`."""
_MODEL = frozenset({"model", "model.agent"})
"""The route addon's model card (`models.retrieve`), likewise."""
_TRANSLATOR = "anthropic.translator"


class Anthropic:
    """Sets `capture.client_view` (a `ClientView`: the Anthropic request, its `msg_…` id and, at the end, the
    message the client received) and `anthropic.translator` (its own). Reads `route.requested_model`, the targets
    route planned in `flow.upstreams`, and the `models` route's answer (reshaped for Anthropic clients)."""

    short_name = "anthropic"
    """Its name in a chain, and what other addons' `after` call it."""

    routes = (
        *model_api_routes(
            "messages",
            "POST",
            "/v1/messages",
            RouteKind.LLM,
            "Anthropic Messages (as chat completions upstream).",
        ),
        *model_api_routes(
            "messages_count_tokens",
            "POST",
            "/v1/messages/count_tokens",
            RouteKind.LLM,
            "Anthropic token counting (the upstream's /tokenize).",
        ),
        HttpRoute(
            "anthropic_probe",
            "HEAD",
            "/",
            Scope.PUBLIC,
            RouteKind.API,
            "Anthropic clients' reachability probe.",
        ),
        HttpRoute(
            "anthropic_probe.agent",
            "HEAD",
            ATTRIBUTED_PREFIX,
            Scope.PUBLIC,
            RouteKind.API,
            "ANTHROPIC_BASE_URL: Anthropic clients' reachability probe.",
        ),
    )

    @dataclass(frozen=True, slots=True)
    class Options:
        strip_billing_header: bool = option(
            True,
            "Leave out Claude Code's `x-anthropic-billing-header` system block upstream: it changes on every call, "
            "which breaks the prefix sharing of token ids and the upstream's prefix cache.",
        )

    def __init__(self) -> None:
        self.options = Anthropic.Options()

    def configure(self, config: GatewayConfig, options: Anthropic.Options | None) -> None:
        self.options = options or Anthropic.Options()

    # --- hooks -------------------------------------------------------------------------------------------------

    def request(self, flow: Flow) -> None:
        name = flow.route.name
        if name in _MESSAGES:
            self._translate(flow, count=False)
        elif name in _COUNT:
            self._translate(flow, count=True)
        elif name in _PROBE:
            flow.response = Response(status=200, headers=CIMultiDict(), body=b"")

    def _translate(self, flow: Flow, *, count: bool) -> None:
        req = flow.request
        original = req.body
        parsed = req.json_object()
        strip = self.options.strip_billing_header
        body = (
            to_tokenize(parsed, strip_billing_header=strip)
            if count
            else to_chat(parsed, strip_billing_header=strip)
        )
        # Nothing changed before this point: a bad request leaves the flow as it came (and capture records it).
        req.replace_json(body)  # the JSON others read from now on is the upstream's
        req.query_string = ""  # `?beta=true` means nothing upstream
        for header in [h for h in req.headers if h.lower().startswith("anthropic-")]:
            req.headers.popall(header, None)
        if count:
            _retarget(flow, tokenize=True)
            return
        flow.metadata[CLIENT_VIEW] = ClientView("messages", original, new_message_id())
        req.path = req.path[: -len("/messages")] + "/chat/completions"  # capture parses what it now is
        _retarget(flow, tokenize=False)

    def response_headers(self, flow: Flow) -> None:
        resp = flow.response
        name = flow.route.name
        if resp is None:
            return
        if name in _MODELS or name in _MODEL:
            if "anthropic-version" in flow.request.headers and not resp.from_upstream:
                reshape = models_list if name in _MODELS else model_info
                body = reshape(resp.body) if resp.status == 200 else reshape_error(resp.status, resp.body)
                if body is not None:
                    resp.body = body
            return
        if name not in _MESSAGES and name not in _COUNT:
            return
        if not resp.from_upstream:
            if resp.status >= 400:
                resp.body = reshape_error(resp.status, resp.body)
            return
        if resp.status >= 300:
            resp.transforms.append(WholeBody(partial(reshape_error, resp.status)))
            return
        encoded = resp.encoded()
        if encoded is not None:  # bytes no translation can read
            resp.transforms.append(Refuse(502, reshape_error(502, encoded.encode())))
            return
        if name in _COUNT:
            resp.transforms.append(WholeBody(token_count_body))
            return
        view = flow.metadata.get(CLIENT_VIEW)
        if not isinstance(view, ClientView):
            return
        model = str(flow.metadata.get("route.requested_model") or "")
        if resp.is_event_stream:
            translator = StreamTranslator(MessageBuilder(view.client_id or new_message_id(), model), view)
            flow.metadata[_TRANSLATOR] = translator
            resp.transforms.append(translator)
        else:
            builder = MessageBuilder(view.client_id or new_message_id(), model, emit=False)
            resp.transforms.append(WholeBody(partial(message_body, builder=builder, view=view)))

    def error(self, flow: Flow) -> None:
        translator = flow.metadata.get(_TRANSLATOR)
        if isinstance(translator, StreamTranslator):
            translator.snapshot()


def _retarget(flow: Flow, *, tokenize: bool) -> None:
    """Point the targets route planned for `…/v1/messages[/count_tokens]` at `…/v1/chat/completions`, or at vLLM's
    `/tokenize`, which sits beside `/v1`, not under it."""
    for target in flow.upstreams:
        path = target.url.raw_path
        base = path[: path.rfind("/messages")]
        if tokenize:
            base = base.removesuffix("/v1")
            path = base + "/tokenize"
        else:
            path = base + "/chat/completions"
        target.url = target.url.with_path(path, encoded=True)
