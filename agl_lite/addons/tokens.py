"""Tokens: token accounting per rollout, and the optional per-rollout token budget (per model: `metrics`).

Counts come from the upstream's `usage` on each captured call (`capture.record`), or from the ids received when a
stream was cut before its usage arrived. A rollout whose `config.token_budget` is spent gets 429 before the
upstream is called, and one whose storage quota (`[addons.store] max_rollout_bytes`) is used up gets 507. A
rollout's total is the store's (`Store.tokens_used`: one indexed read on first sight, then
kept by the store's own writes), so a restart keeps it and no call pays for the rollout's history.
"""

from __future__ import annotations

from dataclasses import dataclass

from agl_lite.core.config import GatewayConfig, option
from agl_lite.core.contract import KeyRole
from agl_lite.core.flow import Flow
from agl_lite.core.routes import RouteKind
from agl_lite.core.services import LoadContext
from agl_lite.errors import TooManyRequests
from agl_lite.store.rules import STORE, Store

__all__ = ["Tokens"]


class Tokens:
    short_name = "tokens"
    """Its name in a chain, and what other addons' `after` call it."""

    @dataclass(frozen=True, slots=True)
    class Options:
        max_rollouts: int = option(
            100_000, "Rollouts whose token budgets are kept in memory (least recent dropped)."
        )

    def __init__(self) -> None:
        self._budgets: dict[str, int | None] = {}
        self.store: Store | None = None

    def load(self, ctx: LoadContext) -> None:
        self._ctx = ctx

    def configure(self, config: GatewayConfig, options: Tokens.Options | None) -> None:
        self.options = options or Tokens.Options()
        self.store = self._ctx.services.get(STORE)

    async def used(self, rollout_id: str) -> int:
        """Tokens a rollout's calls used so far (the store keeps the total: one read per rollout, then none)."""
        return await self.store.tokens_used(rollout_id) if self.store is not None else 0

    async def request(self, flow: Flow) -> None:
        rollout_id = flow.metadata.get("auth.rollout_id")
        if flow.route.kind is not RouteKind.LLM or rollout_id is None or self.store is None:
            return
        if rollout_id not in self._budgets:  # a rollout's config never changes: read it once
            if len(self._budgets) >= self.options.max_rollouts:
                self._budgets.pop(next(iter(self._budgets)))
            self._budgets[rollout_id] = (await self.store.get_rollout(rollout_id)).config.token_budget
        budget = self._budgets[rollout_id]
        if budget is not None and await self.used(rollout_id) >= budget:
            raise TooManyRequests(f"rollout {rollout_id!r} has used its token budget of {budget}")
        if flow.metadata.get("auth.role") is not KeyRole.ADMIN:
            await self.store.check_quota(rollout_id)  # its storage too: an agent cannot fill the disk
