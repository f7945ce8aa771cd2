"""The Anthropic Messages API translated to and from chat completions, so Anthropic clients (Claude Code) get
vLLM's token ids captured like any OpenAI client: requests in (`request`), responses and event streams out
(`message`, `stream`), error objects (`errors`) and the models list (`models`). Wire formats only: nothing here
knows flows, hooks or storage.
"""

from agl_lite.translate.anthropic.errors import error_body, error_event, error_type, reshape_error
from agl_lite.translate.anthropic.message import MessageBuilder, new_message_id
from agl_lite.translate.anthropic.models import model_info, models_list
from agl_lite.translate.anthropic.request import to_chat, to_tokenize
from agl_lite.translate.anthropic.stream import StreamTranslator, message_body, token_count_body

__all__ = [
    "MessageBuilder",
    "StreamTranslator",
    "error_body",
    "error_event",
    "error_type",
    "message_body",
    "model_info",
    "models_list",
    "new_message_id",
    "reshape_error",
    "to_chat",
    "to_tokenize",
    "token_count_body",
]
