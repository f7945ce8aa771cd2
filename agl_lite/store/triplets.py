"""Triplets: what a trainer takes from a rollout (DESIGN.md §6) — one per captured call and choice whose whole
response reached the client (`ok`) with complete token ids, in request order: prompt ids, response ids, logprobs,
reward and metadata. Only the final attempt's calls count unless asked; nothing is de-duplicated by prompt.

Pure functions over the store's records, plus `rollout_triplets`, which pages through a `Store`: the
`/api/.../triplets` routes and in-process users share it. Merging calls into trajectories is the trainer side's job
(`agl_lite.integrations`), not this module's.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from hashlib import blake2b
from typing import Any

import orjson

from agl_lite.store.records import (
    Attempt,
    AttemptStatus,
    CallOutcome,
    ChoiceRecord,
    Event,
    LLMCall,
    Rollout,
    shallow_json,
)
from agl_lite.store.rules import REWARD_KIND, Store, rollout_reward

__all__ = [
    "AttemptScope",
    "RewardInfo",
    "RewardPolicy",
    "RolloutTriplets",
    "Triplet",
    "TripletOptions",
    "build_triplets",
    "final_attempt",
    "resolve_rewards",
    "rollout_triplets",
    "triplets_page",
]

_PAGE = 1000
"""Calls and events read per store request."""


class RewardPolicy(StrEnum):
    """Where a rollout's reward goes when the rollout made several calls."""

    LAST = "last"
    """On the last step only: the latest call of each attempt (all its choices); the others get 0."""
    BROADCAST = "broadcast"
    """On every step."""


class AttemptScope(StrEnum):
    FINAL = "final"
    """Only the calls of the rollout's last attempt (earlier attempts failed: their calls are not the episode)."""
    ALL = "all"


@dataclass(frozen=True, slots=True)
class TripletOptions:
    attempts: AttemptScope = AttemptScope.FINAL
    reward_policy: RewardPolicy = RewardPolicy.LAST
    missing_reward: float = 0.0
    """The reward of a rollout that has none (such rollouts are flagged, never silently rewarded)."""

    def to_json(self) -> dict[str, Any]:
        return shallow_json(self, attempts=self.attempts.value, reward_policy=self.reward_policy.value)


@dataclass(slots=True, eq=False)
class Triplet:
    """One call's choice: what the model saw and said, with the reward it earned and where it came from."""

    rollout_id: str
    attempt_id: str | None
    call_id: str
    order_key: int
    """The call's ordering key (request start): triplets sort by it."""
    turn: int
    """Position of its call among the trained calls of its attempt, from 0 (the choices of one call share it)."""
    response_id: str | None
    choice: int
    model: str | None
    model_version: str | None
    sampling: dict[str, Any]
    group_id: str | None
    prompt_ids: array[int]
    response_ids: array[int]
    logprobs: array[float] | None
    """One per response token, or None when any is missing (never a NaN that would poison a loss)."""
    reward: float = 0.0
    """After the reward policy: the step's own reward, else the rollout's (per policy), else 0."""
    step_reward: float | None = None
    """A reward that named this step (response id + choice index), if any."""
    text: str | None = None
    finish_reason: str | None = None
    conversation: list[str] = field(default_factory=list)
    """`role:digest` of each message the call sent (or of its prompt string), to tell continued conversations."""
    reply: str = ""
    """`assistant:digest` of this choice as the message an agent would send back."""

    def to_json(self) -> dict[str, Any]:
        return shallow_json(
            self,
            prompt_ids=self.prompt_ids.tolist(),
            response_ids=self.response_ids.tolist(),
            logprobs=None if self.logprobs is None else self.logprobs.tolist(),
        )

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Triplet:
        lps = d.get("logprobs")
        return cls(
            rollout_id=d["rollout_id"],
            attempt_id=d.get("attempt_id"),
            call_id=d["call_id"],
            order_key=int(d["order_key"]),
            turn=int(d.get("turn", 0)),
            response_id=d.get("response_id"),
            choice=int(d.get("choice", 0)),
            model=d.get("model"),
            model_version=d.get("model_version"),
            sampling=dict(d.get("sampling") or {}),
            group_id=d.get("group_id"),
            prompt_ids=array("I", d["prompt_ids"]),
            response_ids=array("I", d["response_ids"]),
            logprobs=None if lps is None else array("f", lps),
            reward=float(d.get("reward", 0.0)),
            step_reward=None if d.get("step_reward") is None else float(d["step_reward"]),
            text=d.get("text"),
            finish_reason=d.get("finish_reason"),
            conversation=list(d.get("conversation") or ()),
            reply=str(d.get("reply", "")),
        )


