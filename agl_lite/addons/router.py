"""Router (the `route` addon): maps a request's public model name (or alias) to upstreams from `routes.toml`
and rewrites the model.

Chooses the order to try upstreams in (round robin, least in-flight, or sticky by rollout for prefix-cache
locality), cools down upstreams that keep failing, and answers `GET /v1/models`. Sets `route.model`,
`route.requested_model`, `route.backend`, `route.model_version`; the core does the forwarding and the
before-first-byte retries.

Models registered in the store (`POST /api/models`: name → endpoints + version, what a weight sync writes) are
served beside `routes.toml`: a registered name that `routes.toml` also routes keeps its aliases, backend and
strategy and takes the registered endpoints and version; any other registered name is a new vLLM route. The store
tells this addon of each registration before it answers the POST, so every call after it goes to the new version.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any
from urllib.parse import unquote

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from yarl import URL

from agl_lite.core.config import GatewayConfig, load_toml, option, parse_dataclass
from agl_lite.core.flow import Flow, UpstreamTarget, json_response
from agl_lite.core.routes import RouteKind, model_api_routes
from agl_lite.core.services import METRICS_REGISTRY, LoadContext
from agl_lite.core.upstream_urls import endpoint_problem
from agl_lite.errors import BadRequest, ConfigError, ModelNotFound
from agl_lite.store.records import ModelRecord
from agl_lite.store.rules import STORE, Store

__all__ = ["ModelRoute", "Router", "RoutesFile", "Strategy", "UpstreamSpec", "load_routes"]


class Strategy(StrEnum):
    ROUND_ROBIN = "round_robin"
    LEAST_INFLIGHT = "least_inflight"
    STICKY = "sticky"
    """The same rollout goes to the same upstream while it is healthy (its KV prefix cache is there)."""


@dataclass(frozen=True, slots=True)
class UpstreamSpec:
    base_url: str = option(
        "", "OpenAI-style base URL of the server, with `/v1` (e.g. `http://127.0.0.1:8000/v1`)."
    )
    served_model: str = option("", "Model name the upstream serves; empty means the route's own name.")
    api_key_env: str = option("", "Environment variable holding the upstream's own key (sent as Bearer).")
    api_key: str = option("", "The upstream's key as a literal; prefer `api_key_env`.")


@dataclass(frozen=True, slots=True)
class ModelRoute:
    aliases: tuple[str, ...] = option((), "Other names clients may use for this model (e.g. `gpt-4.1`).")
    backend: str = option(
        "vllm", "What serves it: `vllm` (token ids captured) or `openai` (any compatible API)."
    )
    strategy: Strategy = option(
        Strategy.STICKY, "Upstream choice: `round_robin`, `least_inflight` or `sticky`."
    )
    upstreams: tuple[UpstreamSpec, ...] = option((), "Servers of this model, tried in strategy order.")
    version: str = option(
        "",
        "Model version recorded with every call (empty: none), until a registration in the store sets one.",
    )


@dataclass(frozen=True, slots=True)
class RoutesFile:
    models: Mapping[str, ModelRoute] = option({}, "Public model name → its route.")


def load_routes(path: str) -> RoutesFile:
    """Read and check routes.toml; every problem names the key and the file."""
    routes = parse_dataclass(RoutesFile, load_toml(path), file=path)
    seen: dict[str, str] = {}
    for name, model in routes.models.items():
        if not model.upstreams:
            raise ConfigError(f"{path}: models.{name}.upstreams is empty; give at least one upstream")
        for i, up in enumerate(model.upstreams):
            problem = endpoint_problem(up.base_url)
            if problem is not None:
                shown = up.base_url if "@" not in up.base_url else "(not shown: it holds credentials)"
                raise ConfigError(
                    f"{path}: models.{name}.upstreams[{i}].base_url must be an http(s) URL, but {problem}: {shown}"
                )
        for public in (name, *model.aliases):
            if public in seen:
                raise ConfigError(
                    f"{path}: model name {public!r} is used by both {seen[public]!r} and {name!r}"
                )
            seen[public] = name
    return routes


@dataclass(eq=False)
class _UpstreamState:
    """Health and load of one upstream; it is the core's observer for attempts on it."""

    spec: UpstreamSpec
    base: str
    headers: dict[str, str]
    served_model: str
    cooldown_s: float
    failures_to_cool: int
    inflight: int = 0
    failures: int = 0
    cool_until: float = 0.0
    _urls: dict[str, URL] = field(default_factory=dict)

    def url(self, suffix: str) -> URL:
        """The upstream URL for an API path suffix; cached, since a handful of suffixes serve every request."""
        url = self._urls.get(suffix)
        if url is None:
            url = URL(self.base + suffix, encoded=True)
            if len(self._urls) < 64:  # query strings could make the key space unbounded
                self._urls[suffix] = url
        return url

    def attempt_started(self, target: UpstreamTarget) -> None:
        self.inflight += 1

    def attempt_ended(self, target: UpstreamTarget, *, ok: bool) -> None:
        self.inflight -= 1
        if ok:
            self.failures = 0
            return
        self.failures += 1
        if self.failures >= self.failures_to_cool:
            self.cool_until = time.monotonic() + self.cooldown_s

    def healthy(self, now: float) -> bool:
        return self.cool_until <= now


