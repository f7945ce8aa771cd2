"""The service's own JSON endpoints, each declared once: its route (method, path, scope), its body model, its query
parameters, its success status and media type, and its handler, whose name and docstring name and describe it.
The parsing, the 400s and the OpenAPI document (`store.openapi`) all come from that one declaration.

An addon builds an `Endpoints` table with its decorator, serves `table.routes` as its `routes` (set after the last
endpoint: the addon manager refuses an endpoint missing from them), and answers with `await
table.dispatch(self, flow)` in its `request` hook:

    class Things:
        table = Endpoints()

        @table.endpoint("POST", "/api/things", Scope.ADMIN, body=ThingIn, status=201)
        async def things_add(self, call: Call) -> Any:
            '''Add one.'''
            return {"thing": call.body.name}

        routes = table.routes

        async def request(self, flow: Flow) -> None:
            await self.table.dispatch(self, flow)

A table belongs to the class that declares it (a subclass that adds endpoints declares a table of its own).

Must not do I/O (the handlers do).
"""

from __future__ import annotations

import math
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal
from urllib.parse import parse_qs

import orjson
from multidict import CIMultiDict
from pydantic import BaseModel, ValidationError

from agl_lite.core.flow import Flow, Response
from agl_lite.core.jsoncodec import loads_storable
from agl_lite.core.routes import HttpRoute, RouteKind, Scope
from agl_lite.errors import BadRequest

__all__ = ["Call", "Endpoints", "Handler", "Param", "parse_body"]

_INTEGER = re.compile(r"-?[0-9]{1,20}", re.ASCII)
_NUMBER = re.compile(r"-?[0-9]{1,20}(?:\.[0-9]{1,20})?(?:[eE][-+]?[0-9]{1,4})?", re.ASCII)
"""A JSON number (what the OpenAPI document's `number` lets a client send), in plain ASCII."""


NO_NUL = r"^[^\x00]*$"
"""Every string query parameter: no NUL (no backend's text holds one); a parameter's own pattern excludes it too."""


@dataclass(frozen=True, slots=True)
class Param:
    """A query parameter: a JSON-schema type with its bounds, parsed strictly (`int()` and `float()` also take
    "1_000", "+5", " 5" and non-ASCII digits; a query parameter takes plain ASCII digits only)."""

    type: Literal["integer", "number", "string"]
    default: Any = None
    """What the handler gets when the parameter is absent."""
    minimum: float | None = None
    maximum: float | None = None
    enum: tuple[str, ...] = ()
    pattern: str = ""
    """A regex the value must match at its start (OpenAPI's `pattern` semantics)."""

    def schema(self) -> dict[str, Any]:
        """The parameter's JSON schema, as the OpenAPI document states it."""
        out: dict[str, Any] = {"type": self.type}
        for key in ("minimum", "maximum"):
            if (bound := getattr(self, key)) is not None:
                out[key] = bound
        if self.enum:
            out["enum"] = list(self.enum)
        if self.pattern:
            out["pattern"] = self.pattern
        elif self.type == "string" and not self.enum:
            out["pattern"] = NO_NUL  # (what `parse` refuses, as the document says it)
        if self.default is not None:
            out["default"] = self.default
        return out

    def parse(self, name: str, raw: str) -> Any:
        """`raw` as this parameter's type; a 400 naming the parameter otherwise."""
        if self.type == "string":
            if "\x00" in raw:
                # No backend's text can hold NUL (PostgreSQL refuses it): one rule for every string parameter.
                raise BadRequest(f"query parameter {name!r} must not hold a NUL character", param=name)
            if self.enum and raw not in self.enum:
                raise BadRequest(
                    f"query parameter {name!r} must be one of {', '.join(repr(e) for e in self.enum)}",
                    param=name,
                )
            if self.pattern and not re.match(self.pattern, raw):
                raise BadRequest(f"query parameter {name!r} must match {self.pattern}", param=name)
            return raw
        integer = self.type == "integer"
        if not (_INTEGER if integer else _NUMBER).fullmatch(raw):
            raise BadRequest(
                f"query parameter {name!r} must be {'an integer' if integer else 'a number'}", param=name
            )
        value = int(raw) if integer else float(raw)
        if not math.isfinite(value):  # 1e999
            raise BadRequest(f"query parameter {name!r} must be a finite number", param=name)
        lo, hi = self.minimum, self.maximum
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            lo_text = "" if lo is None else _number_text(lo)
            hi_text = "" if hi is None else _number_text(hi)
            if lo is not None and hi is not None:
                raise BadRequest(
                    f"query parameter {name!r} must be between {lo_text} and {hi_text}", param=name
                )
            raise BadRequest(
                f"query parameter {name!r} must be {'>= ' + lo_text if lo is not None else '<= ' + hi_text}",
                param=name,
            )
        return value


