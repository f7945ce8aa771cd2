"""Auth: every request's key is checked against the scope its route declares (DESIGN.md §2).

The admin key is `AGL_KEY`; agent and grader keys are derived from it per rollout, so there is no key table. With
a store in the chain, an agent key works only while its rollout runs (its attempt is upserted on first sight) and
a grader key likewise. Sets `auth.role`, `auth.rollout_id`, `auth.attempt_id`. Never logs a key.
"""

from __future__ import annotations

from dataclasses import dataclass

from agl_lite.core.config import GatewayConfig, option
from agl_lite.core.contract import KeyRole, Principal, identify, presented_key
from agl_lite.core.flow import Flow
from agl_lite.core.key_source import key_file, read_key
from agl_lite.core.routes import RouteKind, Scope
from agl_lite.core.services import ADMIN_KEY, LoadContext
from agl_lite.errors import ConfigError, Forbidden, Unauthorized
from agl_lite.store.records import RolloutStatus
from agl_lite.store.rules import STORE, Store

__all__ = ["MIN_KEY_LENGTH", "Auth"]

MIN_KEY_LENGTH = 16
_VALID_KEYS = 10_000

_ROLE_FOR_SCOPE = {Scope.AGENT: KeyRole.AGENT, Scope.GRADER: KeyRole.GRADER}


class Auth:
    short_name = "auth"
    """Its name in a chain, and what other addons' `after` call it."""

    @dataclass(frozen=True, slots=True)
    class Options:
        key_env: str = option(
            "AGL_KEY",
            "Environment variable holding the admin key (at least 16 characters); or `AGL_KEY_FILE`, the file "
            "that holds it.",
        )

    admin_key: str = ""
    store: Store | None = None
    _ctx: LoadContext | None = None

    def __init__(self) -> None:
        self._valid: dict[str, Principal] = {}
        self._in_flight: dict[str, set[Flow]] = {}
        """Flows of each rollout that passed auth and have not ended: cut when their rollout ends."""

    def load(self, ctx: LoadContext) -> None:
        self._ctx = ctx
        ctx.services.provide(ADMIN_KEY, lambda: self.admin_key, by="auth")

    def configure(self, config: GatewayConfig, options: Auth.Options | None) -> None:
        options = options or Auth.Options()
        self.store = self._ctx.services.get(STORE) if self._ctx is not None else None
        key = read_key(options.key_env)
        path = key_file(options.key_env)
        if path is not None and self._ctx is not None:
            self._ctx.private_paths.add(path.resolve())
        if not key:
            raise ConfigError(
                f"the admin key is not set: export {options.key_env}=$(openssl rand -hex 32) before starting agl-lite"
            )
        if len(key) < MIN_KEY_LENGTH:
            raise ConfigError(f"{options.key_env} is too short: use at least {MIN_KEY_LENGTH} characters")
        self.admin_key = key
        if self.store is not None:
            self.store.on_rollout_ended(self._rollout_ended)

    async def request_headers(self, flow: Flow) -> None:
        # On the headers, before the body is read: a request without a valid key never gets to send one.
        route = flow.route
        rollout_id = flow.request.path_params.get("rollout_id")
        if rollout_id is not None:
            flow.metadata["auth.rollout_id"] = rollout_id
            flow.metadata["auth.attempt_id"] = flow.request.path_params.get("attempt_id")
        if route.scope is Scope.PUBLIC:
            return
        key = presented_key(flow.request.headers)
        if key is None:
            if route.scope is Scope.SESSION:
                return  # (the route's addon checks its own session)
            raise Unauthorized("missing API key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'")
        principal = self._valid.get(key)
        if principal is None:
            principal = identify(self.admin_key, key)
            if principal is None:
                raise Unauthorized("invalid API key")
            # Keys that proved valid, so that an agent's every call does not recompute its HMAC.
            if len(self._valid) >= _VALID_KEYS:
                self._valid.clear()
            self._valid[key] = principal
        if principal.role is KeyRole.ADMIN:
            if route.kind is RouteKind.LLM and rollout_id is not None and self.store is not None:
                # The admin key may call as any agent, by the rollout's rules: while it runs, as an attempt that
                # exists or can start (else its calls would land in an ended rollout, or in no attempt at all).
                await self.store.agent_gate(rollout_id, flow.request.path_params["attempt_id"])
            self._admit(flow, principal.role, rollout_id)
            return
        if route.scope in (Scope.ADMIN, Scope.SESSION):
            raise Forbidden(f"{route.method} {route.path} needs the admin key")
        if principal.role is not _ROLE_FOR_SCOPE[route.scope]:
            raise Forbidden(f"a {principal.role.value} key cannot call {route.method} {route.path}")
        if principal.rollout_id != rollout_id:
            raise Forbidden("this key belongs to another rollout")
        if self.store is not None and rollout_id is not None:
            if principal.role is KeyRole.AGENT:
                await self.store.agent_gate(rollout_id, flow.request.path_params["attempt_id"])
            elif await self.store.rollout_status(rollout_id) is not RolloutStatus.RUNNING:
                raise Forbidden(f"rollout {rollout_id!r} is not running: its grader key no longer works")
        # Only now: a refused flow must leave no trace (capture records only flows with a role), least of all an
        # `llm_call` event in a rollout that has ended or that the key does not belong to.
        self._admit(flow, principal.role, rollout_id)

    def _admit(self, flow: Flow, role: KeyRole, rollout_id: str | None) -> None:
        if rollout_id is not None and flow.route.kind is RouteKind.LLM:
            # The gate's write can commit in the same group commit as the rollout's end, whose listeners ran before
            # this flow was in flight to be cut: asked again here, with no await between the answer and the entry.
            status = self.store.known_status(rollout_id) if self.store is not None else None
            if status is not None and status.terminal:
                raise Forbidden(f"rollout {rollout_id!r} is {status.value}: it ended as this call was let in")
            self._in_flight.setdefault(rollout_id, set()).add(flow)
        flow.metadata["auth.role"] = role

    def flow_done(self, flow: Flow) -> None:
        rollout_id = flow.metadata.get("auth.rollout_id")
        if not isinstance(rollout_id, str):
            return
        flows = self._in_flight.get(rollout_id)
        if flows is not None:
            flows.discard(flow)
            if not flows:
                del self._in_flight[rollout_id]

    def _rollout_ended(self, rollout_id: str) -> None:
        """A rollout ended (cancelled, finished): its LLM calls still in flight are cut, so that none goes on
        spending the upstream's time for a trajectory that is closed (their records are kept, marked late)."""
        for flow in list(self._in_flight.get(rollout_id, ())):
            flow.abort(Forbidden(f"rollout {rollout_id!r} ended while this call was in flight"))
