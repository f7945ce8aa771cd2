"""Responses: the OpenAI Responses API (`POST /v1/responses`, what Codex CLI and the OpenAI Agents SDK speak),
translated to chat completions upstream so that capture records vLLM's token ids as for any chat call.

In `request` it turns the Responses body into a chat completions body and points the targets route chose at the
upstream's `/chat/completions`; in `response_headers` it attaches the transform that turns the answer back into a
Response (events re-encoded as they arrive) and reshapes every error into the Responses error shape. It sits after
`route` (which only reads `model`, common to both APIs) and before `capture`. docs/responses.md has the mapping.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from agl_lite.capture.client_view import CLIENT_VIEW, ClientView
from agl_lite.core.flow import Flow, WholeBody
from agl_lite.core.routes import RouteKind, model_api_routes
from agl_lite.errors import BadRequest
from agl_lite.translate.responses import (
    ResponseBuilder,
    StreamTranslator,
    Translated,
    new_response_id,
    reshape_error,
    response_body,
    to_chat,
)

__all__ = ["Responses"]

_RESPONSES = frozenset({"responses", "responses.agent"})
_TRANSLATOR = "responses.translator"
_REQUEST = "responses.request"


class Responses:
    """Sets `capture.client_view` (a `ClientView`: the Responses request, its `resp_…` id and, at the end, the
    Response the client received) and `responses.translator`, `responses.request` (its own). Reads
    `route.requested_model` and the targets route planned in `flow.upstreams`."""

    short_name = "responses"
    """Its name in a chain, and what other addons' `after` call it."""

    after = {"route": "it points the targets route planned at the upstream's /chat/completions"}

    routes = (
        *model_api_routes(
            "responses",
            "POST",
            "/v1/responses",
            RouteKind.LLM,
            "OpenAI Responses (as chat completions upstream).",
        ),
    )

    # --- hooks -------------------------------------------------------------------------------------------------

    def request(self, flow: Flow) -> None:
        if flow.route.name not in _RESPONSES:
            return
        req = flow.request
        original = req.body
        parsed = req.json_object()
        if parsed.get("previous_response_id") is not None:
            raise BadRequest(
                "previous_response_id: not supported yet by this gateway; send the conversation's items in `input` "
                "(as Codex and the Agents SDK do by default)",
                param="previous_response_id",
            )
        translated = to_chat(parsed)
        # Nothing changed before this point: a bad request leaves the flow as it came (and capture records it).
        req.replace_json(translated.chat)
        flow.metadata[_REQUEST] = translated
        flow.metadata[CLIENT_VIEW] = ClientView("responses", original, new_response_id())
        req.path = req.path[: -len("/responses")] + "/chat/completions"  # capture parses what it now is
        for target in flow.upstreams:
            path = target.url.raw_path
            target.url = target.url.with_path(
                path[: path.rfind("/responses")] + "/chat/completions", encoded=True
            )

    def response_headers(self, flow: Flow) -> None:
        resp = flow.response
        if resp is None or flow.route.name not in _RESPONSES:
            return
        if not resp.from_upstream:
            if resp.status >= 400:
                resp.body = reshape_error(resp.status, resp.body)
            return
        if resp.status >= 300:
            resp.transforms.append(WholeBody(partial(reshape_error, resp.status)))
            return
        view = flow.metadata.get(CLIENT_VIEW)
        translated: Any = flow.metadata.get(_REQUEST)
        if not isinstance(view, ClientView) or not isinstance(translated, Translated):
            return
        model = str(flow.metadata.get("route.requested_model") or translated.chat.get("model") or "")
        builder = ResponseBuilder(translated, model, view.client_id)
        if resp.is_event_stream:
            translator = StreamTranslator(builder, view)
            flow.metadata[_TRANSLATOR] = translator
            resp.transforms.append(translator)
        else:
            resp.transforms.append(WholeBody(partial(response_body, builder=builder, view=view)))

    def error(self, flow: Flow) -> None:
        translator = flow.metadata.get(_TRANSLATOR)
        if isinstance(translator, StreamTranslator):
            translator.snapshot()