@dataclass(slots=True)
class RewardInfo:
    """A rollout's authoritative rewards: the outcome (last reward naming no step) and the per-step ones."""

    value: float | None = None
    source: str | None = None
    steps: dict[tuple[str, int], float] = field(default_factory=dict)
    """(response id, choice index) → the last reward naming that step."""


@dataclass(slots=True, eq=False)
class RolloutTriplets:
    rollout_id: str
    group_id: str | None
    status: str
    mode: str
    reward: float | None
    """The outcome reward, None when the rollout has none (then `missing_reward` went into the triplets)."""
    reward_source: str | None
    attempt_ids: list[str]
    """The attempts whose calls were considered."""
    triplets: list[Triplet]
    skipped: dict[str, int] = field(default_factory=dict)
    """Calls left out, by reason: `late` (committed after the rollout ended), `not_ok` (outcome), `incomplete` (ids
    missing or short)."""

    def to_json(self) -> dict[str, Any]:
        return shallow_json(self, triplets=[t.to_json() for t in self.triplets])

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RolloutTriplets:
        return cls(
            rollout_id=d["rollout_id"],
            group_id=d.get("group_id"),
            status=d.get("status", ""),
            mode=d.get("mode", ""),
            reward=None if d.get("reward") is None else float(d["reward"]),
            reward_source=d.get("reward_source"),
            attempt_ids=list(d.get("attempt_ids") or ()),
            triplets=[Triplet.from_json(t) for t in d.get("triplets") or ()],
            skipped=dict(d.get("skipped") or {}),
        )


# --- rewards -----------------------------------------------------------------------------------------------------


def resolve_rewards(rollout: Rollout, events: Iterable[Event]) -> RewardInfo:
    """The last authoritative reward naming no step is the outcome; one naming a response id (+ choice) rewards
    that step. Events must come in their sequence order."""
    info = RewardInfo()
    for event in events:
        if event.kind != REWARD_KIND or not rollout_reward(event.source, rollout):
            continue
        data = event.data
        value = data.get("value") if isinstance(data, dict) else data
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            continue
        step = data.get("response_id") if isinstance(data, dict) else None
        if isinstance(step, str):
            choice = data.get("choice") or 0
            info.steps[(step, int(choice) if isinstance(choice, int) else 0)] = float(value)
        else:
            info.value, info.source = float(value), event.source
    return info


def apply_reward_policy(
    triplets: Sequence[Triplet], info: RewardInfo, policy: RewardPolicy, missing: float
) -> None:
    """Set each triplet's `step_reward` and `reward`: a step's own reward replaces the rollout's on that step; the
    rollout's goes on every step (broadcast) or on the latest call of each attempt (last); else 0."""
    outcome = info.value if info.value is not None else missing
    last: dict[str | None, int] = {}
    for t in triplets:
        last[t.attempt_id] = max(last.get(t.attempt_id, t.order_key), t.order_key)
    for t in triplets:
        t.step_reward = None
        if t.response_id is not None:
            t.step_reward = info.steps.get((t.response_id, t.choice))
        if t.step_reward is not None:
            t.reward = t.step_reward
        elif policy is RewardPolicy.BROADCAST or t.order_key == last[t.attempt_id]:
            t.reward = outcome
        else:
            t.reward = 0.0