@dataclass(eq=False)
class _ModelState:
    name: str
    route: ModelRoute
    upstreams: list[_UpstreamState]
    version: str | None = None
    counter: itertools.count[int] = field(default_factory=itertools.count)

    def order(self, rollout_id: str | None) -> list[_UpstreamState]:
        ups = self.upstreams
        if len(ups) == 1:
            return ups
        now = time.monotonic()
        healthy = [u for u in ups if u.healthy(now)]
        cooling = [u for u in ups if not u.healthy(now)]  # still tried, last, rather than failing outright
        strategy = self.route.strategy
        if strategy is Strategy.STICKY and rollout_id is not None:
            healthy.sort(
                key=lambda u: hashlib.blake2b(f"{rollout_id}|{u.base}".encode(), digest_size=8).digest(),
                reverse=True,
            )
        elif healthy:
            start = next(self.counter) % len(healthy)
            healthy = healthy[start:] + healthy[:start]
            if strategy is not Strategy.ROUND_ROBIN:
                healthy.sort(key=lambda u: u.inflight)  # stable: round robin among equally loaded
        return healthy + cooling


class _UpstreamGauges(Collector):
    """Each upstream's load and health, read from the route addon's own state when scraped."""

    def __init__(self, route: Router) -> None:
        self._route = route

    def collect(self) -> Iterator[Metric]:
        in_flight = GaugeMetricFamily(
            "agl_upstream_in_flight",
            "Attempts in flight on each upstream (what least_inflight and sticky routing weigh).",
            labels=["model", "upstream"],
        )
        cooling = GaugeMetricFamily(
            "agl_upstream_cooling",
            "1 while an upstream is in its cool-down after repeated failures (tried last).",
            labels=["model", "upstream"],
        )
        now = time.monotonic()
        for state in self._route.models():
            for up in state.upstreams:
                in_flight.add_metric([state.name, up.base], up.inflight)
                cooling.add_metric([state.name, up.base], 0.0 if up.healthy(now) else 1.0)
        yield in_flight
        yield cooling


