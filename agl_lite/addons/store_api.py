"""Store API: the JSON routes over the store — rollouts, the runner protocol, events, calls, resources, models —
plus the agents' and graders' own routes under `/r/{rollout}/a/{attempt}/`, and the OpenAPI document.

Each endpoint is declared once (`core.api`): route, body model, query parameters and handler; every payload is
validated (pydantic) before the store sees it.
"""

from __future__ import annotations

from typing import Any

import orjson
from multidict import CIMultiDict

from agl_lite.core.api import Call, Endpoints, Param
from agl_lite.core.config import GatewayConfig
from agl_lite.core.contract import ATTEMPT_FROM_POD, ATTRIBUTED_PREFIX, KeyRole, agent_env, grader_env
from agl_lite.core.flow import Flow, Response
from agl_lite.core.key_source import read_key
from agl_lite.core.routes import Scope
from agl_lite.core.services import LoadContext
from agl_lite.errors import Conflict, Forbidden
from agl_lite.store import api, triplets
from agl_lite.store.records import LABEL_KEY, RolloutStatus
from agl_lite.store.rules import STORE, RolloutFilter, Store

__all__ = ["PAGE_BYTES", "StoreApi"]

A, AG, GR, PUB = Scope.ADMIN, Scope.AGENT, Scope.GRADER, Scope.PUBLIC
R = "/api/rollouts/{rollout_id}"

PAGE_BYTES = 8 * 1024 * 1024
"""Stored bytes past which a page of events or calls ends (it always holds one): a response is built whole, and a
page of 10,000 large events took six to seven times its size in memory."""

MAX_WAIT_S = 60.0
"""Longest long-poll on the completion cursor."""

_SEQ = Param("integer", 0, 0, 2**62)
_PAGE = Param("integer", PAGE_BYTES, 1, PAGE_BYTES)
_STATUSES = tuple(s.value for s in RolloutStatus)


