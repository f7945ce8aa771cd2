"""SyncAglLiteClient: the async client run on a private event loop in a daemon thread, for scripts and notebooks
(works whether or not the calling thread already runs a loop). Same methods, blocking; iterators are plain ones.

Each method is the async client's own, wrapped (`_blocking`, `_iterating`): the same signature and docstring, so
the twin cannot drift from it.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import sys
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Concatenate, Literal, ParamSpec, TypeVar

import aiohttp

from agl_lite.client.client import AglLiteClient
from agl_lite.client.results import GatewayState
from agl_lite.client.retry import RetryPolicy
from agl_lite.client.settings import Timeouts

__all__ = ["SyncAglLiteClient"]

T = TypeVar("T")
P = ParamSpec("P")


def _blocking(
    method: Callable[Concatenate[AglLiteClient, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[SyncAglLiteClient, P], T]:
    """The async client's `method`, run to its end on the sync client's loop."""

    def blocking(self: SyncAglLiteClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._run(method(self.aio, *args, **kwargs))

    _named(blocking, method)
    return blocking


def _iterating(
    method: Callable[Concatenate[AglLiteClient, P], AsyncIterator[T]],
) -> Callable[Concatenate[SyncAglLiteClient, P], Iterator[T]]:
    """The async client's iterator `method`, as a plain iterator whose items the sync client's loop fetches."""

    def iterating(self: SyncAglLiteClient, /, *args: P.args, **kwargs: P.kwargs) -> Iterator[T]:
        return self._iterate(method(self.aio, *args, **kwargs))

    _named(iterating, method)
    iterating.__signature__ = inspect.signature(method).replace(return_annotation="Iterator")  # type: ignore[attr-defined]
    iterating.__doc__ = (
        f"A plain iterator (`for`, not `async for`) over what `AglLiteClient.{method.__name__}` yields. "
        + (method.__doc__ or "")
    )
    return iterating


def _named(wrapper: Callable[..., Any], method: Callable[..., Any]) -> None:
    """The wrapper as the twin's own method (`help()`, tracebacks): the async method's name, docstring and
    parameters, under SyncAglLiteClient."""
    functools.update_wrapper(wrapper, method, assigned=("__name__", "__doc__"), updated=())
    wrapper.__qualname__ = f"SyncAglLiteClient.{method.__name__}"
    wrapper.__signature__ = inspect.signature(method)  # type: ignore[attr-defined]


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

    # --- rollouts (`wait` calls its `progress(done, total)` on the client's own thread) ------------------------

    enqueue = _blocking(AglLiteClient.enqueue)
    enqueue_group = _blocking(AglLiteClient.enqueue_group)
    get_rollout = _blocking(AglLiteClient.get_rollout)
    get_rollout_with_attempts = _blocking(AglLiteClient.get_rollout_with_attempts)
    list_rollouts = _blocking(AglLiteClient.list_rollouts)
    iter_rollouts = _iterating(AglLiteClient.iter_rollouts)
    cancel = _blocking(AglLiteClient.cancel)
    finish = _blocking(AglLiteClient.finish)
    completed = _blocking(AglLiteClient.completed)
    completions = _iterating(AglLiteClient.completions)
    wait = _blocking(AglLiteClient.wait)

    # --- the runner protocol -------------------------------------------------------------------------------------

    claim = _blocking(AglLiteClient.claim)
    running = _blocking(AglLiteClient.running)
    start_attempt = _blocking(AglLiteClient.start_attempt)
    attempt_env_template = _blocking(AglLiteClient.attempt_env_template)
    update_attempt = _blocking(AglLiteClient.update_attempt)
    attempts = _blocking(AglLiteClient.attempts)

    # --- events, rewards and calls -------------------------------------------------------------------------------

    add_events = _blocking(AglLiteClient.add_events)
    reward = _blocking(AglLiteClient.reward)
    events = _blocking(AglLiteClient.events)
    follow_events = _iterating(AglLiteClient.follow_events)
    calls = _blocking(AglLiteClient.calls)
    iter_calls = _iterating(AglLiteClient.iter_calls)
    triplets = _blocking(AglLiteClient.triplets)
    iter_triplets = _iterating(AglLiteClient.iter_triplets)

    # --- resources and models ------------------------------------------------------------------------------------

    put_resource = _blocking(AglLiteClient.put_resource)
    get_resource = _blocking(AglLiteClient.get_resource)
    latest_resources = _blocking(AglLiteClient.latest_resources)
    put_model = _blocking(AglLiteClient.put_model)
    remove_model = _blocking(AglLiteClient.remove_model)
    models = _blocking(AglLiteClient.models)

    # --- the gateway ---------------------------------------------------------------------------------------------

    health = _blocking(AglLiteClient.health)
    pause = _blocking(AglLiteClient.pause)
    resume = _blocking(AglLiteClient.resume)
    gateway_state = _blocking(AglLiteClient.gateway_state)

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