class Router:
    short_name = "route"
    """Its name in a chain, and what other addons' `after` call it."""
    routes = (
        *model_api_routes(
            "chat_completions", "POST", "/v1/chat/completions", RouteKind.LLM, "OpenAI chat completions."
        ),
        *model_api_routes(
            "completions", "POST", "/v1/completions", RouteKind.LLM, "OpenAI text completions."
        ),
        *model_api_routes("models", "GET", "/v1/models", RouteKind.API, "The routed model names."),
        *model_api_routes(
            "model", "GET", "/v1/models/{model:path}", RouteKind.API, "One routed model (`models.retrieve`)."
        ),
    )

    @dataclass(frozen=True, slots=True)
    class Options:
        cooldown_s: float = option(30.0, "Seconds an upstream is tried last after repeated failures.")
        failures_to_cool: int = option(3, "Consecutive failures that start an upstream's cool-down.")

    def __init__(self) -> None:
        self._by_name: dict[str, _ModelState] = {}
        self._created = int(time.time())
        self._models_body: dict[str, Any] = {}
        self._model_cards: dict[str, dict[str, Any]] = {}
        self._ctx: LoadContext | None = None
        self._store: Store | None = None
        self._options = Router.Options()
        self._file = ""
        self._file_models: set[str] = set()
        self._collecting = False

    def load(self, ctx: LoadContext) -> None:
        self._ctx = ctx

    def configure(self, config: GatewayConfig, options: Router.Options) -> None:
        if options.cooldown_s < 0 or options.failures_to_cool < 1:
            raise ConfigError(
                f"{config.source}: addons.route.cooldown_s must be >= 0 and failures_to_cool >= 1"
            )
        self._options, self._file = options, str(config.routes_path)
        routes = load_routes(self._file)
        self._by_name = {}
        self._file_models = set(routes.models)
        for name, model in routes.models.items():
            ups = [self._upstream(name, spec, options, self._file) for spec in model.upstreams]
            state = _ModelState(name, model, ups, model.version or None)
            for public in (name, *model.aliases):
                self._by_name[public] = state
        self._refresh_models_body()
        self._store = self._ctx.services.get(STORE) if self._ctx is not None else None
        # Looked up here, not in load: the metrics addon may come later in the chain.
        registry = self._ctx.services.get(METRICS_REGISTRY) if self._ctx is not None else None
        if registry is not None and not self._collecting:
            registry.register(_UpstreamGauges(self))
            self._collecting = True
        if self._store is not None:
            self._store.on_model_change(self.apply_registration)
            self._store.on_model_removed(self.remove_registration)

    async def running(self) -> None:
        """Apply the models registered in the store before this start (a restart keeps the synced version)."""
        if self._store is not None:
            for record in await self._store.models():
                self.apply_registration(record)

    def apply_registration(self, record: ModelRecord) -> None:
        """Route `record.name` to its registered endpoints and stamp its version on the calls that follow."""
        state = self._by_name.get(record.name)
        if state is None:
            route = ModelRoute(
                upstreams=tuple(UpstreamSpec(base_url=e, served_model=record.name) for e in record.endpoints)
            )
            state = self._by_name[record.name] = _ModelState(record.name, route, [])
        template = state.route.upstreams[0] if state.route.upstreams else UpstreamSpec()
        served = record.served_model or template.served_model or state.name
        specs = [UpstreamSpec(e, served, template.api_key_env, template.api_key) for e in record.endpoints]
        state.upstreams = [self._upstream(state.name, spec, self._options, self._file) for spec in specs]
        state.version = record.version
        self._refresh_models_body()

    def remove_registration(self, record: ModelRecord) -> None:
        """Route `record.name` as its routes-file entry says again, or not at all when it has none."""
        state = self._by_name.get(record.name)
        if state is None:
            return
        if state.name in self._file_models:  # from routes.toml: its own upstreams and version again
            state.upstreams = [
                self._upstream(state.name, spec, self._options, self._file) for spec in state.route.upstreams
            ]
            state.version = state.route.version or None
        else:
            for public in [p for p, st in self._by_name.items() if st is state]:
                del self._by_name[public]
        self._refresh_models_body()

    def models(self) -> list[_ModelState]:
        """Every routed model's state, once (its aliases share it)."""
        return list({id(st): st for st in self._by_name.values()}.values())

    def _refresh_models_body(self) -> None:
        self._model_cards = {
            public: {
                "id": public,
                "object": "model",
                "created": self._created,
                "owned_by": "agl-lite",
                "root": st.name,
            }
            for public, st in self._by_name.items()
        }
        self._models_body = {"object": "list", "data": list(self._model_cards.values())}

    @staticmethod
    def _upstream(name: str, spec: UpstreamSpec, options: Router.Options, file: str) -> _UpstreamState:
        key = spec.api_key
        if spec.api_key_env:
            key = os.environ.get(spec.api_key_env, "")
            if not key:
                raise ConfigError(
                    f"{file}: models.{name}: environment variable {spec.api_key_env} is not set"
                )
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return _UpstreamState(
            spec,
            spec.base_url.rstrip("/"),
            headers,
            spec.served_model or name,
            options.cooldown_s,
            options.failures_to_cool,
        )

    def request(self, flow: Flow) -> None:
        route = flow.route
        if route.name in ("models", "models.agent"):
            flow.response = json_response(200, self._models_body)
            return
        if route.name in ("model", "model.agent"):
            # Percent-decoded: SDKs encode a `/` in the id (`Qwen%2FQwen2.5-0.5B`), older ones send it raw.
            name = unquote(flow.request.path_params["model"])
            card = self._model_cards.get(name)
            if card is None:
                raise ModelNotFound(f"model {name!r} is not routed here", param="model")
            flow.response = json_response(200, card)
            return
        if route.kind is not RouteKind.LLM:
            return
        body = flow.request.json_object()
        requested = body.get("model")
        if not isinstance(requested, str) or not requested:
            raise BadRequest("'model' is required and must be a non-empty string", param="model")
        state = self._by_name.get(requested)
        if state is None:
            known = sorted(self._by_name)
            raise ModelNotFound(
                f"model {requested!r} is not routed here; known models: {', '.join(known)}",
                param="model",
                known_models=known,
            )
        path = flow.request.path
        suffix = path[path.index("/v1/") + 3 :]
        if flow.request.query_string:
            suffix += "?" + flow.request.query_string
        rollout_id = flow.metadata.get("auth.rollout_id")
        flow.upstreams = [
            UpstreamTarget(
                url=up.url(suffix),
                headers=up.headers,
                json_patch=None if up.served_model == requested else {"model": up.served_model},
                name=up.base,
                observer=up,
            )
            for up in state.order(rollout_id)
        ]
        flow.metadata["route.model"] = state.name
        flow.metadata["route.requested_model"] = requested
        flow.metadata["route.backend"] = state.route.backend
        flow.metadata["route.model_version"] = state.version
