"""Runner: runs agents for queued rollouts — local processes or Kubernetes Jobs — through the runner core.

A lifecycle addon: it builds the runner in `configure`, starts it in `running` and stops it in `shutdown`. With an
empty `store_url` it uses the store of this process (put `store` before it in the chain); with a URL it reaches a
gateway elsewhere over HTTP with the admin key, so `chain = ["runner"]` is a runner-only process (the in-cluster
controller). It answers no requests.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from agl_lite.client import AglLiteClient
from agl_lite.core.config import GatewayConfig, option
from agl_lite.core.key_source import key_file, read_key
from agl_lite.core.routes import ID_PATTERN
from agl_lite.core.services import LoadContext
from agl_lite.errors import ConfigError
from agl_lite.runner.backends import backend_class
from agl_lite.runner.env import DEFAULT_PASS_ENV, FORBIDDEN_ENV, ContractEnv
from agl_lite.runner.programs import cannot_start
from agl_lite.runner.runner import Runner
from agl_lite.runner.seams import RunnerSettings, RunnerStore
from agl_lite.store.rules import STORE

__all__ = ["AgentRunner"]

MAX_TAIL_BYTES = 16384
"""An attempt's message holds the agent's and the grader's tails; the store takes messages up to 64 KiB."""


class AgentRunner:
    short_name = "runner"
    """Its name in a chain, and what other addons' `after` call it."""

    @dataclass(frozen=True, slots=True)
    class Options:
        backend: Literal["local", "k8s"] = option(
            "local", "`local` (one process per attempt) or `k8s` (one Job per rollout)."
        )
        store_url: str = option(
            "",
            "Empty: the store of this process (`store` must come first in the chain); else the URL of the "
            "gateway whose store to run, reached with the admin key.",
        )
        key_env: str = option("AGL_KEY", "Environment variable holding the admin key.")
        runner_id: str = option(
            "",
            "Marks the rollouts this runner claims, so a restarted runner takes its own back; empty: "
            "`local-HOSTNAME` for `local`, `k8s` for `k8s`.",
        )
        public_url: str = option(
            "",
            "Base URL agents reach the gateway at; empty: this gateway's public URL, or `store_url` when set.",
        )
        command: tuple[str, ...] = option(
            (), "Agent command (argv) unless a rollout's `config.runner.command` names one."
        )
        concurrency: int = option(8, "Most rollouts in flight at once.")
        timeout_s: float = option(
            0.0,
            "Per-attempt wall-clock limit in seconds unless a rollout's `config.timeout_s` sets one; 0: none.",
        )
        max_attempts: int = option(0, "Cap on a rollout's `config.max_attempts`; 0: no cap.")
        grader_command: tuple[str, ...] = option(
            (),
            "Grading step run after each successful agent (argv) unless a rollout's `config.grader.command` "
            "names one; empty: only rollouts with a `config.grader` are graded.",
        )
        grader_timeout_s: float = option(600.0, "Wall-clock limit of one grading step, in seconds; 0: none.")
        grace_s: float = option(5.0, "Seconds between SIGTERM and SIGKILL when an attempt is stopped.")
        poll_s: float = option(
            1.0, "Seconds between claims when the store is remote (an in-process store wakes the runner)."
        )
        resync_s: float = option(30.0, "Seconds between reconciles against the store's running rollouts.")
        env: Mapping[str, str] = option({}, "Extra env for agents and graders (the agent contract wins).")
        pass_env: tuple[str, ...] = option(
            DEFAULT_PASS_ENV, "Variables copied from the runner's own env to local agents; never AGL_KEY."
        )
        workdir: str = option(
            "",
            "Working directory of local agents (and of a relative command path), relative to the config file; "
            "empty: the directory agl-lite was started in.",
        )
        output_tail_bytes: int = option(
            4096, f"Bytes of an attempt's last output kept in its message (at most {MAX_TAIL_BYTES})."
        )
        isolation: Literal["namespaces", "none"] = option(
            "namespaces",
            "`namespaces`: each local agent and grader in its own user, mount and PID namespaces (docs/runners.md); "
            "`none`: unconfined, for machines without user namespaces.",
        )
        writable: tuple[str, ...] = option(
            (),
            "Paths local agents may write besides their own HOME, TMPDIR and AGL_RESULT_DIR, relative to the "
            "config file (with `namespaces` everything else is read-only).",
        )
        preload: tuple[str, ...] = option(
            (),
            'Local backend: Python modules a fork server imports once (e.g. `["openai"]`; a `.py` path, relative '
            "to the config file, is run once as a warm-up); an agent command of "
            "the form `PYTHON SCRIPT.py ...` then starts as a fork of it, confined as any other, instead of a "
            "fresh interpreter (docs/runners.md). Empty: every step is a fresh process.",
        )
        k8s: Mapping[str, Any] = option({}, "Options of the `k8s` backend (docs/controller.md).")

    runner: Runner | None = None
    _client: AglLiteClient | None = None

    def load(self, ctx: LoadContext) -> None:
        self._ctx = ctx

    def configure(self, config: GatewayConfig, options: AgentRunner.Options | None) -> None:
        o = options or AgentRunner.Options()
        where = f"{config.source}: addons.runner"
        _check(o, where)
        if config.server.workers > 1:
            raise ConfigError(
                f"{where}: a runner belongs to one process, not to server.workers = {config.server.workers}: run it "
                "in a gateway of its own (a chain with the runner, workers = 1) on the same store"
            )
        admin_key = read_key(o.key_env)
        path = key_file(o.key_env)
        if path is not None:
            self._ctx.private_paths.add(path.resolve())
        if not admin_key:
            raise ConfigError(
                f"{where}: the admin key is not set: export {o.key_env} (the gateway's AGL_KEY)"
            )
        settings = RunnerSettings(
            runner_id=o.runner_id or _default_runner_id(o.backend),
            public_url=(o.public_url or o.store_url or config.public_url).rstrip("/"),
            command=o.command,
            concurrency=o.concurrency,
            timeout_s=o.timeout_s or None,
            max_attempts=o.max_attempts,
            grader_command=o.grader_command,
            grader_timeout_s=o.grader_timeout_s or None,
            grace_s=o.grace_s,
            poll_s=o.poll_s,
            resync_s=o.resync_s,
            env=dict(o.env),
            pass_env=o.pass_env,
            workdir=(config.base_dir / o.workdir).resolve() if o.workdir else Path.cwd(),
            output_tail_bytes=o.output_tail_bytes,
            isolation=o.isolation,
            writable=tuple((config.base_dir / w).resolve() for w in o.writable),
            # A warm-up script, like every path here, is relative to the config file.
            preload=tuple(
                str((config.base_dir / p).resolve()) if p.endswith(".py") else p for p in o.preload
            ),
            private_paths=self._ctx.private_paths,
            config_file=config.source,
        )
        if o.backend == "local":
            for key, argv in (("command", o.command), ("grader_command", o.grader_command)):
                if argv:
                    _check_program(argv[0], settings, f"{where}.{key}")
        backend = backend_class(o.backend)(settings, dict(o.k8s) if o.backend == "k8s" else {})
        store: RunnerStore
        if o.store_url:
            store = self._client = AglLiteClient(o.store_url, admin_key)
        else:
            store = self._ctx.services.require(STORE, by="runner")
        self.runner = Runner(store, backend, settings, ContractEnv(settings.public_url, admin_key))

    async def running(self) -> None:
        if self.runner is None:
            return
        try:
            await self.runner.start()
        except BaseException:
            await self.shutdown()  # start-up fails with the error; nothing is left open
            raise

    async def shutdown(self) -> None:
        try:
            if self.runner is not None:
                await self.runner.stop()
        finally:
            if self._client is not None:
                await self._client.close()


