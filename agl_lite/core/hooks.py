"""Every hook an addon can implement, declared once as a dataclass whose docstring says when it fires.

An addon implements a hook by having a method with the hook's `name`, sync or async, taking the hook's fields as
positional arguments. `docs/architecture.md` carries the reference generated from this module
(`python -m agl_lite.core.hooks`). This module holds declarations only.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from agl_lite.core.config import GatewayConfig
    from agl_lite.core.flow import Flow
    from agl_lite.core.services import LoadContext

__all__ = [
    "ConfigureHook",
    "ErrorHook",
    "FlowDoneHook",
    "Hook",
    "LoadHook",
    "RequestHeadersHook",
    "RequestHook",
    "ResponseEndHook",
    "ResponseHeadersHook",
    "RunningHook",
    "ShutdownHook",
    "all_hooks",
]

all_hooks: dict[str, type[Hook]] = {}


@dataclass
class Hook:
    name: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.name in all_hooks:
            raise RuntimeError(f"hook {cls.name!r} declared twice")
        all_hooks[cls.name] = cls


# --- lifecycle -------------------------------------------------------------------------------------------------


@dataclass
class LoadHook(Hook):
    """Fires once, when the addon is added to the chain, before any config is applied.

    The addon may provide shared services to other addons through `ctx.services` (for example a store) and
    look up services others provide. No network I/O yet.
    """

    name = "load"
    ctx: LoadContext


@dataclass
class ConfigureHook(Hook):
    """Fires once after `load`, with the whole gateway config and this addon's own typed options.

    Validate here: raise `ConfigError` with a message naming the key, and start-up stops with it. No network I/O.
    """

    name = "configure"
    config: GatewayConfig
    options: Any


@dataclass
class RunningHook(Hook):
    """Fires once the server is listening. Start background loops here with `ctx.tasks.spawn` (never bare tasks)."""

    name = "running"


@dataclass
class ShutdownHook(Hook):
    """Fires once at shutdown, after the server stopped accepting requests; release resources here."""

    name = "shutdown"


# --- per flow --------------------------------------------------------------------------------------------------


@dataclass
class RequestHeadersHook(Hook):
    """Fires when the request's line and headers are in, before its body is read (`flow.request.body` is empty), in
    chain order.

    For checks that need no body, above all the key's: answering here (setting `flow.response` or raising an
    `HttpError`) spares reading the body at all, so an unauthenticated client cannot make the gateway hold up to
    `max_body_bytes` for it; the connection closes after the answer. `request` does not fire then.
    """

    name = "request_headers"
    flow: Flow


@dataclass
class RequestHook(Hook):
    """Fires when a request has been read (headers and body), in chain order.

    Everything may still change: headers, the JSON body (`flow.request.set_fields()` for top-level members,
    `flow.request.replace_json()` for a whole translation), `flow.upstreams`. Setting `flow.response` (or
    raising an `HttpError`) answers the request at once: later `request` handlers are skipped and the upstream is
    never contacted. An unexpected exception fails the flow closed with a 500 JSON error, so a crashing auth addon
    can never let a request through.
    """

    name = "request"
    flow: Flow


@dataclass
class ResponseHeadersHook(Hook):
    """Fires when the response status and headers are known, before they are sent to the client.

    For an upstream response the body has not been read yet: attach per-flow taps (`flow.response.taps`) to observe
    the upstream bytes and transforms (`flow.response.transforms`) to rewrite what the client receives. Status and
    headers may still change. Also fires for short-circuit responses (`flow.response.from_upstream` is False),
    including the error answer after an unreachable upstream (then after `error`, and not followed by
    `response_end`), so that an addon translating an API can reshape it. A mid-stream error event the core sends
    goes through the transforms, as the upstream's own events do.
    """

    name = "response_headers"
    flow: Flow


@dataclass
class ResponseEndHook(Hook):
    """Fires when the whole response body is known, before its last bytes are released to the client.

    This is the commit point: for a stream, the client has not received `data: [DONE]` yet; for a plain body, its
    last chunk is held. Awaiting here delays the end of the client's response, never its earlier bytes. Fires also
    for a stream that ended without `[DONE]` (then nothing is held back). Does not fire when `error` fires.
    Setting `flow.error` here refuses the end: the client gets that error instead (as an error event for a stream;
    as the response itself for a body none of which was sent yet; otherwise the connection is cut mid-body), so
    that nothing looks complete whose commit failed.
    """

    name = "response_end"
    flow: Flow


@dataclass
class ErrorHook(Hook):
    """Fires instead of `response_end` when the exchange failed: `flow.error` is set (upstream unreachable, reset or
    timed out mid-stream) or `flow.client_disconnected` is True. The client may already have part of the response.
    """

    name = "error"
    flow: Flow


@dataclass
class FlowDoneHook(Hook):
    """Fires exactly once per flow, last, whatever happened: release per-flow resources and count metrics here.

    The client's response is complete (or abandoned); nothing can change it any more. A request that matched no
    route (404, 405) is a flow too, seen by this hook only: its route is `unmatched`.
    """

    name = "flow_done"
    flow: Flow


def reference_markdown() -> str:
    """The hooks reference for docs/architecture.md, generated from the declarations above."""
    lines = ["| hook | arguments | when it fires |", "|---|---|---|"]
    for hook in all_hooks.values():
        fields = ", ".join(f.name for f in dataclasses.fields(hook))
        doc = " ".join(inspect.cleandoc(hook.__doc__ or "").split())
        lines.append(f"| `{hook.name}` | `{fields}` | {doc} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(reference_markdown(), end="")
