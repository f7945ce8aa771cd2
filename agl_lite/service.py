"""Building and running the gateway from a config: what `agl-lite run` and the tests call.

Owns start-up order (chain → load → configure → bind → running) and graceful shutdown on SIGINT/SIGTERM.
"""

from __future__ import annotations

import asyncio
import gc
import signal
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from agl_lite.addons import ADDONS, DEFAULT_CHAIN
from agl_lite.core import config as core_config
from agl_lite.core.addons import AddonManager, instance_entry, load_chain
from agl_lite.core.config import GatewayConfig, extra_position
from agl_lite.core.key_source import protect_process
from agl_lite.core.logs import configure_logging
from agl_lite.core.server import Gateway

__all__ = ["build_gateway", "check_config", "load_config", "running_gateway", "serve"]


def load_config(path: str | Path) -> GatewayConfig:
    """The gateway's config from agl-lite.toml: the built-in default chain (`agl_lite.addons.DEFAULT_CHAIN`)
    when the file names none."""
    return core_config.load_config(path, default_chain=DEFAULT_CHAIN)


def build_gateway(config: GatewayConfig, extra_addons: Sequence[Any] = ()) -> Gateway:
    """A gateway with the config's addon chain instantiated (nothing started yet).

    `extra_addons` are addon instances added to the chain where `[addons] extra` goes: right before `sink` (so
    they may still change the captured call), at the end of a chain without one. Each is configured with its
    options: the config's `[addons."module:Class"]` when it has one, else the `options` it was built with, else
    its defaults (`core.addons.instance_entry`).
    """
    config = config.with_chain(DEFAULT_CHAIN)  # (a config built in code names no chain: the default one)
    chain = load_chain(config, ADDONS)
    extra = [instance_entry(addon, config) for addon in extra_addons]
    at = extra_position([item.name for item in chain])
    return Gateway(config, AddonManager([*chain[:at], *extra, *chain[at:]]))


async def check_config(config: GatewayConfig) -> Gateway:
    """Instantiate and configure every addon without binding a socket (then release what they opened, such as
    the store); raises ConfigError on any problem."""
    gateway = build_gateway(config)
    await gateway.addons.load()
    try:
        await gateway.addons.configure(config)
    finally:
        await gateway.addons.shutdown()
    return gateway


@asynccontextmanager
async def running_gateway(
    config: GatewayConfig,
    extra_addons: Sequence[Any] = (),
    *,
    configured: Callable[[], None] | None = None,
) -> AsyncIterator[Gateway]:
    """Start the gateway (port 0 gives a free port, in `gateway.port`) and stop it on exit; `configured` as in
    `Gateway.start`."""
    gateway = build_gateway(config, extra_addons)
    await gateway.start(configured=configured)
    try:
        yield gateway
    finally:
        await gateway.stop()


async def serve(config: GatewayConfig) -> None:
    """Run until SIGINT or SIGTERM, then shut down gracefully."""
    configure_logging(config.log.level, config.log.format)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # Once the keys are read (every addon configured), and before the runner can start an agent: from then on no
    # other process can read them from us.
    async with running_gateway(config, configured=protect_process):
        # Everything allocated at start-up lives as long as the process: keep it out of the collector's scans,
        # which otherwise show up as 50 ms full collections in the p99 under load (measured in bench/).
        gc.collect()
        gc.freeze()
        # A flow allocates hundreds of containers that reference counting frees; at the default threshold (700) the
        # young generation is scanned every few flows, each time through the objects of every flow in flight
        # (~160 µs a scan at 32 calls in flight, ~35 µs per flow). Cycles are rare here: scan 14x less often.
        gc.set_threshold(10_000, 10, 10)
        await stop.wait()
