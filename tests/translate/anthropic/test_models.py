"""The route addon's OpenAI model list in the Anthropic shape, as the SDK's models.list() validates it."""

from __future__ import annotations

import json

from anthropic.types import ModelInfo

from agl_lite.translate.anthropic.models import models_list


def test_openai_list_becomes_an_anthropic_page() -> None:
    openai = {
        "object": "list",
        "data": [
            {"id": "qwen", "object": "model", "created": 1700000000, "owned_by": "agl-lite"},
            {"id": "claude-haiku", "object": "model", "created": 1700000000, "owned_by": "agl-lite"},
        ],
    }
    got = json.loads(models_list(json.dumps(openai).encode()) or b"")
    assert [m["id"] for m in got["data"]] == ["qwen", "claude-haiku"]
    assert (got["has_more"], got["first_id"], got["last_id"]) == (False, "qwen", "claude-haiku")
    card = ModelInfo.model_validate(got["data"][0])
    assert (card.type, card.display_name, card.created_at.year) == ("model", "qwen", 2023)


def test_an_empty_list_has_no_first_or_last_id() -> None:
    got = json.loads(models_list(b'{"object": "list", "data": []}') or b"")
    assert got == {"data": [], "has_more": False, "first_id": None, "last_id": None}


def test_anything_else_is_left_alone() -> None:
    assert models_list(b"not json") is None
    assert models_list(b'{"error": {"message": "no"}}') is None