# --- triplets from calls -----------------------------------------------------------------------------------------


def _digest(role: str, payload: Any) -> str:
    return role + ":" + blake2b(orjson.dumps(payload), digest_size=8).hexdigest()


def _message_text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _tool_calls(calls: Any) -> list[list[str]]:
    out = []
    for call in calls or ():
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict):
            out.append([str(fn.get("name") or ""), str(fn.get("arguments") or "")])
    return out


def _message_digest(message: Any) -> str:
    """A message by what a chat template renders of it: role, text, tool calls, tool result id (SDK extras such
    as `refusal: null` do not change it)."""
    if not isinstance(message, dict):
        return _digest("?", message)
    role = str(message.get("role", ""))
    payload = [_message_text(message.get("content")), _tool_calls(message.get("tool_calls"))]
    if message.get("tool_call_id") is not None:
        payload.append(str(message["tool_call_id"]))
    return _digest(role, payload)


def _conversation(call: LLMCall) -> list[str]:
    # A translated call (Anthropic) keeps the chat-completions body it was sent upstream as: that is what rendered.
    body = getattr(call, "upstream_request", None) or call.request
    if not isinstance(body, dict):
        return []
    messages = body.get("messages")
    if isinstance(messages, list):
        return [_message_digest(m) for m in messages]
    prompt = body.get("prompt")
    return [_digest("prompt", prompt)] if isinstance(prompt, str) else []


def _reply(choice: ChoiceRecord) -> str:
    return _digest("assistant", [choice.text or "", _tool_calls(choice.tool_calls)])


def _usable_logprobs(choice: ChoiceRecord) -> array[float] | None:
    lps = choice.logprobs
    if lps is None or len(lps) != len(choice.token_ids) or any(x != x for x in lps):  # x != x: NaN
        return None
    return lps


def _eligible(call: LLMCall) -> str | None:
    """Why a call is left out (None: it is trained on)."""
    if call.late:
        return "late"
    if call.outcome is not CallOutcome.OK:
        return "not_ok"
    if call.complete is False or not call.prompt_token_ids or not call.choices:
        return "incomplete"
    if call.complete is None and not all(c.token_ids for c in call.choices):
        return "incomplete"  # nothing to check the ids against (no usage), and some are missing
    return None


def build_triplets(
    rollout: Rollout,
    calls: Iterable[LLMCall],
    info: RewardInfo,
    options: TripletOptions = TripletOptions(),
    *,
    attempt_ids: Sequence[str] = (),
) -> RolloutTriplets:
    """The rollout's triplets from its calls (any order; sorted here by ordering key, then choice)."""
    triplets: list[Triplet] = []
    skipped: dict[str, int] = {}
    turns: dict[str | None, int] = {}
    ordered = sorted(calls, key=lambda c: c.order_key)
    if info.steps:
        # A step reward may name the id the client saw (an Anthropic `msg_...`): map it to the upstream's.
        seen = {c.client_id: c.response_id for c in ordered if c.client_id and c.response_id}
        steps = {(seen.get(rid, rid), choice): v for (rid, choice), v in info.steps.items()}
        info = RewardInfo(info.value, info.source, steps)
    for call in ordered:
        reason = _eligible(call)
        if reason is not None:
            skipped[reason] = skipped.get(reason, 0) + 1
            continue
        assert call.prompt_token_ids is not None
        turn = turns.get(call.attempt_id, 0)
        turns[call.attempt_id] = turn + 1
        conversation = _conversation(call)
        for choice in sorted(call.choices, key=lambda c: c.index):
            triplets.append(
                Triplet(
                    rollout_id=rollout.id,
                    attempt_id=call.attempt_id,
                    call_id=call.id,
                    order_key=call.order_key,
                    turn=turn,
                    response_id=call.response_id,
                    choice=choice.index,
                    model=call.model,
                    model_version=call.model_version,
                    sampling=call.sampling,
                    group_id=rollout.group_id,
                    prompt_ids=call.prompt_token_ids,
                    response_ids=choice.token_ids,
                    logprobs=_usable_logprobs(choice),
                    text=choice.text,
                    finish_reason=choice.finish_reason,
                    conversation=conversation,
                    reply=_reply(choice),
                )
            )
    apply_reward_policy(triplets, info, options.reward_policy, options.missing_reward)
    return RolloutTriplets(
        rollout_id=rollout.id,
        group_id=rollout.group_id,
        status=rollout.status.value,
        mode=rollout.mode,
        reward=info.value,
        reward_source=info.source,
        attempt_ids=list(attempt_ids),
        triplets=triplets,
        skipped=skipped,
    )


