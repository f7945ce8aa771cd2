"""SyncAglLiteClient: the async client run on a private event loop in a daemon thread, for scripts and notebooks
(works whether or not the calling thread already runs a loop). Same methods, blocking; iterators are plain ones.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal, TypeVar

import aiohttp

from agl_lite.client.client import DEFAULT_TRIPLETS, FIRST_PAGE, AglLiteClient
from agl_lite.client.completions import Progress
from agl_lite.client.results import AttemptEnv, GatewayState, StartedAttempt, WaitResult
from agl_lite.client.retry import RetryPolicy
from agl_lite.client.settings import Timeouts
from agl_lite.client.triplets import DEFAULT_PAGE_BYTES
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

__all__ = ["SyncAglLiteClient"]

T = TypeVar("T")


class SyncAglLiteClient:
    """`with SyncAglLiteClient() as client:` — blocking twin of AglLiteClient (see it for each method)."""

    def __init__(
        self,
        url: str | None = None,
        key: str | None = None,
        *,
        timeouts: Timeouts | None = None,
        retry: RetryPolicy | None = None,
        trace_configs: Sequence[aiohttp.TraceConfig] = (),
    ) -> None:
        self.aio = AglLiteClient(url, key, timeouts=timeouts, retry=retry, trace_configs=trace_configs)
        """The async client underneath (its coroutines must run on this client's loop)."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="agl-client-loop", daemon=True)
        self._thread.start()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._loop.is_closed():
            coro.close()
            raise RuntimeError("this SyncAglLiteClient is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _iterate(self, agen: AsyncIterator[T]) -> Iterator[T]:
        async def step() -> list[T]:
            try:
                return [await agen.__anext__()]
            except StopAsyncIteration:
                return []

        try:
            while got := self._run(step()):
                yield got[0]
        finally:
            close = getattr(agen, "aclose", None)
            if close is not None and not self._loop.is_closed():
                self._run(close())

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._run(self.aio.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    def __enter__(self) -> SyncAglLiteClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def url(self) -> str:
        return self.aio.url

    # --- rollouts ------------------------------------------------------------------------------------------------

    def enqueue(self, specs: Sequence[RolloutSpec]) -> list[Rollout]:
        return self._run(self.aio.enqueue(specs))

    def enqueue_group(
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
        return self._run(
            self.aio.enqueue_group(
                inputs,
                n=n,
                mode=mode,
                config=config,
                metadata=metadata,
                metadata_per_input=metadata_per_input,
                group_ids=group_ids,
                resources_version=resources_version,
            )
        )

    def get_rollout(self, rollout_id: str) -> Rollout:
        return self._run(self.aio.get_rollout(rollout_id))

    def get_rollout_with_attempts(self, rollout_id: str) -> tuple[Rollout, list[Attempt]]:
        return self._run(self.aio.get_rollout_with_attempts(rollout_id))

    def list_rollouts(self, flt: RolloutFilter = FIRST_PAGE) -> list[Rollout]:
        return self._run(self.aio.list_rollouts(flt))

    def iter_rollouts(
        self,
        *,
        status: RolloutStatus | None = None,
        mode: str | None = None,
        group_id: str | None = None,
        after: int = 0,
        page_size: int = 100,
    ) -> Iterator[Rollout]:
        return self._iterate(
            self.aio.iter_rollouts(
                status=status, mode=mode, group_id=group_id, after=after, page_size=page_size
            )
        )

    def cancel(self, rollout_id: str, message: str | None = None) -> Rollout:
        return self._run(self.aio.cancel(rollout_id, message))

    def finish(self, rollout_id: str, status: RolloutStatus, message: str | None = None) -> Rollout:
        return self._run(self.aio.finish(rollout_id, status, message))

    def completed(self, after: int, limit: int = 100, wait: float = 0.0) -> tuple[list[Rollout], int]:
        return self._run(self.aio.completed(after, limit, wait))

    def completions(self, after: int = 0, *, page_size: int = 100, poll_s: float = 30.0) -> Iterator[Rollout]:
        return self._iterate(self.aio.completions(after, page_size=page_size, poll_s=poll_s))

    def wait(
        self,
        ids: Sequence[str],
        timeout: float | None = None,
        *,
        after: int = 0,
        page_size: int = 100,
        poll_s: float = 30.0,
        progress: Progress | None = None,
    ) -> WaitResult:
        """`progress(done, total)` is called on the client's own thread."""
        return self._run(
            self.aio.wait(ids, timeout, after=after, page_size=page_size, poll_s=poll_s, progress=progress)
        )

    # --- the runner protocol -------------------------------------------------------------------------------------

    def claim(self, runner_id: str, limit: int) -> list[Rollout]:
        return self._run(self.aio.claim(runner_id, limit))

    def running(self) -> list[tuple[Rollout, list[Attempt]]]:
        return self._run(self.aio.running())

    def start_attempt(self, rollout_id: str, attempt_id: str | None = None) -> StartedAttempt:
        return self._run(self.aio.start_attempt(rollout_id, attempt_id))

    def attempt_env_template(self, rollout_id: str) -> AttemptEnv:
        return self._run(self.aio.attempt_env_template(rollout_id))

    def update_attempt(
        self,
        rollout_id: str,
        attempt_id: str,
        status: AttemptStatus,
        *,
        exit_code: int | None = None,
        message: str | None = None,
    ) -> Attempt:
        return self._run(
            self.aio.update_attempt(rollout_id, attempt_id, status, exit_code=exit_code, message=message)
        )

    def attempts(self, rollout_id: str) -> list[Attempt]:
        return self._run(self.aio.attempts(rollout_id))

    # --- events, rewards and calls -------------------------------------------------------------------------------

    def add_events(
        self, rollout_id: str, specs: Sequence[EventSpec], *, source: str = "admin"
    ) -> list[Event]:
        return self._run(self.aio.add_events(rollout_id, specs, source=source))

    def reward(
        self,
        rollout_id: str,
        value: float,
        response_id: str | None = None,
        choice: int | None = None,
        *,
        attempt_id: str | None = None,
    ) -> Event:
        return self._run(self.aio.reward(rollout_id, value, response_id, choice, attempt_id=attempt_id))

    def events(
        self,
        rollout_id: str,
        kind: str | None = None,
        after_seq: int = 0,
        limit: int = 1000,
        *,
        max_bytes: int | None = None,
    ) -> list[Event]:
        return self._run(self.aio.events(rollout_id, kind, after_seq, limit, max_bytes=max_bytes))

    def follow_events(
        self, rollout_id: str, *, kind: str | None = None, after_seq: int = 0, poll_s: float = 1.0
    ) -> Iterator[Event]:
        return self._iterate(
            self.aio.follow_events(rollout_id, kind=kind, after_seq=after_seq, poll_s=poll_s)
        )

    def calls(
        self,
        rollout_id: str | None,
        attempt_id: str | None = None,
        after_order_key: int = -1,
        limit: int = 1000,
        *,
        max_bytes: int | None = None,
        label: tuple[str, str] | None = None,
    ) -> list[LLMCall]:
        return self._run(
            self.aio.calls(rollout_id, attempt_id, after_order_key, limit, max_bytes=max_bytes, label=label)
        )

    def iter_calls(
        self,
        rollout_id: str,
        *,
        attempt_id: str | None = None,
        page_size: int = 100,
        label: tuple[str, str] | None = None,
    ) -> Iterator[LLMCall]:
        return self._iterate(
            self.aio.iter_calls(rollout_id, attempt_id=attempt_id, page_size=page_size, label=label)
        )

    def triplets(self, rollout_id: str, options: TripletOptions = DEFAULT_TRIPLETS) -> RolloutTriplets:
        return self._run(self.aio.triplets(rollout_id, options))

    def iter_triplets(
        self,
        rollout_ids: Sequence[str],
        options: TripletOptions = DEFAULT_TRIPLETS,
        *,
        max_bytes: int = DEFAULT_PAGE_BYTES,
    ) -> Iterator[RolloutTriplets]:
        return self._iterate(self.aio.iter_triplets(rollout_ids, options, max_bytes=max_bytes))

    # --- resources and models ------------------------------------------------------------------------------------

    def put_resource(self, name: str, value: Any) -> Resource:
        return self._run(self.aio.put_resource(name, value))

    def get_resource(self, name: str, version: int | None = None) -> Resource:
        return self._run(self.aio.get_resource(name, version))

    def latest_resources(self) -> list[Resource]:
        return self._run(self.aio.latest_resources())

    def put_model(
        self, name: str, endpoints: list[str], version: str, served_model: str | None = None
    ) -> ModelRecord:
        return self._run(self.aio.put_model(name, endpoints, version, served_model))

    def remove_model(self, name: str) -> ModelRecord:
        return self._run(self.aio.remove_model(name))

    def models(self) -> list[ModelRecord]:
        return self._run(self.aio.models())

    # --- the gateway ---------------------------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        return self._run(self.aio.health())

    def pause(
        self, mode: Literal["hold", "reject"] = "hold", hold_timeout_s: float | None = None
    ) -> GatewayState:
        return self._run(self.aio.pause(mode, hold_timeout_s))

    def resume(self) -> GatewayState:
        return self._run(self.aio.resume())

    def gateway_state(self, wait_drained: float | None = None) -> GatewayState:
        return self._run(self.aio.gateway_state(wait_drained))

    @contextmanager
    def paused(
        self,
        *,
        drain_timeout_s: float = 60.0,
        hold_timeout_s: float | None = None,
        mode: Literal["hold", "reject"] = "hold",
        require_drained: bool = True,
    ) -> Iterator[GatewayState]:
        """`with client.paused(): sync_weights()` — see AglLiteClient.paused."""
        manager = self.aio.paused(
            drain_timeout_s=drain_timeout_s,
            hold_timeout_s=hold_timeout_s,
            mode=mode,
            require_drained=require_drained,
        )
        state = self._run(manager.__aenter__())
        try:
            yield state
        except BaseException:
            if not self._run(manager.__aexit__(*sys.exc_info())):
                raise
        else:
            self._run(manager.__aexit__(None, None, None))
