"""AglLiteClient: the store API and the gateway controls over HTTP, for trainers, the CLI and remote runners.

It has the public methods of `agl_lite.store.rules.Store` with the same names, signatures and records, so a runner
works the same against the in-process store and a remote one; plus the trainer's helpers (`enqueue_group`,
`wait`, `completions`, `reward`, `paused`). It must not import the gateway's addons: HTTP only.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Literal

import aiohttp

from agl_lite.client import payloads
from agl_lite.client.completions import Completions, Progress, wait_for
from agl_lite.client.errors import BadRequestError
from agl_lite.client.pause import paused
from agl_lite.client.results import AttemptEnv, GatewayState, StartedAttempt, WaitResult
from agl_lite.client.retry import RetryPolicy
from agl_lite.client.settings import ClientSettings, Timeouts
from agl_lite.client.transport import Transport, path
from agl_lite.client.triplets import DEFAULT_PAGE_BYTES, iter_triplets
from agl_lite.store.records import (
    Attempt,
    AttemptStatus,
    Event,
    LLMCall,
    ModelRecord,
    Resource,
    Rollout,
    RolloutConfig,
    RolloutStatus,
)
from agl_lite.store.rules import EventSpec, RolloutFilter, RolloutSpec
from agl_lite.store.triplets import RolloutTriplets, TripletOptions

__all__ = ["MAX_BATCH", "AglLiteClient"]

MAX_BATCH = 1000
"""Most rollouts or events the server takes in one request; the client splits bigger batches."""

_R = "/api/rollouts/{}"
FIRST_PAGE = RolloutFilter()
"""The default of `list_rollouts`: the first page of all rollouts (a frozen value, safe to share)."""
DEFAULT_TRIPLETS = TripletOptions()
"""The default of `triplets`: the final attempt, the reward on the last step, 0 for a missing reward."""


def _new_rollout_id() -> str:
    return f"ro-{uuid.uuid4().hex[:16]}"


def _bad(message: str) -> BadRequestError:
    return BadRequestError(message, status_code=400, error_type="invalid_request")


class AglLiteClient:
    """`async with AglLiteClient() as client:` — URL and key from the arguments, else `AGL_URL` / `AGL_KEY`.

    Reads, and writes that are idempotent by design, are retried on connection errors, 5xx and 429 (see
    `RetryPolicy`); other writes are sent once. The client names every rollout it enqueues, so enqueues are
    idempotent too.
    """

    def __init__(
        self,
        url: str | None = None,
        key: str | None = None,
        *,
        timeouts: Timeouts | None = None,
        retry: RetryPolicy | None = None,
        trace_configs: Sequence[aiohttp.TraceConfig] = (),
    ) -> None:
        self.settings = ClientSettings.resolve(url, key, timeouts)
        self.http = Transport(self.settings, retry or RetryPolicy(), trace_configs)

    @property
    def url(self) -> str:
        return self.settings.url

    async def __aenter__(self) -> AglLiteClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.http.close()

    async def _get(self, route: str, params: dict[str, Any] | None = None, *, wait_s: float = 0.0) -> Any:
        clean = {k: v for k, v in (params or {}).items() if v is not None}
        return await self.http.request("GET", route, params=clean, idempotent=True, wait_s=wait_s)

    async def _post(self, route: str, body: Any, *, idempotent: bool = False, wait_s: float = 0.0) -> Any:
        return await self.http.request("POST", route, body=body, idempotent=idempotent, wait_s=wait_s)

    # --- rollouts ------------------------------------------------------------------------------------------------

    async def enqueue(self, specs: Sequence[RolloutSpec]) -> list[Rollout]:
        """Create rollouts (queuing); a spec whose id exists returns the existing rollout unchanged. Specs without
        an id get one here, so a retried enqueue never creates a rollout twice."""
        if not specs:
            raise _bad("no rollouts given")
        bodies = [payloads.spec_to_json(s) for s in specs]
        for body in bodies:
            body["rollout_id"] = body["rollout_id"] or _new_rollout_id()
        out: list[Rollout] = []
        for i in range(0, len(bodies), MAX_BATCH):
            answer = await self._post(
                "/api/rollouts", {"rollouts": bodies[i : i + MAX_BATCH]}, idempotent=True
            )
            out += [payloads.rollout(r) for r in answer["rollouts"]]
        return out

    async def enqueue_group(
        self,
        inputs: Sequence[Any],
        *,
        n: int = 1,
        mode: str = "train",
        config: RolloutConfig | None = None,
        metadata: dict[str, Any] | None = None,
        metadata_per_input: Sequence[dict[str, Any]] | None = None,
        group_ids: Sequence[str] | None = None,
        resources_version: int | None = None,
    ) -> list[list[Rollout]]:
        """`n` copies of each input, the copies of one input sharing a `group_id` (a GRPO group); returns one list
        of rollouts per input. Each copy's metadata is `metadata` updated with that input's `metadata_per_input`."""
        if n < 1:
            raise _bad("n must be at least 1")
        if metadata_per_input is not None and len(metadata_per_input) != len(inputs):
            raise _bad("metadata_per_input needs one entry per input")
        if group_ids is not None and len(group_ids) != len(inputs):
            raise _bad("group_ids needs one entry per input")
        specs = []
        for i, task in enumerate(inputs):
            group = group_ids[i] if group_ids is not None else f"grp-{uuid.uuid4().hex[:16]}"
            meta = {**(metadata or {}), **(metadata_per_input[i] if metadata_per_input else {})}
            specs += [
                RolloutSpec(
                    input=task,
                    mode=mode,
                    config=config or RolloutConfig(),
                    metadata=meta,
                    group_id=group,
                    resources_version=resources_version,
                )
                for _ in range(n)
            ]
        created = await self.enqueue(specs)
        return [created[i * n : (i + 1) * n] for i in range(len(inputs))]

    async def get_rollout(self, rollout_id: str) -> Rollout:
        return payloads.rollout(await self._get(path(_R, rollout_id)))

    async def get_rollout_with_attempts(self, rollout_id: str) -> tuple[Rollout, list[Attempt]]:
        body = await self._get(path(_R, rollout_id))
        return payloads.rollout(body), [payloads.attempt(a) for a in body.get("attempts", [])]

    async def list_rollouts(self, flt: RolloutFilter = FIRST_PAGE) -> list[Rollout]:
        """One keyset page: rollouts enqueued after `flt.after` (an `enqueue_seq`), at most `flt.limit`."""
        params = {
            "status": flt.status.value if flt.status else None,
            "mode": flt.mode,
            "group_id": flt.group_id,
            "reward_min": flt.reward_min,
            "reward_max": flt.reward_max,
            "model_version": flt.model_version,
            "created_after": flt.created_after,
            "created_before": flt.created_before,
            "after": flt.after,
            "limit": flt.limit,
        }
        return [payloads.rollout(r) for r in (await self._get("/api/rollouts", params))["rollouts"]]

    async def iter_rollouts(
        self,
        *,
        status: RolloutStatus | None = None,
        mode: str | None = None,
        group_id: str | None = None,
        after: int = 0,
        page_size: int = 100,
        reward_min: float | None = None,
        reward_max: float | None = None,
        model_version: str | None = None,
        created_after: float | None = None,
        created_before: float | None = None,
    ) -> AsyncIterator[Rollout]:
        """Every matching rollout in enqueue order, one request per page (memory: one page). The filters are
        `RolloutFilter`'s."""
        while True:
            flt = RolloutFilter(
                status,
                mode,
                group_id,
                after,
                page_size,
                reward_min,
                reward_max,
                model_version,
                created_after,
                created_before,
            )
            page = await self.list_rollouts(flt)
            for rollout in page:
                yield rollout
            if len(page) < page_size:
                return
            after = page[-1].enqueue_seq

    async def cancel(self, rollout_id: str, message: str | None = None) -> Rollout:
        """Cancel a queuing or running rollout; ConflictError if it is terminal. Not retried."""
        return payloads.rollout(await self._post(path(_R + "/cancel", rollout_id), {"message": message}))

    async def finish(self, rollout_id: str, status: RolloutStatus, message: str | None = None) -> Rollout:
        """The runner's verdict (succeeded or failed). Not retried."""
        body = {"status": RolloutStatus(status).value, "message": message}
        return payloads.rollout(await self._post(path(_R + "/finish", rollout_id), body))

    async def completed(self, after: int, limit: int = 100, wait: float = 0.0) -> tuple[list[Rollout], int]:
        """One page of the completion cursor past `after`, waiting up to `wait` s (at most 60) for one."""
        body = await self._get(
            "/api/rollouts/completed", {"after": after, "limit": limit, "wait": wait}, wait_s=wait
        )
        return [payloads.rollout(r) for r in body["rollouts"]], int(body["cursor"])

    def completions(self, after: int = 0, *, page_size: int = 100, poll_s: float = 30.0) -> Completions:
        """`async for rollout in client.completions(after=0)`: each rollout as it turns terminal, forever."""
        return Completions(self.completed, after, page_size, poll_s)

    async def wait(
        self,
        ids: Sequence[str],
        timeout: float | None = None,
        *,
        after: int = 0,
        page_size: int = 100,
        poll_s: float = 30.0,
        progress: Progress | None = None,
    ) -> WaitResult:
        """Until every rollout in `ids` is terminal or `timeout` s passed, following the completion cursor from
        `after` (pass the previous result's `cursor` to skip what was already seen)."""
        return await wait_for(
            self.completed, ids, timeout, after=after, page_size=page_size, poll_s=poll_s, progress=progress
        )

    # --- the runner protocol -------------------------------------------------------------------------------------

    async def claim(self, runner_id: str, limit: int) -> list[Rollout]:
        """Move up to `limit` queued rollouts to running, owned by `runner_id`. Not retried."""
        body = await self._post("/api/runner/claim", {"runner_id": runner_id, "limit": limit})
        return [payloads.rollout(r) for r in body["rollouts"]]

    async def running(self) -> list[tuple[Rollout, list[Attempt]]]:
        body = await self._get("/api/runner/running")
        return [
            (payloads.rollout(x["rollout"]), [payloads.attempt(a) for a in x["attempts"]])
            for x in body["running"]
        ]

    async def start_attempt(self, rollout_id: str, attempt_id: str | None = None) -> StartedAttempt:
        """A new attempt of a running rollout, with the env to start its agent in (and the grader's, if any).
        The attempt id is chosen here when not given, so a retry returns the same attempt."""
        if attempt_id == "$(AGL_ATTEMPT_ID)":
            raise _bad("an env template creates no attempt: use attempt_env_template()")
        aid = attempt_id or uuid.uuid4().hex
        body = await self._post(path(_R + "/attempts", rollout_id), {"attempt_id": aid}, idempotent=True)
        base = payloads.attempt(body["attempt"])
        fields = {f: getattr(base, f) for f in Attempt.__dataclass_fields__}
        return StartedAttempt(**fields, env=body["env"], grader_env=body.get("grader_env"))

    async def attempt_env_template(self, rollout_id: str) -> AttemptEnv:
        """The env with `$(AGL_ATTEMPT_ID)` in place of the attempt id (Kubernetes expands it with the pod UID);
        creates no attempt."""
        body = await self._post(
            path(_R + "/attempts", rollout_id), {"attempt_id": "$(AGL_ATTEMPT_ID)"}, idempotent=True
        )
        return AttemptEnv(body["env"], body.get("grader_env"))

    async def update_attempt(
        self,
        rollout_id: str,
        attempt_id: str,
        status: AttemptStatus,
        *,
        exit_code: int | None = None,
        message: str | None = None,
    ) -> Attempt:
        body = {"status": AttemptStatus(status).value, "exit_code": exit_code, "message": message}
        answer = await self.http.request(
            "PATCH", path(_R + "/attempts/{}", rollout_id, attempt_id), body=body, idempotent=False
        )
        return payloads.attempt(answer)

    async def attempts(self, rollout_id: str) -> list[Attempt]:
        return (await self.get_rollout_with_attempts(rollout_id))[1]

    # --- events, rewards and calls -------------------------------------------------------------------------------

    async def add_events(
        self, rollout_id: str, specs: Sequence[EventSpec], *, source: str = "admin"
    ) -> list[Event]:
        """Append events (a `reward` event sets the rollout's reward). Over HTTP the source is always `admin`."""
        if source != "admin":
            raise _bad("over HTTP, events are added with the admin key (source 'admin')")
        if not specs:
            raise _bad("no events given")
        out: list[Event] = []
        for i in range(0, len(specs), MAX_BATCH):
            events = [payloads.event_to_json(s) for s in specs[i : i + MAX_BATCH]]
            body = await self._post(path(_R + "/events", rollout_id), {"events": events})
            out += [payloads.event(e) for e in body["events"]]
        return out

    async def reward(
        self,
        rollout_id: str,
        value: float,
        response_id: str | None = None,
        choice: int | None = None,
        *,
        attempt_id: str | None = None,
    ) -> Event:
        """Post the rollout's reward (admin); naming a call's `response_id` (and `choice`) rewards that step."""
        data: dict[str, Any] = {"value": float(value)}
        if response_id is not None:
            data["response_id"] = response_id
            data["choice"] = choice or 0
        (event,) = await self.add_events(rollout_id, [EventSpec("reward", data, attempt_id)])
        return event

    async def events(
        self,
        rollout_id: str,
        kind: str | None = None,
        after_seq: int = 0,
        limit: int = 1000,
        *,
        max_bytes: int | None = None,
    ) -> list[Event]:
        """One page: at most `limit` events, fewer when they are large (the server bounds a page's stored bytes,
        to `max_bytes` if given)."""
        return (await self._events_page(rollout_id, kind, after_seq, limit, max_bytes))[0]

    async def _events_page(
        self, rollout_id: str, kind: str | None, after_seq: int, limit: int, max_bytes: int | None = None
    ) -> tuple[list[Event], bool]:
        params = {"kind": kind, "after_seq": after_seq, "limit": limit, "max_bytes": max_bytes}
        body = await self._get(path(_R + "/events", rollout_id), params)
        events = [payloads.event(e) for e in body["events"]]
        return events, bool(body.get("more", len(events) == limit))

    async def follow_events(
        self, rollout_id: str, *, kind: str | None = None, after_seq: int = 0, poll_s: float = 1.0
    ) -> AsyncIterator[Event]:
        """Events as they are added (polled every `poll_s` s), until the rollout is terminal and all are read."""
        while True:
            # Read the status first: events added before it turned terminal are then all read below.
            terminal = (await self.get_rollout(rollout_id)).status.terminal
            while True:
                page, more = await self._events_page(rollout_id, kind, after_seq, MAX_BATCH)
                for event in page:
                    yield event
                    after_seq = event.seq
                if not more:
                    break
            if terminal:
                return
            await asyncio.sleep(poll_s)

    async def calls(
        self,
        rollout_id: str | None,
        attempt_id: str | None = None,
        after_order_key: int = -1,
        limit: int = 1000,
        *,
        max_bytes: int | None = None,
        label: tuple[str, str] | None = None,
    ) -> list[LLMCall]:
        """A rollout's captured calls in request order, with their token ids (unattributed calls are not served
        over HTTP); `label=(key, value)`: only those an addon labelled so."""
        if rollout_id is None:
            raise _bad("unattributed calls (rollout_id=None) are not served over HTTP")
        return (await self._calls_page(rollout_id, attempt_id, after_order_key, limit, max_bytes, label))[0]

    async def _calls_page(
        self,
        rollout_id: str,
        attempt_id: str | None,
        after_order_key: int,
        limit: int,
        max_bytes: int | None = None,
        label: tuple[str, str] | None = None,
    ) -> tuple[list[LLMCall], bool]:
        params = {
            "attempt_id": attempt_id,
            "after_order_key": after_order_key,
            "limit": limit,
            "max_bytes": max_bytes,
            "label": None if label is None else f"{label[0]}:{label[1]}",
        }
        body = await self._get(path(_R + "/calls", rollout_id), params)
        calls = [payloads.call(c) for c in body["calls"]]
        return calls, bool(body.get("more", len(calls) == limit))

    async def iter_calls(
        self,
        rollout_id: str,
        *,
        attempt_id: str | None = None,
        page_size: int = 100,
        label: tuple[str, str] | None = None,
    ) -> AsyncIterator[LLMCall]:
        """Every call of a rollout (with `label`: every call so labelled), one request per page (by `order_key`)."""
        after = -1
        while True:
            page, more = await self._calls_page(rollout_id, attempt_id, after, page_size, label=label)
            for call in page:
                yield call
            if not more or not page:
                return
            after = page[-1].order_key

    async def triplets(self, rollout_id: str, options: TripletOptions = DEFAULT_TRIPLETS) -> RolloutTriplets:
        """A rollout's training triplets: its `ok`, complete calls in request order, with rewards resolved."""
        params = options.to_json()
        return RolloutTriplets.from_json(await self._get(path(_R + "/triplets", rollout_id), params))

    def iter_triplets(
        self,
        rollout_ids: Sequence[str],
        options: TripletOptions = DEFAULT_TRIPLETS,
        *,
        max_bytes: int = DEFAULT_PAGE_BYTES,
    ) -> AsyncIterator[RolloutTriplets]:
        """Many rollouts' triplets, in the order given, one request per `max_bytes` of them (memory: one page)."""
        return iter_triplets(self.http, rollout_ids, options, max_bytes)

    # --- resources and models ------------------------------------------------------------------------------------

    async def put_resource(self, name: str, value: Any) -> Resource:
        """A new version of a named resource. Not retried (each call adds a version)."""
        return payloads.resource(await self._post("/api/resources", {"name": name, "value": value}))

    async def get_resource(self, name: str, version: int | None = None) -> Resource:
        return payloads.resource(await self._get(path("/api/resources/{}", name), {"version": version}))

    async def latest_resources(self) -> list[Resource]:
        return [payloads.resource(r) for r in (await self._get("/api/resources/latest"))["resources"]]

    async def put_model(
        self, name: str, endpoints: list[str], version: str, served_model: str | None = None
    ) -> ModelRecord:
        body: dict[str, Any] = {"name": name, "endpoints": list(endpoints), "version": version}
        if served_model is not None:
            body["served_model"] = served_model
        return payloads.model(await self._post("/api/models", body, idempotent=True))

    async def remove_model(self, name: str) -> ModelRecord:
        """Take a registration back (NotFoundError when there is none)."""
        return payloads.model(await self._post("/api/models/remove", {"name": name}, idempotent=True))

    async def models(self) -> list[ModelRecord]:
        return [payloads.model(m) for m in (await self._get("/api/models"))["models"]]

    # --- the gateway ---------------------------------------------------------------------------------------------

    async def health(self) -> dict[str, Any]:
        """`GET /healthz` (public): `{"status": "ok"}` while the gateway serves."""
        return dict(await self._get("/healthz"))

    async def pause(
        self, mode: Literal["hold", "reject"] = "hold", hold_timeout_s: float | None = None
    ) -> GatewayState:
        """Pause LLM calls: hold them until resume (bounded by `hold_timeout_s`), or reject them (429)."""
        body: dict[str, Any] = {"mode": mode}
        if hold_timeout_s is not None:
            body["hold_timeout_s"] = hold_timeout_s
        return GatewayState.from_json(await self._post("/api/gateway/pause", body, idempotent=True))

    async def resume(self) -> GatewayState:
        return GatewayState.from_json(await self._post("/api/gateway/resume", {}, idempotent=True))

    async def gateway_state(self, wait_drained: float | None = None) -> GatewayState:
        """The pause state and calls in flight; `wait_drained=S` first waits up to S s for none in flight."""
        body = await self._get(
            "/api/gateway/state", {"wait_drained": wait_drained}, wait_s=wait_drained or 0.0
        )
        return GatewayState.from_json(body)

    def paused(
        self,
        *,
        drain_timeout_s: float = 60.0,
        hold_timeout_s: float | None = None,
        mode: Literal["hold", "reject"] = "hold",
        require_drained: bool = True,
    ) -> AbstractAsyncContextManager[GatewayState]:
        """`async with client.paused(): sync_weights()` — pause (hold), wait for in-flight calls to drain (at most
        `drain_timeout_s`), run the block, resume on exit, also on exceptions."""
        return paused(
            self,
            drain_timeout_s=drain_timeout_s,
            hold_timeout_s=hold_timeout_s,
            mode=mode,
            require_drained=require_drained,
        )