def _number_text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


@dataclass(frozen=True, slots=True)
class Call:
    """What a handler gets: the flow, its body as the endpoint's model, and every declared query parameter (its
    default when absent)."""

    flow: Flow
    body: Any
    query: Mapping[str, Any]

    @property
    def params(self) -> Mapping[str, str]:
        """The path's parameters (`rollout_id`, ...)."""
        return self.flow.request.path_params


Handler = Callable[[Any, Call], Awaitable[Any]]
"""An endpoint's handler, a method of the addon: its result is the JSON of the success response, or a whole
`Response` when it is not JSON."""


@dataclass(frozen=True, slots=True)
class _Endpoint:
    route: HttpRoute
    handler: Handler
    empty_body: Mapping[str, Any] | None


@dataclass(slots=True)
class Endpoints:
    """An addon's endpoints, in declaration order."""

    _by_route: dict[int, _Endpoint] = field(default_factory=dict)  # by id(): the table keeps its routes
    _routes: list[HttpRoute] = field(default_factory=list)

    def endpoint(
        self,
        method: str,
        path: str,
        scope: Scope,
        *,
        body: type[BaseModel] | None = None,
        empty_body: Mapping[str, Any] | None = None,
        query: Mapping[str, Param] | None = None,
        status: int = 200,
        media: str = "application/json",
        name: str | None = None,
    ) -> Callable[[Handler], Handler]:
        """Declare the decorated method as the handler of one endpoint. Its summary is the first line of the
        handler's docstring; its name the handler's, its first `_` a dot (`rollouts_list`: `rollouts.list`),
        unless `name` is given. `empty_body`: what a request without a body means (else a body is required when
        the endpoint takes one)."""

        def register(handler: Handler) -> Handler:
            doc = (handler.__doc__ or "").strip()
            if not doc:
                raise TypeError(f"endpoint handler {handler.__name__} needs a docstring: its summary")
            route = HttpRoute(
                name or handler.__name__.replace("_", ".", 1),
                method,
                path,
                scope,
                RouteKind.API,
                doc.splitlines()[0],
                body=body,
                query=MappingProxyType(dict(query or {})),
                status=status,
                media=media,
            )
            self._routes.append(route)
            self._by_route[id(route)] = _Endpoint(route, handler, empty_body)
            return handler

        return register

    @property
    def routes(self) -> tuple[HttpRoute, ...]:
        return tuple(self._routes)

    async def dispatch(self, addon: Any, flow: Flow) -> bool:
        """Answer `flow` when its route is one of these endpoints (its parameters, then its body, checked first);
        False when it is not."""
        endpoint = self._by_route.get(id(flow.route))
        if endpoint is None:  # (not ours: another addon's route, or an LLM call)
            return False
        route = endpoint.route
        query = _parse_query(route.query, flow.request.query_string)
        body = None
        if route.body is not None:
            raw = flow.request.body
            if not raw and endpoint.empty_body is not None:
                body = route.body.model_validate(endpoint.empty_body)
            else:
                body = parse_body(route.body, raw)
        result = await endpoint.handler(addon, Call(flow, body, query))
        flow.response = (
            result
            if isinstance(result, Response)
            else Response(route.status, CIMultiDict({"Content-Type": route.media}), body=orjson.dumps(result))
        )
        return True


def _parse_query(params: Mapping[str, Param], query_string: str) -> dict[str, Any]:
    """Every declared parameter (the last of repeated ones; a blank one is kept, so that it fails its check). An
    unknown one is a 400, as an unknown body field is: a typo must not pass for a default."""
    values = {p: spec.default for p, spec in params.items()}
    if not query_string:
        return values
    given = parse_qs(query_string, keep_blank_values=True)
    unknown = sorted(given.keys() - params.keys())
    if unknown:
        raise BadRequest(f"unknown query parameter(s) {unknown}; known: {sorted(params) or 'none'}")
    for name, raw in given.items():
        values[name] = params[name].parse(name, raw[-1])
    return values


def parse_body(model: type[BaseModel], body: bytes) -> Any:
    """Validate a JSON body into `model`; every problem is one 400 naming the field. Deeper, or with integers
    wider, than the store can hold is refused here, before a write."""
    if not body:
        raise BadRequest("a JSON body is required")
    raw = loads_storable(body)
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        errors = exc.errors()
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'body'}: {err['msg']}" for err in errors[:5]
        )
        first = ".".join(str(p) for p in errors[0]["loc"]) if errors else ""
        if first:
            raise BadRequest(f"invalid request: {problems}", param=first) from None
        raise BadRequest(f"invalid request: {problems}") from None
