"""The route table: every HTTP route the service answers, declared once with its scope.

Addons declare the routes they serve (class attribute `routes`); the table is built from the chain, the server
matches each request against it once, and auth enforces the matched route's scope. It does no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from agl_lite.core.contract import ATTRIBUTED_PREFIX
from agl_lite.errors import ConfigError, MethodNotAllowed, NotFound

__all__ = [
    "ID_PATTERN",
    "PATH_PARAM",
    "HttpRoute",
    "RouteKind",
    "RouteMatch",
    "RouteTable",
    "Scope",
    "model_api_routes",
    "path_params",
    "path_template",
]


class Scope(StrEnum):
    """Who may call a route."""

    PUBLIC = "public"
    """Anyone, no key."""
    AGENT = "agent"
    """The agent key of the rollout in the path (or the admin key)."""
    GRADER = "grader"
    """The grader key of the rollout in the path (or the admin key)."""
    ADMIN = "admin"
    """Only the admin key (`AGL_KEY`)."""
    SESSION = "session"
    """The admin key, or a browser session the route's addon checks itself (the dashboard's cookie): `auth` lets a
    request without a key through, and holds a key that is sent to the admin scope's rule."""


class RouteKind(StrEnum):
    LLM = "llm"
    """Forwarded to an inference upstream; captured."""
    API = "api"
    """Answered by an addon."""
    PAGE = "page"
    """A page of the web dashboard (HTML, or the JSON its own script asks for): answered by an addon, and not part
    of the API's OpenAPI document."""


_PARAM = re.compile(r"\{([a-z_]+)(?::(path))?\}")
_SEGMENT = "[A-Za-z0-9_-]{1,128}"
ID_PATTERN = re.compile(_SEGMENT)
"""What a path parameter (rollout id, attempt id, ...) may hold: URL- and label-safe, no dots (keys use them).
Use `fullmatch`: `$` also matches before a trailing newline (issue #15 H4)."""
PATH_PARAM = "[!-~]{1,512}"
"""What a `{name:path}` parameter may hold: the rest of the path, slashes included (a model id such as
`Qwen/Qwen2.5-0.5B`, sent raw by some clients and percent-encoded by others), printable ASCII without spaces;
the route's handler percent-decodes it. Only for names looked up, never for ids that become keys or files."""


_NO_QUERY: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class HttpRoute:
    name: str
    method: str
    path: str
    """Path pattern; `{name}` matches one path segment of `ID_PATTERN`, `{name:path}` the rest of the path
    (`PATH_PARAM`)."""
    scope: Scope
    kind: RouteKind = RouteKind.API
    summary: str = ""
    # What an endpoint answered by an addon takes and gives (`core.api` declares them, the OpenAPI document states
    # them); not part of a route's identity.
    body: type[Any] | None = field(default=None, compare=False)
    """The pydantic model of its JSON body; None when it takes none."""
    query: Mapping[str, Any] = field(default_factory=lambda: _NO_QUERY, compare=False)
    """Its query parameters (`core.api.Param` by name); any other is a 400."""
    status: int = field(default=200, compare=False)
    """The status of its success."""
    media: str = field(default="application/json", compare=False)
    """The media type of its success's body."""
    errors: str = field(default="Error", compare=False)
    """The OpenAPI schema its errors follow: the gateway's own, or a translated API's (`OpenAIError`)."""


@dataclass(frozen=True, slots=True)
class RouteMatch:
    route: HttpRoute
    params: Mapping[str, str]


def path_params(path: str) -> list[tuple[str, str]]:
    """Each parameter of a path pattern, in order: its name and the regex its value must fully match."""
    return [(m[1], PATH_PARAM if m[2] else _SEGMENT) for m in _PARAM.finditer(path)]


def path_template(path: str) -> str:
    """The pattern as an OpenAPI path template (`{name:path}` becomes `{name}`)."""
    return _PARAM.sub(r"{\1}", path)


def model_api_routes(
    name: str, method: str, path: str, kind: RouteKind, summary: str = "", *, errors: str = "Error"
) -> tuple[HttpRoute, ...]:
    """Declare a model-API endpoint twice: bare for the admin key (unattributed), and under the agent prefix."""
    return (
        HttpRoute(name, method, path, Scope.ADMIN, kind, summary, errors=errors),
        HttpRoute(
            f"{name}.agent", method, ATTRIBUTED_PREFIX + path, Scope.AGENT, kind, summary, errors=errors
        ),
    )


_SEEN_PATHS = 4096
"""Dynamic paths whose match is remembered (agents reuse theirs for every call)."""


class RouteTable:
    """Matches (method, path) to a route: a dict for static paths, compiled patterns for the rest."""

    def __init__(self, routes: Iterable[HttpRoute]) -> None:
        self.routes: tuple[HttpRoute, ...] = tuple(routes)
        self._static: dict[str, dict[str, HttpRoute]] = {}
        self._dynamic: list[tuple[re.Pattern[str], dict[str, HttpRoute]]] = []
        self._seen: dict[str, tuple[dict[str, HttpRoute], Mapping[str, str]]] = {}
        patterns: dict[str, dict[str, HttpRoute]] = {}
        for route in self.routes:
            methods = self._static if "{" not in route.path else patterns
            by_method = methods.setdefault(route.path, {})
            if route.method in by_method:
                raise ConfigError(
                    f"route {route.method} {route.path} is declared twice "
                    f"({by_method[route.method].name!r} and {route.name!r})"
                )
            by_method[route.method] = route
        for path, by_method in patterns.items():
            first, *rest = _PARAM.split(path)[::3]  # literal, name, kind, literal, name, kind, ..., literal
            regex = re.escape(first) + "".join(
                f"(?P<{name}>{value})" + re.escape(lit)
                for (name, value), lit in zip(path_params(path), rest, strict=True)
            )
            self._dynamic.append((re.compile(regex), by_method))

    def match(self, method: str, path: str) -> RouteMatch:
        """The route for a request; NotFound or MethodNotAllowed (with the allowed methods) otherwise."""
        by_method = self._static.get(path)
        params: Mapping[str, str] = {}
        if by_method is None:
            hit = self._seen.get(path)
            if hit is not None:
                by_method, params = hit
            else:
                for regex, candidates in self._dynamic:
                    # not `match` with `$`: that takes a path with a trailing newline
                    m = regex.fullmatch(path)
                    if m is not None:
                        by_method, params = candidates, MappingProxyType(m.groupdict())
                        break
                else:
                    raise NotFound(f"no route for {path}")
                # An agent sends all its calls to one path: the regexes run once per path, not per call.
                if len(self._seen) >= _SEEN_PATHS:
                    self._seen.clear()  # (paths are the client's: bounded, and only those that matched)
                self._seen[path] = (by_method, params)
        route = by_method.get(method)
        if route is None and method == "HEAD":
            route = by_method.get("GET")
        if route is None:
            allowed = ", ".join(sorted(by_method))
            raise MethodNotAllowed(
                f"{method} is not allowed on {path}; allowed: {allowed}", headers={"Allow": allowed}
            )
        return RouteMatch(route, params)
