"""The client's side of a translated call: an addon that speaks another API to the client (Anthropic Messages) than
to the upstream (chat completions) leaves a `ClientView` in `flow.metadata[CLIENT_VIEW]`, and capture folds it into
the record, so the record keeps both views. It must not know any API's wire format.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agl_lite.core.jsoncodec import loads_or_none
from agl_lite.store.records import LLMCall

__all__ = ["CLIENT_VIEW", "ClientView", "apply_client_view"]

CLIENT_VIEW = "capture.client_view"
"""The metadata key a translating addon sets (to a `ClientView`) in `request`, once it has translated."""


@dataclass(slots=True, eq=False)
class ClientView:
    api: str
    """The API the client spoke (`messages`); becomes the record's `api`."""
    request: bytes
    """The client's body as it arrived, decoded only when the record is built."""
    client_id: str | None = None
    """The response id the client sees (`msg_...`)."""
    response: Any = None
    """The response as the client received it (for a stream: the message its events add up to); set by the
    translator when the response ends, before capture builds the record."""


def apply_client_view(record: LLMCall, view: ClientView | None) -> None:
    """Make `record` hold the client's request and response beside the upstream's (which it already holds)."""
    if view is None:
        return
    record.upstream_request = record.request
    record.request = loads_or_none(view.request)
    record.api = view.api
    if view.client_id is not None:
        record.client_id = view.client_id
        # stored under its response id: GET /v1/responses/{id}, previous_response_id
        if view.api == "responses":
            record.id = view.client_id
    record.client_response = view.response
