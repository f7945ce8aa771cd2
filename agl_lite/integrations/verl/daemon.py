"""AglLiteDaemon: one training step's data, and the weight sync between steps, over the agl-lite HTTP API.

A step enqueues `n` rollouts per sample under one group id, follows the completion cursor until every rollout is
terminal or the timeout passes (a group with a straggler is dropped whole, its stragglers cancelled), streams the
triplets of the complete groups, merges them into rows and builds the batch VERL trains on. Requests: one per page
of completions and one per page of triplets, never one per rollout; memory: one page of triplets plus the batch.
It needs no torch: `to_dataproto` (in `agl_lite.integrations.verl.dataproto`) makes the `DataProto`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from agl_lite.client import AglLiteClient, BadRequestError, ClientError, GatewayState
from agl_lite.integrations.batch import Batch, BatchBuilder, BatchConfig
from agl_lite.integrations.mismatch import Decode
from agl_lite.integrations.rewards import row_rewards
from agl_lite.integrations.trajectory import MergeStats, merge_trajectories, single_rows
from agl_lite.store.records import Rollout, RolloutConfig, RolloutStatus
from agl_lite.store.triplets import AttemptScope, RewardPolicy, RolloutTriplets, TripletOptions

__all__ = ["AglLiteDaemon", "DaemonConfig", "Sample", "Scorer", "StepMetrics", "StepResult"]

_TRAINABLE = frozenset({RolloutStatus.SUCCEEDED, RolloutStatus.FAILED})
"""A rollout the runner gave its verdict on; a cancelled one makes its group incomplete."""

Scorer = Callable[[RolloutTriplets, "Sample"], float | None]
"""The algorithm's reward for a rollout from what it said (its triplets, with their text) and its sample (the
reference answer in its metadata); None leaves the rollout's own reward. The daemon posts it with the admin key."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One prompt of the training set: the agent's input, and your metadata (reference answers...)."""

    input: Any
    metadata: dict[str, Any] = field(default_factory=dict)
    group_id: str | None = None
    """The GRPO group id (VERL's `uid`); a fresh one when None."""


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    model: str
    """The model name agents call (a route of the gateway); `weight_sync` updates its registry entry."""
    max_prompt_length: int
    max_response_length: int
    pad_token_id: int
    n: int = 4
    """Rollouts per sample (the GRPO group size)."""
    merge: Literal["trajectory", "none"] = "trajectory"
    """`trajectory`: a rollout's calls merged into prefix-tree rows; `none`: one row per call and choice."""
    reward_policy: RewardPolicy = RewardPolicy.LAST
    missing_reward: float = 0.0
    """The reward of a rollout that has none (counted in the metrics)."""
    attempts: AttemptScope = AttemptScope.FINAL
    timeout_s: float = 1800.0
    """How long a step waits for its rollouts; groups still incomplete then are dropped."""
    page_size: int = 100
    """Completions per cursor request."""
    coalesce_s: float = 0.5
    """After a partial page of completions, wait this long before asking again, so that completions trickling in
    one by one still cost one request per page rather than one per rollout (0: ask again at once)."""
    triplet_page_bytes: int = 8 * 1024 * 1024
    mode: str = "train"
    rollout_config: RolloutConfig | None = None
    cancel_stragglers: bool = True
    failed_rollouts: Literal["drop", "train"] = "drop"
    """A rollout whose agent failed (it crashed, timed out, its pod was lost: status `failed`) says nothing about
    the policy: `drop` leaves it out of the batch (its group trains on the others), `train` trains on it with
    its reward (or `missing_reward`)."""

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError("n must be at least 1")
        BatchConfig(self.max_prompt_length, self.max_response_length, self.pad_token_id)


@dataclass(slots=True)
class StepMetrics:
    rollouts: int = 0
    """Enqueued."""
    completed: int = 0
    trained_rollouts: int = 0
    """In complete groups."""
    with_reward: int = 0
    without_reward: int = 0
    without_triplets: int = 0
    triplets: int = 0
    skipped_calls: int = 0
    """Calls not trained on (not `ok`, or ids incomplete)."""
    groups: int = 0
    dropped_groups: int = 0
    stragglers: int = 0
    failed_rollouts: int = 0
    """Left out of the batch: their agent failed (`failed_rollouts = "drop"`)."""
    mean_reward: float = 0.0
    """Over the trained rollouts, with the fill value for those without a reward."""
    merge: MergeStats = field(default_factory=MergeStats)
    truncated_responses: int = 0
    dropped_prompts: int = 0
    lost_step_rewards: int = 0
    prompt_tokens: int = 0
    response_tokens: int = 0
    trained_tokens: int = 0
    store_requests: int = 0
    """HTTP requests this step made to the service."""

    def as_dict(self, prefix: str = "agl_lite/") -> dict[str, float]:
        """Flat numbers for a trainer's logger."""
        out: dict[str, float] = {}
        for name in self.__dataclass_fields__:
            if name != "merge":
                out[prefix + name] = float(getattr(self, name))
        m = self.merge
        for name in ("rows", "merged_rows", "merged_steps", "split_version", "split_mismatch", "branches"):
            out[f"{prefix}{name}"] = float(getattr(m, name))
        out[prefix + "shared_steps"] = float(m.shared_steps)
        for kind, count in m.mismatches.items():
            out[f"{prefix}mismatch/{kind.value}"] = float(count)
        return out


@dataclass(slots=True, eq=False)
class StepResult:
    batch: Batch
    metrics: StepMetrics
    groups: list[list[Rollout]]
    """The rollouts of each sample, in the order given (terminal ones as they ended)."""
    dropped: list[str]
    """Group ids dropped for a straggler (or a cancelled member)."""


class AglLiteDaemon:
    """`daemon.step(samples)` → a `StepResult`; `async with daemon.weight_sync(endpoints, version): ...`."""

    def __init__(self, client: AglLiteClient, config: DaemonConfig, *, decode: Decode | None = None) -> None:
        self.client = client
        self.config = config
        self.decode = decode
        """A tokenizer's decode (special tokens kept): makes the mismatch diagnosis exact by text."""
        self.cursor: int | None = None
        """Where the completion cursor was read up to (the head, the first time)."""
        self.model_version: str | None = None

    async def _head(self) -> int:
        try:
            _, head = await self.client.completed(0, 0)
        except BadRequestError:  # a server that does not know `limit=0`: follow the cursor from its start
            head = 0
        return head

    async def step(self, samples: Sequence[Sample], *, score: Scorer | None = None) -> StepResult:
        """Run `samples` (each `n` times), and the batch of their complete groups; `score` rewards each rollout
        as the algorithm sees it (posted to the store, so the rollout keeps it)."""
        cfg = self.config
        requests_before = self.client.http.requests
        if self.cursor is None:
            self.cursor = await self._head()  # before enqueueing, so that no completion of ours comes earlier
        group_ids = [s.group_id or f"grp-{uuid.uuid4().hex[:16]}" for s in samples]
        groups = await self.client.enqueue_group(
            [s.input for s in samples],
            n=cfg.n,
            mode=cfg.mode,
            config=cfg.rollout_config,
            metadata_per_input=[s.metadata for s in samples],
            group_ids=group_ids,
        )
        done = await self._collect([r.id for g in groups for r in g])
        metrics = StepMetrics(rollouts=sum(len(g) for g in groups), completed=len(done), groups=len(groups))
        kept: list[Rollout] = []
        dropped: list[str] = []
        final: list[list[Rollout]] = []
        for gid, group in zip(group_ids, groups, strict=True):
            ended = [done.get(r.id) for r in group]
            final.append([e or r for e, r in zip(ended, group, strict=True)])
            if all(e is not None and e.status in _TRAINABLE for e in ended):
                for e in ended:
                    assert e is not None
                    if e.status is RolloutStatus.FAILED and cfg.failed_rollouts == "drop":
                        metrics.failed_rollouts += 1
                    else:
                        kept.append(e)
                continue
            dropped.append(gid)
            stragglers = [r.id for r, e in zip(group, ended, strict=True) if e is None]
            metrics.stragglers += len(stragglers)
            if cfg.cancel_stragglers:
                await self._cancel(stragglers)
        metrics.dropped_groups = len(dropped)
        by_rollout = {r.id: s for s, g in zip(samples, groups, strict=True) for r in g}
        batch = await self._assemble(kept, metrics, score, by_rollout)
        metrics.store_requests = self.client.http.requests - requests_before
        return StepResult(batch, metrics, final, dropped)

    async def _collect(self, ids: Sequence[str]) -> dict[str, Rollout]:
        """Follow the completion cursor until every id is terminal or the step's timeout passed."""
        cfg = self.config
        pending = set(ids)
        done: dict[str, Rollout] = {}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + cfg.timeout_s
        assert self.cursor is not None
        while pending:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            rows, self.cursor = await self.client.completed(self.cursor, cfg.page_size, min(remaining, 60.0))
            for rollout in rows:
                if rollout.id in pending:
                    pending.discard(rollout.id)
                    done[rollout.id] = rollout
            if pending and 0 < len(rows) < cfg.page_size and cfg.coalesce_s > 0:
                await asyncio.sleep(min(cfg.coalesce_s, max(deadline - loop.time(), 0.0)))
        return done

    async def _cancel(self, ids: Sequence[str]) -> None:
        for rid in ids:
            with contextlib.suppress(ClientError):  # it may have ended meanwhile: a 409 is fine
                await self.client.cancel(rid, "dropped: its group had a straggler at the step's timeout")

    async def _assemble(
        self,
        rollouts: Sequence[Rollout],
        metrics: StepMetrics,
        score: Scorer | None,
        samples: dict[str, Sample],
    ) -> Batch:
        cfg = self.config
        builder = BatchBuilder(BatchConfig(cfg.max_prompt_length, cfg.max_response_length, cfg.pad_token_id))
        options = TripletOptions(cfg.attempts, cfg.reward_policy, cfg.missing_reward)
        rewards_sum = 0.0
        stream = self.client.iter_triplets(
            [r.id for r in rollouts], options, max_bytes=cfg.triplet_page_bytes
        )
        posts: list[asyncio.Task[Any]] = []
        async for rt in stream:
            if score is not None and (value := score(rt, samples[rt.rollout_id])) is not None:
                rt = dataclasses.replace(rt, reward=float(value), reward_source="admin")
                posts.append(asyncio.ensure_future(self.client.reward(rt.rollout_id, float(value))))
            rewards_sum += self._add_rollout(builder, rt, metrics)
        await asyncio.gather(*posts)
        st = builder.stats
        metrics.trained_rollouts = len(rollouts)
        metrics.mean_reward = rewards_sum / len(rollouts) if rollouts else 0.0
        metrics.truncated_responses = st.truncated_responses
        metrics.dropped_prompts = st.dropped_prompts
        metrics.lost_step_rewards = st.lost_step_rewards
        metrics.prompt_tokens, metrics.response_tokens = st.prompt_tokens, st.response_tokens
        metrics.trained_tokens = st.trained_tokens
        return builder.build()

    def _add_rollout(self, builder: BatchBuilder, rt: RolloutTriplets, metrics: StepMetrics) -> float:
        cfg = self.config
        if rt.reward is None:
            metrics.without_reward += 1
        else:
            metrics.with_reward += 1
        metrics.triplets += len(rt.triplets)
        metrics.skipped_calls += sum(rt.skipped.values())
        if not rt.triplets:
            metrics.without_triplets += 1
        if cfg.merge == "trajectory":
            rows, stats = merge_trajectories(rt.triplets, decode=self.decode)
        else:
            rows, stats = single_rows(rt.triplets)
        metrics.merge.add(stats)
        uid = rt.group_id or rt.rollout_id
        for row, rewards in zip(
            rows, row_rewards(rows, rt, cfg.reward_policy, cfg.missing_reward), strict=True
        ):
            builder.add(row, rewards, uid=uid, rollout_id=rt.rollout_id)
        return rt.reward if rt.reward is not None else cfg.missing_reward

    @asynccontextmanager
    async def weight_sync(
        self,
        endpoints: Sequence[str],
        version: str,
        *,
        drain_timeout_s: float = 60.0,
        hold_timeout_s: float | None = None,
        served_model: str | None = None,
    ) -> AsyncIterator[GatewayState]:
        """Pause the gateway (new LLM calls are held), wait for the calls in flight to drain, run the block (load
        the new weights into the servers), register `endpoints` and `version` for the model, and resume. If the
        block fails, the registry is left as it was and the gateway resumes all the same. `served_model`: the
        name the new servers serve the model under, when it is not the route's own."""
        async with self.client.paused(
            drain_timeout_s=drain_timeout_s, hold_timeout_s=hold_timeout_s, mode="hold"
        ) as state:
            yield state
            await self.client.put_model(self.config.model, list(endpoints), version, served_model)
        self.model_version = version
