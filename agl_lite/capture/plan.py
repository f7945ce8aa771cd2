"""What capture asks vLLM for beyond the client's request, and what of it the client must then not see.

A record needs the exact token ids (`return_token_ids`), a stream needs its usage (`stream_options`), and the
configuration may ask for logprobs. The plan is the top-level fields to add; `inject` sets them on the request, and
the `Strip` it comes with tells the client view (`strip`) what to take out again.
"""

from __future__ import annotations

from typing import Any

from agl_lite.capture.strip import Strip
from agl_lite.core.flow import Request

__all__ = ["NOTHING", "asked", "inject", "plan"]

NOTHING = Strip()
"""Nothing injected: nothing to strip."""


_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
"""The strings pydantic's lax booleans read as true, in any case (and not stripped): what vLLM's request parsing
takes for `true`."""


def asked(value: Any) -> bool:
    """Whether a client's boolean option is on, as vLLM's (lax, pydantic) request parsing reads it: `true`, the
    numbers 1 and 1.0, and `"yes"`, `"on"`, `"t"`... in any case."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return value == 1
    return isinstance(value, str) and value.lower() in _TRUE


def plan(
    body: dict[str, Any], api: str, *, logprobs: bool, top_logprobs: int
) -> tuple[dict[str, Any], Strip]:
    """The top-level fields to set upstream for the record, and what of it the client did not ask for."""
    added: dict[str, Any] = {}
    if not asked(body.get("return_token_ids")):
        added["return_token_ids"] = True
    if asked(body.get("stream")):  # vLLM rejects stream_options on a non-streamed request
        so = body.get("stream_options")
        if not (isinstance(so, dict) and asked(so.get("include_usage"))):
            options = {**so, "include_usage": True} if isinstance(so, dict) else {"include_usage": True}
            if "continuous_usage_stats" in options:
                # vLLM puts usage in every chunk only with include_usage too: the client, who did not ask for
                # that, would get it in every chunk it reads, where vLLM would have sent it no usage at all.
                options["continuous_usage_stats"] = False
            added["stream_options"] = options
    if logprobs:
        if api == "chat":
            if not asked(body.get("logprobs")):
                added["logprobs"] = True
                if top_logprobs and body.get("top_logprobs") is None:
                    added["top_logprobs"] = top_logprobs
        elif body.get("logprobs") is None:  # completions: an int, and 0 is a request too
            added["logprobs"] = top_logprobs
    if not added:
        return added, NOTHING
    return added, Strip("return_token_ids" in added, "stream_options" in added, "logprobs" in added)


def inject(req: Request, added: dict[str, Any]) -> None:
    """Set `added` on the request (new members are spliced into its bytes, see `Request.set_fields`)."""
    req.set_fields(added)
