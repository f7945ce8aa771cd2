"""`agl-lite`: the server-side CLI. Thin: parse arguments, build config, call a library function."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from agl_lite import __version__
from agl_lite.core.contract import KeyRole, derive_key
from agl_lite.core.logs import configure_logging
from agl_lite.core.routes import ID_PATTERN
from agl_lite.errors import ConfigError

__all__ = ["app", "main"]

app = typer.Typer(
    name="agl-lite",
    help="agl-lite: the capturing LLM gateway for RL of LLM agents.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="The agl-lite.toml to use.")]


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"agl-lite: {message}", err=True)
    raise typer.Exit(code)


@app.command()
def run(
    config: ConfigOpt = Path("agl-lite.toml"),
    workers: Annotated[
        int | None,
        typer.Option(
            min=1, help="Gateway processes on the port (server.workers); more than 1 needs PostgreSQL."
        ),
    ] = None,
) -> None:
    """Serve the gateway until Ctrl-C or SIGTERM.

    Example: AGL_KEY=$(openssl rand -hex 32) agl-lite run --config agl-lite.toml
    """
    from agl_lite.service import load_config, serve
    from agl_lite.workers import WORKER_ENV, die_with_parent, supervise

    try:
        cfg = load_config(config)
        if workers is not None:
            cfg = dataclasses.replace(cfg, server=dataclasses.replace(cfg.server, workers=workers))
        if cfg.server.workers > 1 and WORKER_ENV not in os.environ:
            configure_logging(cfg.log.level, cfg.log.format)
            raise typer.Exit(supervise(config, cfg.server.workers, cfg.server.shutdown_timeout))
        if WORKER_ENV in os.environ:
            die_with_parent()
        loop_factory = None
        if cfg.server.event_loop == "uvloop":
            import uvloop

            loop_factory = uvloop.new_event_loop
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(serve(cfg))
    except ConfigError as exc:
        _fail(str(exc))


@app.command("check-config")
def check_config(config: Annotated[Path, typer.Argument(help="The agl-lite.toml to check.")]) -> None:
    """Validate a config (and the routes file it names) without serving. Exit 0 when valid, 2 otherwise.

    Example: agl-lite check-config agl-lite.toml
    """
    from agl_lite.service import check_config as check
    from agl_lite.service import load_config

    configure_logging("warning")
    try:
        cfg = load_config(config)
        gateway = asyncio.run(check(cfg))
    except ConfigError as exc:
        _fail(str(exc))
        return
    typer.echo(f"{config}: ok")
    typer.echo(f"  listen  {cfg.server.host}:{cfg.server.port}  (agents use {cfg.public_url})")
    typer.echo(f"  chain   {' -> '.join(cfg.full_chain)}")
    typer.echo(f"  routes  {len(gateway.table.routes)} HTTP routes")


@app.command()
def key(
    rollout_id: Annotated[str, typer.Argument(help="The rollout the key is for.")],
    grader: Annotated[
        bool, typer.Option("--grader", help="Print the grader key instead of the agent key.")
    ] = False,
) -> None:
    """Print a rollout's agent (or grader) key, derived from AGL_KEY; for debugging and external runners.

    Example: agl-lite key my-rollout-1 --grader
    """
    admin = os.environ.get("AGL_KEY", "")
    if not admin:
        _fail("AGL_KEY is not set")
    if not ID_PATTERN.fullmatch(rollout_id):
        _fail(f"invalid rollout id {rollout_id!r}: use 1-128 of A-Z a-z 0-9 _ -")
    typer.echo(derive_key(admin, rollout_id, KeyRole.GRADER if grader else KeyRole.AGENT))


@app.command("mock-llm")
def mock_llm(
    port: Annotated[int, typer.Option(help="TCP port to listen on.")] = 8000,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    model: Annotated[
        list[str] | None, typer.Option("--model", help="Served model name (repeatable).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the deterministic output.")] = 0,
    math: Annotated[
        Path | None,
        typer.Option(
            "--math",
            help="GSM8K JSONL problems to answer in GSM8K format ('... #### N'), right or wrong by seed.",
        ),
    ] = None,
    wrong_rate: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="With --math: share of answers that are wrong.")
    ] = 0.25,
    max_model_len: Annotated[
        int,
        typer.Option(
            min=16,
            help="Context length in tokens (prompt + max_tokens), as vLLM's --max-model-len; Claude Code asks for "
            "32,000 output tokens, so give it 65536 or more.",
        ),
    ] = 2048,
    latency: Annotated[float, typer.Option(min=0.0, help="Seconds before each reply's headers.")] = 0.0,
    ttft: Annotated[float, typer.Option(min=0.0, help="Seconds before the first event (or the body).")] = 0.0,
    chunk_delay: Annotated[
        float, typer.Option(min=0.0, help="Seconds between two events of a stream.")
    ] = 0.0,
    fault_rate: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Share of requests (seeded) that get --fault.")
    ] = 0.0,
    fault: Annotated[
        str,
        typer.Option(
            help="error (a 500 body), reset (connection reset), stall (stops, never ends) or midstream (an error "
            "event mid-stream)."
        ),
    ] = "error",
) -> None:
    """Serve the mock vLLM (the real vLLM wire format, deterministic output) for tests and the CPU demo.

    Example: agl-lite mock-llm --port 8000 --model smollm2 --math examples/math-poc/problems.jsonl
    Example: agl-lite mock-llm --max-model-len 65536 --latency 0.2 --fault-rate 0.05 --fault reset
    """
    from agl_lite.testing.mock_vllm import serve
    from agl_lite.testing.mock_vllm.faults import Fault, Faults
    from agl_lite.testing.mock_vllm.math_tutor import MathTutor
    from agl_lite.testing.mock_vllm.scenario import ScenarioHook

    hook: ScenarioHook | None = None
    if math is not None:
        try:
            hook = MathTutor.from_file(math, seed=seed, wrong_rate=wrong_rate)
        except (OSError, ValueError) as exc:
            _fail(f"--math {math}: {exc}")
    try:
        faults = Faults(latency, ttft, chunk_delay, fault_rate, Fault(fault), seed)
    except ValueError:
        _fail(f"--fault {fault!r}: use one of {', '.join(f.value for f in Fault)}")
    if faults.active:
        hook = faults.hook(hook)
    serve(host, port, seed=seed, models=model or ["smollm2"], max_model_len=max_model_len, hook=hook)


@app.command()
def version() -> None:
    """Print the agl-lite version."""
    typer.echo(__version__)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
