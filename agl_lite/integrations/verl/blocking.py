"""The daemon for a synchronous trainer (VERL's driver loop): it runs on an event loop in a thread of its own, with
its own client, so that each call blocks the caller and nothing else.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from agl_lite.client import AglLiteClient, GatewayState
from agl_lite.integrations.mismatch import Decode
from agl_lite.integrations.verl.daemon import AglLiteDaemon, DaemonConfig, Sample, StepResult

__all__ = ["BlockingDaemon"]

T = TypeVar("T")


class BlockingDaemon:
    """`with BlockingDaemon(url, key, config) as daemon: result = daemon.step(samples)`."""

    def __init__(
        self, url: str | None, key: str | None, config: DaemonConfig, *, decode: Decode | None = None
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="agl-daemon-loop", daemon=True)
        self._thread.start()
        self.daemon = AglLiteDaemon(AglLiteClient(url, key), config, decode=decode)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def step(self, samples: Sequence[Sample]) -> StepResult:
        return self._run(self.daemon.step(samples))

    @contextmanager
    def weight_sync(self, endpoints: Sequence[str], version: str, **kwargs: Any) -> Iterator[GatewayState]:
        """The daemon's `weight_sync`, blocking: the block runs in the caller's thread while the gateway is held."""
        cm = self.daemon.weight_sync(endpoints, version, **kwargs)
        state = self._run(cm.__aenter__())
        try:
            yield state
        except BaseException as exc:
            self._run(cm.__aexit__(type(exc), exc, exc.__traceback__))
            raise
        self._run(cm.__aexit__(None, None, None))

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._run(self.daemon.client.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> BlockingDaemon:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