class StoreApi:
    short_name = "store_api"
    """Its name in a chain, and what other addons' `after` call it."""
    table = Endpoints()

    def load(self, ctx: LoadContext) -> None:
        self._ctx = ctx
        self._openapi: bytes | None = None

    def configure(self, config: GatewayConfig, options: None) -> None:
        self.store: Store = self._ctx.services.require(STORE, by="store_api")
        self.public_url = config.public_url
        self.admin_key = read_key("AGL_KEY")

    async def request(self, flow: Flow) -> None:
        await self.table.dispatch(self, flow)

    # --- rollouts ------------------------------------------------------------------------------------------------

    @table.endpoint("POST", "/api/rollouts", A, body=api.EnqueueIn, status=201)
    async def rollouts_enqueue(self, call: Call) -> Any:
        """Enqueue rollouts (batch)."""
        created = await self.store.enqueue([r.spec() for r in call.body.rollouts])
        return {"rollouts": [r.to_json() for r in created]}

    @table.endpoint(
        "GET",
        "/api/rollouts",
        A,
        query={
            "status": Param("string", enum=_STATUSES),
            "mode": Param("string"),
            "group_id": Param("string"),
            "reward_min": Param("number"),
            "reward_max": Param("number"),
            "model_version": Param("string", pattern=r"^[^\x00]{1,256}$"),
            "created_after": Param("number"),
            "created_before": Param("number"),
            "after": _SEQ,
            "limit": Param("integer", 100, 1, 1000),
        },
    )
    async def rollouts_list(self, call: Call) -> Any:
        """List rollouts (filters, keyset pages)."""
        q = call.query
        status = q["status"]
        flt = RolloutFilter(
            status=RolloutStatus(status) if status is not None else None,
            mode=q["mode"],
            group_id=q["group_id"],
            after=q["after"],
            limit=q["limit"],
            reward_min=q["reward_min"],
            reward_max=q["reward_max"],
            model_version=q["model_version"],
            created_after=q["created_after"],
            created_before=q["created_before"],
        )
        rows = await self.store.list_rollouts(flt)
        nxt = rows[-1].enqueue_seq if len(rows) == flt.limit else None
        return {"rollouts": [r.to_json() for r in rows], "next": nxt}

    @table.endpoint(
        "GET",
        "/api/rollouts/completed",
        A,
        query={
            "after": _SEQ,
            "limit": Param("integer", 100, 0, 1000),  # 0: no rows, the cursor's head
            "wait": Param("number", 0.0, 0, MAX_WAIT_S),
        },
    )
    async def rollouts_completed(self, call: Call) -> Any:
        """Terminal rollouts after a cursor (long-poll)."""
        q = call.query
        rows, cursor = await self.store.completed_until(self._ctx.stopping, q["after"], q["limit"], q["wait"])
        return {"rollouts": [r.to_json() for r in rows], "cursor": cursor}

    @table.endpoint("GET", R, A)
    async def rollouts_get(self, call: Call) -> Any:
        """One rollout with its attempts."""
        rollout = await self.store.get_rollout(call.params["rollout_id"])
        attempts = await self.store.attempts(rollout.id)
        return {**rollout.to_json(), "attempts": [a.to_json() for a in attempts]}

    @table.endpoint("POST", R + "/cancel", A, body=api.CancelIn, empty_body={})
    async def rollouts_cancel(self, call: Call) -> Any:
        """Cancel a rollout."""
        return (await self.store.cancel(call.params["rollout_id"], call.body.message)).to_json()

    @table.endpoint("POST", R + "/finish", A, body=api.FinishIn)
    async def rollouts_finish(self, call: Call) -> Any:
        """The runner's verdict."""
        p = call.body
        return (
            await self.store.finish(call.params["rollout_id"], RolloutStatus(p.status), p.message)
        ).to_json()

    # --- attempts ------------------------------------------------------------------------------------------------

    @table.endpoint("POST", R + "/attempts", A, body=api.AttemptIn, empty_body={}, status=201)
    async def attempts_start(self, call: Call) -> Any:
        """Start an attempt; returns its env."""
        attempt_id = call.body.attempt_id
        rollout = await self.store.get_rollout(call.params["rollout_id"])
        if attempt_id == ATTEMPT_FROM_POD:
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
        return {
            "attempt": attempt_json,
            "env": agent_env(self.public_url, self.admin_key, rollout, attempt_id),
            "grader_env": grader_env(self.public_url, self.admin_key, rollout, attempt_id)
            if grader
            else None,
        }

    @table.endpoint("PATCH", R + "/attempts/{attempt_id}", A, body=api.AttemptPatchIn)
    async def attempts_update(self, call: Call) -> Any:
        """Record an outcome."""
        p = call.body
        attempt = await self.store.update_attempt(
            call.params["rollout_id"],
            call.params["attempt_id"],
            p.status,
            exit_code=p.exit_code,
            message=p.message,
        )
        return attempt.to_json()

    # --- events and calls ----------------------------------------------------------------------------------------

    @table.endpoint(
        "GET",
        R + "/events",
        A,
        query={
            "kind": Param("string"),
            "after_seq": _SEQ,
            "limit": Param("integer", 1000, 1, 10_000),
            "max_bytes": _PAGE,
        },
    )
    async def events_list(self, call: Call) -> Any:
        """A rollout's events."""
        q, rid = call.query, call.params["rollout_id"]
        kind, limit = q["kind"], q["limit"]
        events = await self.store.events(rid, kind, q["after_seq"], limit, max_bytes=q["max_bytes"])
        # A page ends at `limit` or at PAGE_BYTES: `more` says whether to ask again after its last.
        more = len(events) == limit or bool(
            events and await self.store.events(rid, kind, events[-1].seq, 1, max_bytes=1)
        )
        return {"events": [e.to_json() for e in events], "more": more}

    @table.endpoint("POST", R + "/events", A, body=api.EventsIn, status=201)
    async def events_add(self, call: Call) -> Any:
        """Add events (rewards from the trainer)."""
        specs = [e.spec() for e in call.body.events]
        events = await self.store.add_events(call.params["rollout_id"], specs, source="admin")
        return {"events": [e.to_json() for e in events]}

    @table.endpoint(
        "GET",
        R + "/calls",
        A,
        query={
            "attempt_id": Param("string"),
            "label": Param("string", pattern=f"^{LABEL_KEY.pattern}:[^\\x00]*$"),
            "after_order_key": Param("integer", -1, -1, 2**63 - 1),
            "limit": Param("integer", 100, 1, 1000),
            "max_bytes": _PAGE,
        },
    )
    async def calls_list(self, call: Call) -> Any:
        """A rollout's captured LLM calls with ids."""
        q, rid = call.query, call.params["rollout_id"]
        attempt, limit, label = q["attempt_id"], q["limit"], _label(q["label"])
        await self.store.get_rollout(rid)
        calls = await self.store.calls(
            rid, attempt, q["after_order_key"], limit, max_bytes=q["max_bytes"], label=label
        )
        more = len(calls) == limit or bool(
            calls and await self.store.calls(rid, attempt, calls[-1].order_key, 1, max_bytes=1, label=label)
        )
        return {"calls": [c.to_json() for c in calls], "more": more}

    @table.endpoint(
        "GET",
        R + "/triplets",
        A,
        query={
            "attempts": Param("string", "final", enum=tuple(s.value for s in triplets.AttemptScope)),
            "reward_policy": Param("string", "last", enum=tuple(p.value for p in triplets.RewardPolicy)),
            "missing_reward": Param("number", 0.0),
        },
    )
    async def triplets_get(self, call: Call) -> Any:
        """A rollout's training triplets."""
        q = call.query
        options = triplets.TripletOptions(
            triplets.AttemptScope(q["attempts"]),
            triplets.RewardPolicy(q["reward_policy"]),
            q["missing_reward"],
        )
        return (await triplets.rollout_triplets(self.store, call.params["rollout_id"], options)).to_json()

    @table.endpoint("POST", "/api/triplets", A, body=api.TripletsIn, media="application/x-ndjson")
    async def triplets_batch(self, call: Call) -> Any:
        """Many rollouts' triplets (NDJSON pages)."""
        p = call.body
        options = triplets.TripletOptions(
            triplets.AttemptScope(p.attempts), triplets.RewardPolicy(p.reward_policy), p.missing_reward
        )
        body, count = await triplets.triplets_page(self.store, p.rollout_ids, options, p.max_bytes)
        headers = {"Content-Type": "application/x-ndjson", "X-Agl-Rollouts": str(count)}
        return Response(200, CIMultiDict(headers), body=body)

    # --- the runner protocol -------------------------------------------------------------------------------------

    @table.endpoint("POST", "/api/runner/claim", A, body=api.ClaimIn)
    async def runner_claim(self, call: Call) -> Any:
        """Claim queued rollouts."""
        claimed = await self.store.claim(call.body.runner_id, call.body.limit)
        return {"rollouts": [r.to_json() for r in claimed]}

    @table.endpoint("GET", "/api/runner/running", A)
    async def runner_running(self, call: Call) -> Any:
        """Running rollouts + attempts."""
        rows = await self.store.running()
        return {
            "running": [{"rollout": r.to_json(), "attempts": [a.to_json() for a in at]} for r, at in rows]
        }

    # --- resources and models ------------------------------------------------------------------------------------

    @table.endpoint("POST", "/api/resources", A, body=api.ResourceIn, status=201)
    async def resources_put(self, call: Call) -> Any:
        """Add a resource version."""
        return (await self.store.put_resource(call.body.name, call.body.value)).to_json()

    @table.endpoint("GET", "/api/resources/latest", A)
    async def resources_latest(self, call: Call) -> Any:
        """Latest of each resource."""
        return {"resources": [r.to_json() for r in await self.store.latest_resources()]}

    @table.endpoint("GET", "/api/resources/{name}", A, query={"version": Param("integer", None, 1, 2**62)})
    async def resources_get(self, call: Call) -> Any:
        """A resource (?version=N)."""
        return (await self.store.get_resource(call.params["name"], call.query["version"])).to_json()

    @table.endpoint("POST", "/api/models", A, body=api.ModelIn, status=201)
    async def models_put(self, call: Call) -> Any:
        """Register a model version."""
        p = call.body
        return (await self.store.put_model(p.name, p.endpoints, p.version, p.served_model)).to_json()

    @table.endpoint("GET", "/api/models", A)
    async def models_list(self, call: Call) -> Any:
        """Registered models."""
        return {"models": [m.to_json() for m in await self.store.models()]}

    @table.endpoint("POST", "/api/models/remove", A, body=api.ModelRemoveIn)
    async def models_remove(self, call: Call) -> Any:
        """Take a registration back."""
        return (await self.store.remove_model(call.body.name)).to_json()

    @table.endpoint("GET", "/api/openapi.json", PUB)
    async def openapi(self, call: Call) -> Any:
        """This API's OpenAPI document."""
        from agl_lite.store.openapi import document

        if self._openapi is None:
            self._openapi = orjson.dumps(document(self._ctx.routes))
        return Response(200, CIMultiDict({"Content-Type": "application/json"}), body=self._openapi)

    # --- agents and graders --------------------------------------------------------------------------------------

    @table.endpoint("POST", ATTRIBUTED_PREFIX + "/events", AG, body=api.AgentEventIn, status=201)
    async def agent_events(self, call: Call) -> Any:
        """AGL_EVENT_URL: an agent's events (rewards only if trusted)."""
        p = call.body
        rid, aid = call.params["rollout_id"], call.params["attempt_id"]
        role = call.flow.metadata.get("auth.role")
        if p.kind == "reward" and role is not KeyRole.ADMIN:
            rollout = await self.store.get_rollout(rid)
            if not rollout.config.trust_agent_rewards:
                raise Forbidden("this rollout does not take rewards from its agent")
        source = "admin" if role is KeyRole.ADMIN else "agent"
        (event,) = await self.store.add_events(rid, [p.spec(aid)], source=source)
        return event.to_json()

    @table.endpoint("GET", ATTRIBUTED_PREFIX + "/task", AG)
    async def agent_task(self, call: Call) -> Any:
        """AGL_TASK_URL: the task input."""
        rollout = await self.store.get_rollout(call.params["rollout_id"])
        return {"input": rollout.input, "mode": rollout.mode}

    @table.endpoint("GET", ATTRIBUTED_PREFIX + "/grade", GR)
    async def grader_rollout(self, call: Call) -> Any:
        """The rollout with its metadata, for the grading step."""
        return (await self.store.get_rollout(call.params["rollout_id"])).to_json()

    @table.endpoint("POST", ATTRIBUTED_PREFIX + "/grade", GR, body=api.AgentEventIn, status=201)
    async def grader_grade(self, call: Call) -> Any:
        """AGL_GRADE_URL: the grader's reward and events."""
        aid = call.params["attempt_id"]
        source = "admin" if call.flow.metadata.get("auth.role") is KeyRole.ADMIN else "grader"
        (event,) = await self.store.add_events(
            call.params["rollout_id"], [call.body.spec(aid)], source=source
        )
        return event.to_json()

    routes = table.routes  # (here: after every endpoint above was declared)


def _label(raw: str | None) -> tuple[str, str] | None:
    """`label=KEY:VALUE` (the value may hold colons; the key may not: its declared pattern makes sure of both)."""
    if raw is None:
        return None
    key, _, value = raw.partition(":")
    return key, value
