"""API translations: what a client speaks (the Anthropic Messages API, the OpenAI Responses API) to the chat
completions the upstream serves, and back, byte for byte where the client sees it (`chunks` reads the upstream's
event stream for both). Wire formats only: nothing here knows flows, hooks or storage.
"""

from __future__ import annotations

import itertools
import secrets

_PREFIX = secrets.token_hex(6)
_numbers = itertools.count(1)


def new_id(prefix: str) -> str:
    """`prefix` and a process-unique tail: unique across processes without reading os.urandom per id (the hot path
    pays for that under load)."""
    return f"{prefix}{_PREFIX}{next(_numbers):08x}"