# --- reading a store ---------------------------------------------------------------------------------------------


async def _reward_events(store: Store, rollout_id: str) -> list[Event]:
    events: list[Event] = []
    after = 0
    while page := await store.events(rollout_id, REWARD_KIND, after, _PAGE):
        events += page
        if len(page) < _PAGE:
            break
        after = page[-1].seq
    return events


def final_attempt(attempts: Sequence[Attempt]) -> Attempt:
    """The attempt whose calls are the rollout's episode: the last one that succeeded; else the last one that
    was not lost or cancelled (a failed, timed-out or running one: the agent's own end); else the last started.
    An attempt that overlapped a later one (a pod the Job controller replaced while it ran on) can be the one
    that succeeded: the later, lost one's calls are not the episode."""
    by_seq = sorted(attempts, key=lambda a: a.seq)
    for keep in (_SUCCEEDED, _THE_AGENTS):
        chosen = [a for a in by_seq if a.status in keep]
        if chosen:
            return chosen[-1]
    return by_seq[-1]


_SUCCEEDED = frozenset({AttemptStatus.SUCCEEDED})
_THE_AGENTS = frozenset({AttemptStatus.FAILED, AttemptStatus.TIMEOUT, AttemptStatus.RUNNING})
"""Attempts that ended by the agent's own doing (or run on): not the infrastructure's (lost) nor a cancel's."""


async def rollout_triplets(
    store: Store, rollout_id: str, options: TripletOptions = TripletOptions()
) -> RolloutTriplets:
    """A rollout's triplets read from `store` a page at a time (NotFound for an unknown rollout)."""
    rollout = await store.get_rollout(rollout_id)
    attempts = await store.attempts(rollout_id)
    info = resolve_rewards(rollout, await _reward_events(store, rollout_id))
    scope: str | None = None
    if options.attempts is AttemptScope.FINAL and attempts:
        scope = final_attempt(attempts).id
    calls: list[LLMCall] = []
    after = -1
    while page := await store.calls(rollout_id, scope, after, _PAGE):
        calls += page
        if len(page) < _PAGE:
            break
        after = page[-1].order_key
    ids = [scope] if scope is not None else [a.id for a in sorted(attempts, key=lambda a: a.seq)]
    return build_triplets(rollout, calls, info, options, attempt_ids=ids)


async def triplets_page(
    store: Store, rollout_ids: Sequence[str], options: TripletOptions, max_bytes: int
) -> tuple[bytes, int]:
    """NDJSON, one line per rollout in the order asked, until `max_bytes` is reached (at least one line): the body
    and how many rollouts it holds. The caller asks again for the rest, so memory stays bounded on both sides."""
    lines: list[bytes] = []
    size = 0
    for rid in rollout_ids:
        line = orjson.dumps((await rollout_triplets(store, rid, options)).to_json()) + b"\n"
        lines.append(line)
        size += len(line)
        if size >= max_bytes:
            break
    return b"".join(lines), len(lines)