def _check(o: AgentRunner.Options, where: str) -> None:
    """Every bad value is a ConfigError naming its key."""
    problems = [
        (o.concurrency < 1 or o.concurrency > 10_000, "concurrency must be between 1 and 10000"),
        (o.timeout_s < 0, "timeout_s must not be negative"),
        (o.max_attempts < 0, "max_attempts must not be negative"),
        (o.grader_timeout_s < 0, "grader_timeout_s must not be negative"),
        (o.grace_s < 0, "grace_s must not be negative"),
        (o.poll_s <= 0, "poll_s must be positive"),
        (o.resync_s <= 0, "resync_s must be positive"),
        (
            not 0 <= o.output_tail_bytes <= MAX_TAIL_BYTES,
            f"output_tail_bytes must be between 0 and {MAX_TAIL_BYTES}",
        ),
        (
            bool(o.runner_id) and not ID_PATTERN.fullmatch(o.runner_id),
            "runner_id: use 1-128 of A-Z a-z 0-9 _ -",
        ),
        (
            bool(FORBIDDEN_ENV & set(o.pass_env)),
            "pass_env must not name AGL_KEY: agents never get the admin key",
        ),
        (bool(FORBIDDEN_ENV & set(o.env)), "env must not set AGL_KEY: agents never get the admin key"),
        (
            o.store_url != "" and not o.store_url.startswith(("http://", "https://")),
            "store_url must be http(s)",
        ),
        (bool(o.k8s) and o.backend != "k8s", "k8s options are set but backend is not 'k8s'"),
    ]
    for bad, message in problems:
        if bad:
            raise ConfigError(f"{where}: {message}")


def _check_program(program: str, settings: RunnerSettings, where: str) -> None:
    """A local command that cannot start would fail every rollout: say so at start-up instead."""
    search = os.environ.get("PATH", os.defpath) if "PATH" in settings.pass_env else os.defpath
    why = cannot_start(program, search, settings.workdir)
    if why is None:
        return
    if "/" in program:
        raise ConfigError(
            f"{where}: {program!r} is not an executable file ({why}; a relative path is taken from workdir "
            f"{settings.workdir})"
        )
    raise ConfigError(f"{where}: {program!r} is not found on the agents' PATH")


def _default_runner_id(backend: str) -> str:
    """Stable across restarts of the same machine (local) or of the controller's pod (k8s)."""
    if backend == "k8s":
        return "k8s"
    host = re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname())[:100] or "host"
    return f"local-{host}"
