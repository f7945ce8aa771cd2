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
from agl_lite.core.flow import Flow, Refuse, WholeBody, json_response
from agl_lite.core.routes import RouteKind, model_api_routes
from agl_lite.core.services import LoadContext
from agl_lite.errors import BadRequest, NotFound, ServiceUnavailable
from agl_lite.store.records import CallOutcome, LLMCall
from agl_lite.store.rules import STORE, Store
from agl_lite.translate.responses import (
    ResponseBuilder,
    StreamTranslator,
    Translated,
    error_body,
    new_response_id,
    reshape_error,
    response_body,
    to_chat,
)

__all__ = ["Responses"]

_RESPONSES = frozenset({"responses", "responses.agent"})
_GET = frozenset({"responses.get", "responses.get.agent"})
_ITEMS = frozenset({"responses.input_items", "responses.input_items.agent"})
_DELETE = frozenset({"responses.delete", "responses.delete.agent"})
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
            errors="OpenAIError",
        ),
        *model_api_routes(
            "responses.get",
            "GET",
            "/v1/responses/{response_id}",
            RouteKind.API,
            "A stored Response.",
            errors="OpenAIError",
        ),
        *model_api_routes(
            "responses.delete",
            "DELETE",
            "/v1/responses/{response_id}",
            RouteKind.API,
            "Delete a stored Response (its captured call stays, the rollout's training data).",
            errors="OpenAIError",
        ),
        *model_api_routes(
            "responses.input_items",
            "GET",
            "/v1/responses/{response_id}/input_items",
            RouteKind.API,
            "The input items of a stored Response.",
            errors="OpenAIError",
        ),
    )

    def __init__(self) -> None:
        self._store: Store | None = None

    def load(self, ctx: LoadContext) -> None:
        self._ctx = ctx

    def configure(self, config: Any, options: None) -> None:
        self._store = self._ctx.services.get(STORE)  # (without a store: no state, each request stands alone)

    # --- hooks -------------------------------------------------------------------------------------------------

    async def request(self, flow: Flow) -> None:
        name = flow.route.name
        if name in _DELETE:
            stored = await self._stored(flow, flow.request.path_params["response_id"])
            assert self._store is not None  # (`_stored` found it there)
            if not await self._store.delete_response(stored.id):  # deleted meanwhile
                raise NotFound(f"no stored response {stored.id!r}")
            flow.response = json_response(200, {"id": stored.id, "object": "response", "deleted": True})
            return
        if name in _GET or name in _ITEMS:
            stored = await self._stored(flow, flow.request.path_params["response_id"])
            flow.response = json_response(
                200, stored.client_response if name in _GET else _input_items(stored)
            )
            return
        if name not in _RESPONSES:
            return
        req = flow.request
        original = req.body
        parsed = req.json_object()
        history: list[dict[str, Any]] = []
        previous = parsed.get("previous_response_id")
        if previous is not None:
            if not isinstance(previous, str):
                raise BadRequest("previous_response_id: must be a string", param="previous_response_id")
            history = _conversation(await self._stored(flow, previous, param="previous_response_id"))
        translated = to_chat(parsed, history)
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
        resp, name = flow.response, flow.route.name
        if resp is None or not (name in _RESPONSES or name in _GET or name in _ITEMS or name in _DELETE):
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
            resp.transforms.append(Refuse(502, error_body(502, encoded)))
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

    # --- conversation state ------------------------------------------------------------------------------------

    async def _stored(self, flow: Flow, response_id: str, param: str | None = None) -> LLMCall:
        """The stored call of a Response this key may see: its own rollout's (an agent key, or the admin key on an
        agent path), any (the admin key on the bare path); one answered in full and not created with
        `store: false`. Anything else is the same 404, so a key learns nothing of other rollouts' ids."""
        if self._store is None:
            raise ServiceUnavailable("responses are not stored: this gateway runs without a store")
        missing = NotFound(f"no stored response {response_id!r}", param=param)
        try:
            call: LLMCall = await self._store.response_call(response_id)
        except NotFound:
            raise missing from None
        rollout = flow.metadata.get("auth.rollout_id")
        stored = isinstance(call.request, dict) and call.request.get("store") is not False
        if call.api != "responses" or not stored or call.outcome is not CallOutcome.OK:
            raise missing
        if rollout is not None and call.rollout_id != rollout:
            raise missing
        if await self._store.response_deleted(response_id):
            raise missing
        return call


def _conversation(call: LLMCall) -> list[dict[str, Any]]:
    """The chat messages a continued Response starts from: the earlier call's, without its instructions (a
    Response's instructions are its own, not carried over), then its answer as the assistant's message. The new
    prompt so extends the earlier prompt and answer exactly, as a chat agent's does."""
    messages = list((call.upstream_request or {}).get("messages") or [])
    if isinstance(call.request, dict) and call.request.get("instructions") is not None and messages:
        messages = messages[1:]
    choice = call.choices[0] if call.choices else None
    if choice is not None:
        answer: dict[str, Any] = {"role": "assistant", "content": choice.text}
        if choice.tool_calls:
            answer["tool_calls"] = choice.tool_calls
        messages.append(answer)
    return messages


def _input_items(call: LLMCall) -> dict[str, Any]:
    """A stored Response's input as `GET …/input_items` lists it (newest first, as OpenAI lists them)."""
    given = call.request.get("input") if isinstance(call.request, dict) else None
    if isinstance(given, str):
        given = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": given}]}]
    items = [
        {"id": item.get("id") or f"{call.id}_in{i}", **item} if isinstance(item, dict) else item
        for i, item in enumerate(given or [])
    ][::-1]
    first = items[0].get("id") if items and isinstance(items[0], dict) else None
    last = items[-1].get("id") if items and isinstance(items[-1], dict) else None
    return {"object": "list", "data": items, "first_id": first, "last_id": last, "has_more": False}
