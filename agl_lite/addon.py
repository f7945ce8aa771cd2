"""Everything an addon author imports, in one module: `from agl_lite import addon`.

An addon is a plain class whose method names are hook names (`docs/architecture.md`, "Hooks"). This module is its
whole face: the flow and what it carries, options and config, services (the store among them), routes and
endpoints (`Endpoints`: an /api endpoint declared once, its body model, query parameters and handler), the SSE
parser, the records capture leaves, and the errors to raise. What is not here is internal and may change without
notice. `agl_lite.testing.addons` is its testing kit.
"""

from __future__ import annotations

from agl_lite.core.api import Call, Endpoints, Param
from agl_lite.core.config import GatewayConfig, option
from agl_lite.core.flow import (
    Flow,
    Request,
    Response,
    Tap,
    Transform,
    WholeBody,
    error_response,
    json_response,
)
from agl_lite.core.hooks import all_hooks
from agl_lite.core.routes import HttpRoute, RouteKind, Scope
from agl_lite.core.services import LoadContext, ServiceKey, Services
from agl_lite.core.sse import SSEEvent, SSEParser
from agl_lite.errors import (
    BadRequest,
    ConfigError,
    Forbidden,
    HttpError,
    NotFound,
    ServiceUnavailable,
    TooManyRequests,
)
from agl_lite.store.records import CallOutcome, ChoiceRecord, Event, LLMCall
from agl_lite.store.rules import STORE, Store

__all__ = [
    "STORE",
    "BadRequest",
    "Call",
    "CallOutcome",
    "ChoiceRecord",
    "ConfigError",
    "Endpoints",
    "Event",
    "Flow",
    "Forbidden",
    "GatewayConfig",
    "HttpError",
    "HttpRoute",
    "LLMCall",
    "LoadContext",
    "NotFound",
    "Param",
    "Request",
    "Response",
    "RouteKind",
    "SSEEvent",
    "SSEParser",
    "Scope",
    "ServiceKey",
    "ServiceUnavailable",
    "Services",
    "Store",
    "Tap",
    "TooManyRequests",
    "Transform",
    "WholeBody",
    "all_hooks",
    "error_response",
    "json_response",
    "option",
]
