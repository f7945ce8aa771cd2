"""Store API: the JSON routes over the store — rollouts, the runner protocol, events, calls, resources, models —
plus the agents' and graders' own routes under `/r/{rollout}/a/{attempt}/`, and the OpenAPI document.

Answers by setting `flow.response`; validates every payload (pydantic) before the store sees it.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import parse_qs

import orjson
from multidict import CIMultiDict

from agl_lite.core.config import GatewayConfig
from agl_lite.core.flow import Flow, Response
from agl_lite.core.key_source import read_key
from agl_lite.core.keys import KeyRole
from agl_lite.core.routes import ATTRIBUTED_PREFIX, HttpRoute, RouteKind, Scope
from agl_lite.core.services import LoadContext
from agl_lite.errors import BadRequest, Conflict, Forbidden
from agl_lite.store import api, triplets
from agl_lite.store.base import STORE, RolloutFilter, Store
from agl_lite.store.openapi import QUERIES
from agl_lite.store.records import RolloutStatus

__all__ = ["ROUTES", "StoreApi"]

N = TypeVar("N", int, float)

A, AG, GR, PUB = Scope.ADMIN, Scope.AGENT, Scope.GRADER, Scope.PUBLIC
R = "/api/rollouts/{rollout_id}"

ROUTES = (
    HttpRoute("rollouts.enqueue", "POST", "/api/rollouts", A, RouteKind.API, "Enqueue rollouts (batch)."),
    HttpRoute(
        "rollouts.list", "GET", "/api/rollouts", A, RouteKind.API, "List rollouts (filters, keyset pages)."
    ),
    HttpRoute(
        "rollouts.completed",
        "GET",
        "/api/rollouts/completed",
        A,
        RouteKind.API,
        "Terminal rollouts after a cursor (long-poll).",
    ),
    HttpRoute("rollouts.get", "GET", R, A, RouteKind.API, "One rollout with its attempts."),
    HttpRoute("rollouts.cancel", "POST", R + "/cancel", A, RouteKind.API, "Cancel a rollout."),
    HttpRoute("rollouts.finish", "POST", R + "/finish", A, RouteKind.API, "The runner's verdict."),
    HttpRoute(
        "attempts.start", "POST", R + "/attempts", A, RouteKind.API, "Start an attempt; returns its env."
    ),
    HttpRoute(
        "attempts.update", "PATCH", R + "/attempts/{attempt_id}", A, RouteKind.API, "Record an outcome."
    ),
    HttpRoute("events.list", "GET", R + "/events", A, RouteKind.API, "A rollout's events."),
    HttpRoute(
        "events.add", "POST", R + "/events", A, RouteKind.API, "Add events (rewards from the trainer)."
    ),
    HttpRoute(
        "calls.list", "GET", R + "/calls", A, RouteKind.API, "A rollout's captured LLM calls with ids."
    ),
    HttpRoute("triplets.get", "GET", R + "/triplets", A, RouteKind.API, "A rollout's training triplets."),
    HttpRoute(
        "triplets.batch", "POST", "/api/triplets", A, RouteKind.API, "Many rollouts' triplets (NDJSON pages)."
    ),
    HttpRoute("runner.claim", "POST", "/api/runner/claim", A, RouteKind.API, "Claim queued rollouts."),
    HttpRoute(
        "runner.running", "GET", "/api/runner/running", A, RouteKind.API, "Running rollouts + attempts."
    ),
    HttpRoute("resources.put", "POST", "/api/resources", A, RouteKind.API, "Add a resource version."),
    HttpRoute(
        "resources.latest", "GET", "/api/resources/latest", A, RouteKind.API, "Latest of each resource."
    ),
    HttpRoute("resources.get", "GET", "/api/resources/{name}", A, RouteKind.API, "A resource (?version=N)."),
    HttpRoute("models.put", "POST", "/api/models", A, RouteKind.API, "Register a model version."),
    HttpRoute("models.list", "GET", "/api/models", A, RouteKind.API, "Registered models."),
    HttpRoute("models.remove", "POST", "/api/models/remove", A, RouteKind.API, "Take a registration back."),
    HttpRoute("openapi", "GET", "/api/openapi.json", PUB, RouteKind.API, "This API's OpenAPI document."),
    HttpRoute(
        "agent.events",
        "POST",
        ATTRIBUTED_PREFIX + "/events",
        AG,
        RouteKind.API,
        "AGL_EVENT_URL: an agent's events (rewards only if trusted).",
    ),
    HttpRoute(
        "agent.task", "GET", ATTRIBUTED_PREFIX + "/task", AG, RouteKind.API, "AGL_TASK_URL: the task input."
    ),
    HttpRoute(
        "grader.rollout",
        "GET",
        ATTRIBUTED_PREFIX + "/grade",
        GR,
        RouteKind.API,
        "The rollout with its metadata, for the grading step.",
    ),
    HttpRoute(
        "grader.grade",
        "POST",
        ATTRIBUTED_PREFIX + "/grade",
        GR,
        RouteKind.API,
        "AGL_GRADE_URL: the grader's reward and events.",
    ),
)


def _ok(obj: Any, status: int = 200) -> Response:
    return Response(status, CIMultiDict({"Content-Type": "application/json"}), body=orjson.dumps(obj))


def _query(flow: Flow) -> dict[str, str]:
    """The query parameters (the last of repeated ones); a blank one is kept, so that it fails its check."""
    return {k: v[-1] for k, v in parse_qs(flow.request.query_string, keep_blank_values=True).items()}


def _check_query(flow: Flow) -> None:
    """An unknown query parameter is a 400, as an unknown body field is: a typo must not pass for a default."""
    allowed = QUERIES.get(flow.route.name, {})
    unknown = sorted(set(parse_qs(flow.request.query_string, keep_blank_values=True)) - allowed.keys())
    if unknown:
        raise BadRequest(f"unknown query parameter(s) {unknown}; known: {sorted(allowed) or 'none'}")


_INTEGER = re.compile(r"-?[0-9]{1,20}", re.ASCII)
_NUMBER = re.compile(r"-?[0-9]{1,20}(?:\.[0-9]{1,20})?", re.ASCII)


def _number(q: dict[str, str], name: str, default: N, lo: N, hi: N, kind: Callable[[str], N]) -> N:
    """A query parameter as `kind` (int or float) within [lo, hi]; 400 naming it otherwise."""
    raw = q.get(name)
    if raw is None:
        return default
    try:
        # Plain ASCII digits only: int() and float() also take "1_000", "+5", " 5" and non-ASCII digits.
        if not (_INTEGER if kind is int else _NUMBER).fullmatch(raw):
            raise ValueError(raw)
        value = kind(raw)
    except ValueError:
        raise BadRequest(
            f"query parameter {name!r} must be {'an integer' if kind is int else 'a number'}"
        ) from None
    if not lo <= value <= hi:
        raise BadRequest(f"query parameter {name!r} must be between {lo} and {hi}")
    return value


def _int(q: dict[str, str], name: str, default: int, lo: int, hi: int) -> int:
    return _number(q, name, default, lo, hi, int)


def _float(q: dict[str, str], name: str, default: float, lo: float, hi: float) -> float:
    return _number(q, name, default, lo, hi, float)


def _label(q: dict[str, str]) -> tuple[str, str] | None:
    """`label=KEY:VALUE` (the value may hold colons; the key may not)."""
    raw = q.get("label")
    if raw is None:
        return None
    key, sep, value = raw.partition(":")
    if not sep:
        raise BadRequest(f"query parameter 'label' must be KEY:VALUE, got {raw!r}")
    return key, value


PAGE_BYTES = 8 * 1024 * 1024
"""Stored bytes past which a page of events or calls ends (it always holds one): a response is built whole, and a
page of 10,000 large events took six to seven times its size in memory."""

Handler = Callable[[Flow], Awaitable[Response]]


class StoreApi:
    routes = ROUTES

    max_wait_s = 60.0
    """Longest long-poll on the completion cursor."""

    def load(self, ctx: LoadContext) -> None:
        self._ctx = ctx
        self._openapi: bytes | None = None

    def configure(self, config: GatewayConfig, options: None) -> None:
        self.store: Store = self._ctx.services.require(STORE, by="store_api")
        self.public_url = config.public_url
        self.admin_key = read_key("AGL_KEY")
        # by route name, resolved once: this runs on every request of the chain, LLM calls included
        self._handlers: dict[str, tuple[HttpRoute, Handler]] = {
            r.name: (r, getattr(self, r.name.replace(".", "_"))) for r in ROUTES
        }

    async def request(self, flow: Flow) -> None:
        entry = self._handlers.get(flow.route.name)
        if entry is not None and entry[0] is flow.route:  # our route, not another addon's of the same name
            if flow.request.query_string:
                _check_query(flow)
            flow.response = await entry[1](flow)

    def _rid(self, flow: Flow) -> str:
        return flow.request.path_params["rollout_id"]

    # --- rollouts ------------------------------------------------------------------------------------------------

    async def rollouts_enqueue(self, flow: Flow) -> Response:
        payload = api.parse(api.EnqueueIn, flow.request.body)
        created = await self.store.enqueue([r.spec() for r in payload.rollouts])
        return _ok({"rollouts": [r.to_json() for r in created]}, 201)

    async def rollouts_list(self, flow: Flow) -> Response:
        q = _query(flow)
        status = q.get("status")
        try:
            flt = RolloutFilter(
                status=RolloutStatus(status) if status is not None else None,
                mode=q.get("mode"),
                group_id=q.get("group_id"),
                after=_int(q, "after", 0, 0, 2**62),
                limit=_int(q, "limit", 100, 1, 1000),
            )
        except ValueError:
            raise BadRequest(
                f"unknown status {status!r}: use one of {', '.join(s.value for s in RolloutStatus)}"
            ) from None
        rows = await self.store.list_rollouts(flt)
        nxt = rows[-1].enqueue_seq if len(rows) == flt.limit else None
        return _ok({"rollouts": [r.to_json() for r in rows], "next": nxt})

    async def rollouts_completed(self, flow: Flow) -> Response:
        q = _query(flow)
        rows, cursor = await self.store.completed(
            _int(q, "after", 0, 0, 2**62),
            _int(q, "limit", 100, 0, 1000),
            _float(q, "wait", 0.0, 0.0, self.max_wait_s),
        )
        return _ok({"rollouts": [r.to_json() for r in rows], "cursor": cursor})

    async def rollouts_get(self, flow: Flow) -> Response:
        rollout = await self.store.get_rollout(self._rid(flow))
        attempts = await self.store.attempts(rollout.id)
        return _ok({**rollout.to_json(), "attempts": [a.to_json() for a in attempts]})

    async def rollouts_cancel(self, flow: Flow) -> Response:
        message = api.parse(api.CancelIn, flow.request.body or b"{}").message
        return _ok((await self.store.cancel(self._rid(flow), message)).to_json())

    async def rollouts_finish(self, flow: Flow) -> Response:
        payload = api.parse(api.FinishIn, flow.request.body)
        rollout = await self.store.finish(self._rid(flow), RolloutStatus(payload.status), payload.message)
        return _ok(rollout.to_json())

    # --- attempts ------------------------------------------------------------------------------------------------

    async def attempts_start(self, flow: Flow) -> Response:
        attempt_id = api.parse(api.AttemptIn, flow.request.body or b"{}").attempt_id
        rollout = await self.store.get_rollout(self._rid(flow))
        if attempt_id == api.ATTEMPT_FROM_POD:
            if rollout.status is not RolloutStatus.RUNNING:  # as start_attempt answers for any other id
                raise Conflict(
                    f"rollout {rollout.id!r} is {rollout.status.value}; attempts start only while running"
                )
            attempt_json = None
        else:
            attempt = await self.store.start_attempt(rollout.id, attempt_id)
            attempt_id, attempt_json = attempt.id, attempt.to_json()
        assert attempt_id is not None
        grader = rollout.config.grader is not None
        return _ok(
            {
                "attempt": attempt_json,
                "env": api.agent_env(self.public_url, self.admin_key, rollout, attempt_id),
                "grader_env": api.grader_env(self.public_url, self.admin_key, rollout, attempt_id)
                if grader
                else None,
            },
            201,
        )

    async def attempts_update(self, flow: Flow) -> Response:
        payload = api.parse(api.AttemptPatchIn, flow.request.body)
        attempt = await self.store.update_attempt(
            self._rid(flow),
            flow.request.path_params["attempt_id"],
            payload.status,
            exit_code=payload.exit_code,
            message=payload.message,
        )
        return _ok(attempt.to_json())

    # --- events and calls ----------------------------------------------------------------------------------------

    async def events_list(self, flow: Flow) -> Response:
        q = _query(flow)
        kind, rid = q.get("kind"), self._rid(flow)
        limit = _int(q, "limit", 1000, 1, 10_000)
        page_bytes = _int(q, "max_bytes", PAGE_BYTES, 1, PAGE_BYTES)
        events = await self.store.events(
            rid, kind, _int(q, "after_seq", 0, 0, 2**62), limit, max_bytes=page_bytes
        )
        # A page ends at `limit` or at PAGE_BYTES: `more` says whether to ask again after its last.
        more = len(events) == limit or bool(
            events and await self.store.events(rid, kind, events[-1].seq, 1, max_bytes=1)
        )
        return _ok({"events": [e.to_json() for e in events], "more": more})

    async def events_add(self, flow: Flow) -> Response:
        payload = api.parse(api.EventsIn, flow.request.body)
        events = await self.store.add_events(
            self._rid(flow), [e.spec() for e in payload.events], source="admin"
        )
        return _ok({"events": [e.to_json() for e in events]}, 201)

    async def calls_list(self, flow: Flow) -> Response:
        q = _query(flow)
        rid, attempt = self._rid(flow), q.get("attempt_id")
        await self.store.get_rollout(rid)
        limit = _int(q, "limit", 100, 1, 1000)
        page_bytes = _int(q, "max_bytes", PAGE_BYTES, 1, PAGE_BYTES)
        label = _label(q)
        calls = await self.store.calls(
            rid,
            attempt,
            _int(q, "after_order_key", -1, -1, 2**63 - 1),
            limit,
            max_bytes=page_bytes,
            label=label,
        )
        more = len(calls) == limit or bool(
            calls and await self.store.calls(rid, attempt, calls[-1].order_key, 1, max_bytes=1, label=label)
        )
        return _ok({"calls": [c.to_json() for c in calls], "more": more})

    async def triplets_get(self, flow: Flow) -> Response:
        options = triplets.TripletOptions.from_query(_query(flow))
        return _ok((await triplets.rollout_triplets(self.store, self._rid(flow), options)).to_json())

    async def triplets_batch(self, flow: Flow) -> Response:
        p = api.parse(api.TripletsIn, flow.request.body)
        options = triplets.TripletOptions(
            triplets.AttemptScope(p.attempts), triplets.RewardPolicy(p.reward_policy), p.missing_reward
        )
        body, count = await triplets.triplets_page(self.store, p.rollout_ids, options, p.max_bytes)
        headers = {"Content-Type": "application/x-ndjson", "X-Agl-Rollouts": str(count)}
        return Response(200, CIMultiDict(headers), body=body)

    # --- the runner protocol -------------------------------------------------------------------------------------

    async def runner_claim(self, flow: Flow) -> Response:
        payload = api.parse(api.ClaimIn, flow.request.body)
        claimed = await self.store.claim(payload.runner_id, payload.limit)
        return _ok({"rollouts": [r.to_json() for r in claimed]})

    async def runner_running(self, flow: Flow) -> Response:
        rows = await self.store.running()
        return _ok(
            {"running": [{"rollout": r.to_json(), "attempts": [a.to_json() for a in at]} for r, at in rows]}
        )

    # --- resources and models ------------------------------------------------------------------------------------

    async def resources_put(self, flow: Flow) -> Response:
        payload = api.parse(api.ResourceIn, flow.request.body)
        return _ok((await self.store.put_resource(payload.name, payload.value)).to_json(), 201)

    async def resources_latest(self, flow: Flow) -> Response:
        return _ok({"resources": [r.to_json() for r in await self.store.latest_resources()]})

    async def resources_get(self, flow: Flow) -> Response:
        q = _query(flow)
        version = _int(q, "version", 0, 1, 2**62) if "version" in q else None
        return _ok((await self.store.get_resource(flow.request.path_params["name"], version)).to_json())

    async def models_put(self, flow: Flow) -> Response:
        payload = api.parse(api.ModelIn, flow.request.body)
        model = await self.store.put_model(
            payload.name, payload.endpoints, payload.version, payload.served_model
        )
        return _ok(model.to_json(), 201)

    async def models_remove(self, flow: Flow) -> Response:
        payload = api.parse(api.ModelRemoveIn, flow.request.body)
        return _ok((await self.store.remove_model(payload.name)).to_json())

    async def models_list(self, flow: Flow) -> Response:
        return _ok({"models": [m.to_json() for m in await self.store.models()]})

    async def openapi(self, flow: Flow) -> Response:
        from agl_lite.store.openapi import document

        if self._openapi is None:
            self._openapi = orjson.dumps(document(self._ctx.routes))
        return Response(200, CIMultiDict({"Content-Type": "application/json"}), body=self._openapi)

    # --- agents and graders --------------------------------------------------------------------------------------

    async def agent_events(self, flow: Flow) -> Response:
        payload = api.parse(api.AgentEventIn, flow.request.body)
        rid, aid = self._rid(flow), flow.request.path_params["attempt_id"]
        role = flow.metadata.get("auth.role")
        if payload.kind == "reward" and role is not KeyRole.ADMIN:
            rollout = await self.store.get_rollout(rid)
            if not rollout.config.trust_agent_rewards:
                raise Forbidden("this rollout does not take rewards from its agent")
        source = "admin" if role is KeyRole.ADMIN else "agent"
        (event,) = await self.store.add_events(rid, [payload.spec(aid)], source=source)
        return _ok(event.to_json(), 201)

    async def agent_task(self, flow: Flow) -> Response:
        rollout = await self.store.get_rollout(self._rid(flow))
        return _ok({"input": rollout.input, "mode": rollout.mode})

    async def grader_rollout(self, flow: Flow) -> Response:
        rollout = await self.store.get_rollout(self._rid(flow))
        return _ok(rollout.to_json())

    async def grader_grade(self, flow: Flow) -> Response:
        payload = api.parse(api.AgentEventIn, flow.request.body)
        aid = flow.request.path_params["attempt_id"]
        source = "admin" if flow.metadata.get("auth.role") is KeyRole.ADMIN else "grader"
        (event,) = await self.store.add_events(self._rid(flow), [payload.spec(aid)], source=source)
        return _ok(event.to_json(), 201)
