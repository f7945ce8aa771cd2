"""Build flows and run addons on them without a server: for unit tests of addons (yours too).

`make_flow` matches the path against a route table, as the server would, so path params and scope are real.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from multidict import CIMultiDict

from agl_lite.core.flow import Flow, Request
from agl_lite.core.routes import HttpRoute, RouteTable
from agl_lite.core.server import CORE_ROUTES

__all__ = ["make_flow"]


def make_flow(
    method: str,
    path: str,
    *,
    json_body: Any = None,
    body: bytes = b"",
    headers: Mapping[str, str] | None = None,
    routes: Iterable[HttpRoute] = (),
    query_string: str = "",
) -> Flow:
    """A flow for `method path`, matched against `routes` (plus the core's own routes)."""
    table = RouteTable([*CORE_ROUTES, *routes])
    match = table.match(method, path)
    if json_body is not None:
        body = json.dumps(json_body).encode()
    hdrs: CIMultiDict[str] = CIMultiDict(headers or {})
    if json_body is not None:
        hdrs.setdefault("Content-Type", "application/json")
    return Flow(request=Request(method, path, query_string, hdrs, body, match.params), route=match.route)
