"""The memory backend: dicts in the process, for tests and throwaway runs. Nothing survives a restart.

Operations run inline on the event loop (no awaits inside), so each one is atomic; records are copied in and out
so a caller can never change stored state by mutating what it got back.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Callable
from typing import TypeVar

import orjson

from agl_lite.store.records import (
    Attempt,
    Event,
    LLMCall,
    ModelRecord,
    Resource,
    Rollout,
    RolloutStatus,
)
from agl_lite.store.rules import RolloutFilter, Store, within_bytes

__all__ = ["MemoryRepo", "MemoryStore"]

T = TypeVar("T")


class MemoryRepo:
    def __init__(self) -> None:
        self._rollouts: dict[str, Rollout] = {}
        self._attempts: dict[str, dict[str, Attempt]] = defaultdict(dict)
        self._events: dict[str, list[Event]] = defaultdict(list)
        self._calls: list[LLMCall] = []
        self._versions: dict[str, set[str]] = {}  # each rollout's model versions (the list's filter)
        self._resources: dict[str, list[Resource]] = defaultdict(list)
        self._models: dict[str, ModelRecord] = {}
        self._deleted_responses: set[str] = set()
        self._completed: list[Rollout] = []
        self._enqueue_seq = 0
        self._last_created = 0.0

    def get_rollout(self, rollout_id: str) -> Rollout | None:
        r = self._rollouts.get(rollout_id)
        return copy.copy(r) if r is not None else None

    def rollout_state(self, rollout_id: str) -> RolloutStatus | None:
        r = self._rollouts.get(rollout_id)
        return r.status if r is not None else None

    def put_rollout(self, rollout: Rollout, *, new: bool) -> None:
        stored = copy.copy(rollout)
        self._rollouts[rollout.id] = stored
        self._enqueue_seq = max(self._enqueue_seq, rollout.enqueue_seq)
        self._last_created = max(self._last_created, rollout.created_at)
        if rollout.completion_seq is not None and rollout.completion_seq > self.last_completion_seq():
            self._completed.append(stored)

    def list_rollouts(self, flt: RolloutFilter) -> list[Rollout]:
        out = []
        for r in sorted(self._rollouts.values(), key=lambda r: r.enqueue_seq):
            if r.enqueue_seq <= flt.after:
                continue
            if flt.status is not None and r.status is not flt.status:
                continue
            if flt.mode is not None and r.mode != flt.mode:
                continue
            if flt.group_id is not None and r.group_id != flt.group_id:
                continue
            if (flt.reward_min is not None or flt.reward_max is not None) and (
                r.reward is None
                or (flt.reward_min is not None and r.reward < flt.reward_min)
                or (flt.reward_max is not None and r.reward > flt.reward_max)
            ):
                continue
            if (flt.created_after is not None and r.created_at < flt.created_after) or (
                flt.created_before is not None and r.created_at >= flt.created_before
            ):
                continue
            if flt.model_version is not None and flt.model_version not in self._versions.get(r.id, ()):
                continue
            out.append(copy.copy(r))
            if len(out) >= flt.limit:
                break
        return out

    def last_created_at(self) -> float:
        return self._last_created

    def queued(self, limit: int) -> list[Rollout]:
        return self.list_rollouts(RolloutFilter(status=RolloutStatus.QUEUING, limit=limit))

    def running(self) -> list[Rollout]:
        return [copy.copy(r) for r in self._rollouts.values() if r.status is RolloutStatus.RUNNING]

    def last_enqueue_seq(self) -> int:
        return self._enqueue_seq

    def last_completion_seq(self) -> int:
        return len(self._completed)  # completion_seq n is at index n - 1

    def completed_after(self, after: int, limit: int) -> list[Rollout]:
        # completion_seq grows by one per terminal rollout, so the list index is the cursor
        return [copy.copy(self._rollouts[r.id]) for r in self._completed[after : after + limit]]

    def get_attempt(self, rollout_id: str, attempt_id: str) -> Attempt | None:
        a = self._attempts[rollout_id].get(attempt_id)
        return copy.copy(a) if a is not None else None

    def attempts(self, rollout_id: str) -> list[Attempt]:
        return sorted((copy.copy(a) for a in self._attempts[rollout_id].values()), key=lambda a: a.seq)

    def put_attempt(self, attempt: Attempt, *, new: bool) -> None:
        self._attempts[attempt.rollout_id][attempt.id] = copy.copy(attempt)

    def last_event_seq(self, rollout_id: str) -> int:
        events = self._events[rollout_id]
        return events[-1].seq if events else 0

    def add_event(self, event: Event) -> int:
        self._events[event.rollout_id].append(copy.copy(event))
        return _size(event)

    def events(
        self, rollout_id: str, kind: str | None, after_seq: int, limit: int, max_bytes: int | None = None
    ) -> list[Event]:
        out = [copy.copy(e) for e in self._events[rollout_id] if e.seq > after_seq and kind in (None, e.kind)]
        return within_bytes(out[:limit], max_bytes, _size)

    def add_call(self, call: LLMCall, event: Event | None = None) -> int:
        self._calls.append(copy.deepcopy(call))
        if call.rollout_id is not None and call.model_version is not None:
            self._versions.setdefault(call.rollout_id, set()).add(call.model_version)
        return _size(call) + (self.add_event(event) if event is not None else 0)

    def rollout_bytes(self, rollout_id: str) -> int:
        return sum(_size(e) for e in self._events[rollout_id]) + sum(
            _size(c) for c in self._calls if c.rollout_id == rollout_id
        )

    def rollout_tokens(self, rollout_id: str) -> int:
        return sum(sum(c.tokens()) for c in self._calls if c.rollout_id == rollout_id)

    def calls(
        self,
        rollout_id: str | None,
        attempt_id: str | None,
        after_order_key: int,
        limit: int,
        max_bytes: int | None = None,
        label: tuple[str, str] | None = None,
    ) -> list[LLMCall]:
        out = [
            copy.deepcopy(c)
            for c in sorted(self._calls, key=lambda c: c.order_key)
            if c.rollout_id == rollout_id
            and attempt_id in (None, c.attempt_id)
            and c.order_key > after_order_key
            and (label is None or c.labels.get(label[0]) == label[1])
        ]
        return within_bytes(out[:limit], max_bytes, _size)

    def response_call(self, response_id: str) -> LLMCall | None:
        found = next((c for c in self._calls if c.id == response_id), None)
        return None if found is None else copy.deepcopy(found)

    def delete_response(self, call_id: str, at: float) -> bool:
        new = call_id not in self._deleted_responses
        self._deleted_responses.add(call_id)
        return new

    def response_deleted(self, call_id: str) -> bool:
        return call_id in self._deleted_responses

    def last_resource_version(self, name: str) -> int:
        versions = self._resources[name]
        return versions[-1].version if versions else 0

    def put_resource(self, resource: Resource) -> None:
        self._resources[resource.name].append(copy.copy(resource))

    def get_resource(self, name: str, version: int | None) -> Resource | None:
        for r in reversed(self._resources.get(name, [])):
            if version is None or r.version == version:
                return copy.copy(r)
        return None

    def resource_versions(self, name: str, after: int, limit: int) -> list[Resource]:
        return [copy.copy(r) for r in self._resources.get(name, ()) if r.version > after][:limit]

    def latest_resources(self) -> list[Resource]:
        return [copy.copy(v[-1]) for _, v in sorted(self._resources.items()) if v]

    def put_model(self, model: ModelRecord) -> None:
        self._models[model.name] = copy.copy(model)

    def delete_model(self, name: str) -> ModelRecord | None:
        return self._models.pop(name, None)

    def models(self) -> list[ModelRecord]:
        return [copy.copy(m) for _, m in sorted(self._models.items())]


class MemoryStore(Store):
    def __init__(self) -> None:
        super().__init__()
        self.repo = MemoryRepo()

    async def _write(self, fn: Callable[[MemoryRepo], T]) -> T:
        return fn(self.repo)

    async def _read(self, fn: Callable[[MemoryRepo], T]) -> T:
        return fn(self.repo)


def _size(record: Event | LLMCall) -> int:
    """What the record would take stored (its JSON; a call's ids as 4 bytes each, as SQLite packs them)."""
    if isinstance(record, Event):
        return len(orjson.dumps(record.to_json()))
    ids = len(record.prompt_token_ids or ()) + sum(len(c.token_ids) for c in record.choices)
    return len(orjson.dumps(record.to_json(with_ids=False))) + 4 * ids
