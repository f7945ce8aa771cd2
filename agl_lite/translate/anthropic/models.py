"""The gateway's model list (OpenAI's shape, from the route addon) in the Anthropic shape, for Anthropic clients
(Claude Code lists models with `GET /v1/models`). It must not decide which models exist.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson

from agl_lite.core.jsoncodec import loads_or_none

__all__ = ["model_info", "models_list"]


def _card(model: dict[str, Any]) -> dict[str, Any] | None:
    name = model.get("id")
    if not isinstance(name, str):
        return None
    created = model.get("created")
    when = datetime.fromtimestamp(created if isinstance(created, int | float) else 0, UTC)
    return {
        "type": "model",
        "id": name,
        "display_name": name,
        "created_at": when.isoformat().replace("+00:00", "Z"),
        "lifecycle": "active",
    }


def models_list(body: bytes | None) -> bytes | None:
    """`{"data": [ModelInfo...], "has_more", "first_id", "last_id"}`; None if `body` is not an OpenAI list."""
    obj = loads_or_none(body)
    data = obj.get("data") if isinstance(obj, dict) else None
    if not isinstance(data, list):
        return None
    cards = [c for c in (_card(m) for m in data if isinstance(m, dict)) if c is not None]
    return orjson.dumps(
        {
            "data": cards,
            "has_more": False,
            "first_id": cards[0]["id"] if cards else None,
            "last_id": cards[-1]["id"] if cards else None,
        }
    )


def model_info(body: bytes | None) -> bytes | None:
    """One ModelInfo (`GET /v1/models/{model_id}`); None if `body` is not an OpenAI model card."""
    obj = loads_or_none(body)
    card = _card(obj) if isinstance(obj, dict) else None
    return orjson.dumps(card) if card is not None else None
