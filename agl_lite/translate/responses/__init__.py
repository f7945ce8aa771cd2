"""The OpenAI Responses API translated to and from chat completions, so Responses clients (Codex CLI, the OpenAI
Agents SDK, `client.responses.create`) get vLLM's token ids captured like any chat client: requests in
(`request`), responses and event streams out (`builder`, `stream`), errors in the Responses shape. Wire formats
only: nothing here knows flows, hooks or storage.
"""

from agl_lite.translate.responses.builder import ResponseBuilder, new_response_id, usage_of
from agl_lite.translate.responses.request import CUSTOM_INPUT, Translated, to_chat
from agl_lite.translate.responses.stream import (
    StreamTranslator,
    encode,
    error_body,
    reshape_error,
    response_body,
)

__all__ = [
    "CUSTOM_INPUT",
    "ResponseBuilder",
    "StreamTranslator",
    "Translated",
    "encode",
    "error_body",
    "new_response_id",
    "reshape_error",
    "response_body",
    "to_chat",
    "usage_of",
]
