"""`agl-client`: the store and the gateway from a shell. Thin: parse, call AglLiteClient, print.

Exit codes scripts can rely on: 0 ok; 1 the operation failed or timed out (the server said no, `wait` ran out of
time); 2 usage error (bad arguments, no key, an invalid request); 3 the server could not be reached.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, NoReturn

import orjson
import typer
from rich.console import Console
from typer.core import TyperGroup

from agl_lite import __version__
from agl_lite.client import render
from agl_lite.client.client import AglLiteClient
from agl_lite.client.errors import (
    AuthError,
    BadRequestError,
    ClientError,
    ConnectionFailed,
    ForbiddenError,
)
from agl_lite.client.export import export_calls
from agl_lite.client.progress import counter, progress_bar
from agl_lite.client.retry import RetryPolicy
from agl_lite.client.settings import Timeouts
from agl_lite.client.writers import RowWriter, open_writer
from agl_lite.errors import ConfigError
from agl_lite.store.records import RolloutConfig, RolloutStatus
from agl_lite.store.triplets import RewardPolicy

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_UNREACHABLE", "EXIT_USAGE", "app", "main"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3


class _OneLineErrors(TyperGroup):
    """Usage errors as one line (`agl-client: error: ...`, exit 2) instead of click's usage block."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        try:
            code = super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
        except typer.TyperException as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # the message is the command's help
                typer.echo(exc.format_message(), err=True)
            else:
                typer.echo(f"agl-client: error: {' '.join(exc.format_message().split())}", err=True)
            code = exc.exit_code
        except typer.Abort:
            typer.echo("agl-client: aborted", err=True)
            code = 130
        code = code if isinstance(code, int) else EXIT_OK
        if standalone_mode:
            sys.exit(code)
        return code


app = typer.Typer(
    name="agl-client",
    cls=_OneLineErrors,
    help="agl-client: the agl-lite rollout store and gateway from a shell.\n\n"
    "Exit codes: 0 ok, 1 operation failed or timed out, 2 usage error, 3 server unreachable.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
rollouts_app = typer.Typer(help="Enqueue, list, show, cancel and wait for rollouts.", no_args_is_help=True)
events_app = typer.Typer(
    help="A rollout's events (LLM calls, rewards, your own kinds).", no_args_is_help=True
)
models_app = typer.Typer(help="Registered models and their versions.", no_args_is_help=True)
gateway_app = typer.Typer(help="Pause and resume LLM calls; the gateway's state.", no_args_is_help=True)
app.add_typer(rollouts_app, name="rollouts")
app.add_typer(events_app, name="events")
app.add_typer(models_app, name="models")
app.add_typer(gateway_app, name="gateway")


class PauseMode(StrEnum):
    HOLD = "hold"
    REJECT = "reject"


class ExportFormat(StrEnum):
    JSONL = "jsonl"
    PARQUET = "parquet"


class ExportRows(StrEnum):
    CALLS = "calls"
    TRAJECTORIES = "trajectories"


@dataclass(frozen=True, slots=True)
class Options:
    url: str | None
    key: str | None
    timeout_s: float
    retries: int
    progress: bool


def _fail(message: str, code: int) -> NoReturn:
    typer.echo(f"agl-client: {message}", err=True)
    raise typer.Exit(code)


def _run(
    ctx: typer.Context, work: Callable[[AglLiteClient], Awaitable[int | None]], *, key: bool = True
) -> None:
    """Run `work` with a client; map every client error to one line and its exit code (never a traceback)."""
    opts: Options = ctx.obj
    if key and not opts.key:
        _fail("no admin key: set AGL_KEY or pass --key", EXIT_USAGE)

    async def go() -> int | None:
        client = AglLiteClient(
            opts.url,
            opts.key,
            timeouts=Timeouts(read_s=opts.timeout_s),
            retry=RetryPolicy(attempts=opts.retries + 1),
        )
        async with client:
            return await work(client)

    try:
        code = asyncio.run(go())
    except ConnectionFailed as exc:
        _fail(f"{exc} (is the gateway running? set AGL_URL or --url)", EXIT_UNREACHABLE)
    except BadRequestError as exc:
        _fail(str(exc), EXIT_USAGE)
    except (AuthError, ForbiddenError) as exc:
        _fail(f"{exc} (check AGL_KEY or --key: the admin key is needed)", EXIT_FAILED)
    except ConfigError as exc:
        _fail(str(exc), EXIT_USAGE)
    except ClientError as exc:
        _fail(str(exc), EXIT_FAILED)
    except OSError as exc:  # a file to read or write (the network's errors are ClientErrors)
        _fail(f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc), EXIT_FAILED)
    if code:
        raise typer.Exit(code)


def _json_arg(value: str, what: str) -> Any:
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise typer.BadParameter(f"{what} is not valid JSON: {exc}") from None


def _stderr() -> Console:
    return Console(stderr=True)


JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON (one document) instead of a table.")]
RolloutArg = Annotated[str, typer.Argument(help="The rollout id.", show_default=False)]


@app.callback()
def _options(
    ctx: typer.Context,
    url: Annotated[
        str | None,
        typer.Option("--url", envvar="AGL_URL", help="Gateway URL (default http://127.0.0.1:8100)."),
    ] = None,
    key: Annotated[
        str | None, typer.Option("--key", envvar="AGL_KEY", help="The admin key.", show_default=False)
    ] = None,
    timeout: Annotated[float, typer.Option(min=0.1, help="Read timeout per request, in seconds.")] = 60.0,
    retries: Annotated[
        int, typer.Option(min=0, help="Retries of reads on connection errors, 5xx and 429 (backoff).")
    ] = 4,
    progress: Annotated[bool, typer.Option(help="Progress bars on stderr (only on a terminal).")] = True,
) -> None:
    """Global options; the URL and key come from AGL_URL and AGL_KEY unless given."""
    ctx.obj = Options(url, key, timeout, retries, progress)


# --- rollouts ------------------------------------------------------------------------------------------------------


@rollouts_app.command("add")
def rollouts_add(
    ctx: typer.Context,
    inputs: Annotated[
        list[str] | None, typer.Option("--input", "-i", help="A task input as JSON (repeatable).")
    ] = None,
    file: Annotated[
        Path | None, typer.Option("--file", "-f", help="A JSONL file: one task input per line.", exists=True)
    ] = None,
    n: Annotated[int, typer.Option("-n", min=1, help="Copies of each input, sharing a group id.")] = 1,
    mode: Annotated[str, typer.Option(help="train, val, or your own mode.")] = "train",
    metadata: Annotated[str | None, typer.Option(help="Metadata (JSON object) for every rollout.")] = None,
    max_attempts: Annotated[int, typer.Option(min=1, help="Attempts allowed per rollout.")] = 1,
    timeout_s: Annotated[float | None, typer.Option(help="Per-attempt time limit, in seconds.")] = None,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="Print only the new ids, one per line.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Enqueue rollouts: each input n times (one group per input).

    Example: agl-client rollouts add -i '{"question": "2+2"}' -n 4 --metadata '{"answer": 4}' -q
    """
    tasks = [_json_arg(i, "--input") for i in inputs or []]
    if file is not None:
        lines = [ln for ln in file.read_text().splitlines() if ln.strip()]
        tasks += [_json_arg(ln, f"{file} line {k}") for k, ln in enumerate(lines, 1)]
    if not tasks:
        raise typer.BadParameter("give at least one --input or a --file")
    meta = _json_arg(metadata, "--metadata") if metadata else {}
    if not isinstance(meta, dict):
        raise typer.BadParameter("--metadata must be a JSON object")
    config = RolloutConfig(max_attempts=max_attempts, timeout_s=timeout_s)

    async def work(client: AglLiteClient) -> None:
        groups = await client.enqueue_group(tasks, n=n, mode=mode, config=config, metadata=meta)
        created = [r for group in groups for r in group]
        if as_json:
            render.print_json([r.to_json() for r in created])
        elif quiet:
            typer.echo("\n".join(r.id for r in created))
        else:
            render.stdout().print(render.rollouts_table(created))

    _run(ctx, work)


@rollouts_app.command("ls")
def rollouts_ls(
    ctx: typer.Context,
    status: Annotated[RolloutStatus | None, typer.Option(help="Only rollouts in this state.")] = None,
    mode: Annotated[str | None, typer.Option(help="Only this mode.")] = None,
    group_id: Annotated[str | None, typer.Option(help="Only this group.")] = None,
    reward_min: Annotated[float | None, typer.Option(help="Only rollouts rewarded at least this.")] = None,
    reward_max: Annotated[float | None, typer.Option(help="Only rollouts rewarded at most this.")] = None,
    model_version: Annotated[
        str | None, typer.Option(help="Only rollouts with a call this model version served.")
    ] = None,
    since: Annotated[
        datetime | None, typer.Option(help="Only rollouts enqueued at or after this (local) time.")
    ] = None,
    until: Annotated[datetime | None, typer.Option(help="Only rollouts enqueued before this time.")] = None,
    limit: Annotated[int, typer.Option(min=0, help="Most rollouts to show (0: all).")] = 50,
    after: Annotated[int, typer.Option(min=0, help="Start after this enqueue position (keyset).")] = 0,
    as_json: JsonOpt = False,
) -> None:
    """List rollouts in enqueue order.

    Example: agl-client rollouts ls --status succeeded --reward-min 1 --since 2026-12-04T18:00 --limit 20
    """

    async def work(client: AglLiteClient) -> None:
        rows = []
        async for rollout in client.iter_rollouts(
            status=status,
            mode=mode,
            group_id=group_id,
            after=after,
            page_size=min(limit or 1000, 1000),
            reward_min=reward_min,
            reward_max=reward_max,
            model_version=model_version,
            created_after=_epoch(since, "--since"),
            created_before=_epoch(until, "--until"),
        ):
            rows.append(rollout)
            if limit and len(rows) >= limit:
                break
        render.show(rows, as_json, render.rollouts_table)

    _run(ctx, work)


def _epoch(when: datetime | None, option_name: str) -> float | None:
    try:
        return when.timestamp() if when is not None else None
    except (ValueError, OverflowError, OSError) as exc:  # year 1: no local time for it
        raise typer.BadParameter(f"{when}: {exc}", param_hint=option_name) from None


@rollouts_app.command("show")
def rollouts_show(ctx: typer.Context, rollout_id: RolloutArg, as_json: JsonOpt = False) -> None:
    """One rollout with its attempts.

    Example: agl-client rollouts show ro-1a2b3c4d5e6f7a8b
    """

    async def work(client: AglLiteClient) -> None:
        rollout, attempts = await client.get_rollout_with_attempts(rollout_id)
        if as_json:
            render.print_json({**rollout.to_json(), "attempts": [a.to_json() for a in attempts]})
        else:
            out = render.stdout()
            out.print(render.rollout_table(rollout))
            if attempts:
                out.print(render.attempts_table(attempts))

    _run(ctx, work)


@rollouts_app.command("calls")
def rollouts_calls(ctx: typer.Context, rollout_id: RolloutArg, as_json: JsonOpt = False) -> None:
    """One rollout's captured LLM calls, in request order (`--json`: whole, token ids included).

    Example: agl-client rollouts calls ro-1a2b3c4d5e6f7a8b
    """

    async def work(client: AglLiteClient) -> None:
        await client.get_rollout(rollout_id)  # 404 for an unknown rollout, not an empty list
        calls = [c async for c in client.iter_calls(rollout_id)]
        render.emit(as_json, [c.to_json() for c in calls], lambda: render.calls_table(calls))

    _run(ctx, work)


@rollouts_app.command("trajectory")
def rollouts_trajectory(ctx: typer.Context, rollout_id: RolloutArg, as_json: JsonOpt = False) -> None:
    """One rollout's calls merged into training rows, as the daemon merges them, with their rewards placed.

    Example: agl-client rollouts trajectory ro-1a2b3c4d5e6f7a8b --json
    """
    from agl_lite.integrations.rewards import row_rewards
    from agl_lite.integrations.trajectory import merge_trajectories

    async def work(client: AglLiteClient) -> None:
        rt = await client.triplets(rollout_id)
        rows, stats = merge_trajectories(rt.triplets)
        placed = row_rewards(rows, rt, RewardPolicy.LAST, 0.0)
        scores = [sum(v for _, v in p.steps) + (p.outcome or 0.0) for p in placed]
        if as_json:
            render.print_json(
                {
                    "rollout_id": rt.rollout_id,
                    "reward": rt.reward,
                    "rows": [
                        {
                            "prompt_ids": row.prompt_ids.tolist(),
                            "response_ids": row.response_ids.tolist(),
                            "response_mask": row.response_mask.tolist(),
                            "model_version": row.model_version,
                            "calls": [sp.triplet.response_id for sp in row.spans],
                            "reward": score,
                        }
                        for row, score in zip(rows, scores, strict=True)
                    ],
                    "merge": {
                        "rows": stats.rows,
                        "merged_steps": stats.merged_steps,
                        "branches": stats.branches,
                    },
                }
            )
        else:
            render.stdout().print(render.trajectory_table(rows, scores))

    _run(ctx, work)


@rollouts_app.command("cancel")
def rollouts_cancel(
    ctx: typer.Context,
    rollout_id: RolloutArg,
    message: Annotated[str | None, typer.Option(help="Why (kept on the rollout).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Cancel a queuing or running rollout (exit 1 if it is already terminal).

    Example: agl-client rollouts cancel ro-1a2b3c4d5e6f7a8b --message "bad task"
    """

    async def work(client: AglLiteClient) -> None:
        rollout = await client.cancel(rollout_id, message)
        render.emit(as_json, rollout.to_json(), lambda: f"{rollout.id}: {rollout.status.value}")

    _run(ctx, work)


@rollouts_app.command("wait")
def rollouts_wait(
    ctx: typer.Context,
    ids: Annotated[
        list[str], typer.Argument(help="Rollout ids; '-' reads them from stdin.", show_default=False)
    ],
    timeout: Annotated[float | None, typer.Option(min=0, help="Give up after this many seconds.")] = None,
    after: Annotated[int, typer.Option(min=0, help="Follow the completion cursor from here.")] = 0,
    as_json: JsonOpt = False,
) -> None:
    """Wait until rollouts are terminal, on the completion cursor (exit 1 on timeout).

    Example: agl-client rollouts add -i '{"q": 1}' -n 8 -q | agl-client rollouts wait - --timeout 600
    """
    wanted = [i for arg in ids for i in (sys.stdin.read().split() if arg == "-" else [arg])]
    if not wanted:
        raise typer.BadParameter("no rollout ids given")
    opts: Options = ctx.obj

    async def work(client: AglLiteClient) -> int:
        with progress_bar(_stderr(), "rollouts", enabled=opts.progress) as bar:
            task = bar.add_task("waiting", total=len(set(wanted)))
            result = await client.wait(
                wanted, timeout, after=after, progress=lambda done, _: bar.update(task, completed=done)
            )
        if as_json:
            render.print_json(
                {
                    "rollouts": [r.to_json() for r in result.rollouts],
                    "pending": result.pending,
                    "cursor": result.cursor,
                }
            )
        else:
            counts: dict[str, int] = {}
            for r in result.rollouts:
                counts[r.status.value] = counts.get(r.status.value, 0) + 1
            summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) or "none terminal"
            typer.echo(
                f"{len(result.rollouts)}/{len(set(wanted))} terminal: {summary} (cursor {result.cursor})"
            )
            if result.pending:
                typer.echo(f"still pending after {timeout:g} s: {' '.join(result.pending[:20])}", err=True)
        return EXIT_OK if result.done else EXIT_FAILED

    _run(ctx, work)


# --- events --------------------------------------------------------------------------------------------------------


@events_app.command("ls")
def events_ls(
    ctx: typer.Context,
    rollout_id: RolloutArg,
    kind: Annotated[
        str | None, typer.Option(help="Only events of this kind (reward, llm_call, ...).")
    ] = None,
    after_seq: Annotated[int, typer.Option(min=0, help="Only events after this sequence number.")] = 0,
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="Most events to show.")] = 1000,
    as_json: JsonOpt = False,
) -> None:
    """A rollout's events in sequence order.

    Example: agl-client events ls ro-1a2b3c4d5e6f7a8b --kind reward
    """

    async def work(client: AglLiteClient) -> None:
        events = await client.events(rollout_id, kind, after_seq, limit)
        render.show(events, as_json, render.events_table)

    _run(ctx, work)


@events_app.command("tail")
def events_tail(
    ctx: typer.Context,
    rollout_id: RolloutArg,
    kind: Annotated[str | None, typer.Option(help="Only events of this kind.")] = None,
    interval: Annotated[float, typer.Option(min=0.01, help="Seconds between polls.")] = 1.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON lines, one event per line.")] = False,
) -> None:
    """Follow a rollout's events live until it is terminal.

    Example: agl-client events tail ro-1a2b3c4d5e6f7a8b --json | jq .kind
    """

    async def work(client: AglLiteClient) -> None:
        async for event in client.follow_events(rollout_id, kind=kind, poll_s=interval):
            line = orjson.dumps(event.to_json()).decode() if as_json else render.event_line(event)
            typer.echo(line)

    _run(ctx, work)


# --- models --------------------------------------------------------------------------------------------------------


@models_app.command("ls")
def models_ls(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Registered models, their endpoints and versions.

    Example: agl-client models ls --json
    """

    async def work(client: AglLiteClient) -> None:
        models = await client.models()
        render.show(models, as_json, render.models_table)

    _run(ctx, work)


@models_app.command("set")
def models_set(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The model name.", show_default=False)],
    version: Annotated[str, typer.Option(help="The version now served (a step, a checkpoint).")],
    endpoint: Annotated[list[str], typer.Option("--endpoint", "-e", help="An endpoint URL (repeatable).")],
    served_model: Annotated[
        str | None,
        typer.Option(
            help="The name the endpoints serve it under (vLLM's --served-model-name), if not NAME's route's."
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Register a model version (after a weight sync).

    Example: agl-client models set qwen --version step-120 -e http://10.0.0.5:8000/v1 --served-model Qwen/Qwen3-8B
    """

    async def work(client: AglLiteClient) -> None:
        model = await client.put_model(name, endpoint, version, served_model)
        render.emit(as_json, model.to_json(), lambda: f"{model.name}: version {model.version}")

    _run(ctx, work)


@models_app.command("rm")
def models_rm(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The model name.", show_default=False)],
    as_json: JsonOpt = False,
) -> None:
    """Take a registration back: the route serves its routes-file entry again, or goes (exit 1 if none).

    Example: agl-client models rm qwen-step-120
    """

    async def work(client: AglLiteClient) -> None:
        model = await client.remove_model(name)
        render.emit(
            as_json,
            model.to_json(),
            lambda: f"{model.name}: registration removed (it was version {model.version})",
        )

    _run(ctx, work)


# --- gateway -------------------------------------------------------------------------------------------------------


@gateway_app.command("pause")
def gateway_pause(
    ctx: typer.Context,
    mode: Annotated[
        PauseMode, typer.Option(help="hold: calls wait for resume; reject: calls get 429.")
    ] = PauseMode.HOLD,
    hold_timeout: Annotated[
        float | None, typer.Option(min=0, help="Longest a held call waits, in seconds.")
    ] = None,
    drain: Annotated[
        float | None,
        typer.Option(min=0, help="Then wait up to this many seconds for in-flight calls to end."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Pause LLM calls (the API keeps answering); exit 1 if --drain timed out with calls in flight.

    Example: agl-client gateway pause --mode hold --hold-timeout 300 --drain 60
    """

    async def work(client: AglLiteClient) -> int:
        state = await client.pause("reject" if mode is PauseMode.REJECT else "hold", hold_timeout)
        if drain is not None:
            state = await client.gateway_state(wait_drained=drain)
        render.emit(as_json, state.to_json(), lambda: render.state_table(state))
        return EXIT_FAILED if drain is not None and not state.drained else EXIT_OK

    _run(ctx, work)


@gateway_app.command("resume")
def gateway_resume(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Resume LLM calls; held calls go on.

    Example: agl-client gateway resume
    """

    async def work(client: AglLiteClient) -> None:
        state = await client.resume()
        render.emit(as_json, state.to_json(), lambda: render.state_table(state))

    _run(ctx, work)


@gateway_app.command("status")
def gateway_status(
    ctx: typer.Context,
    wait_drained: Annotated[
        float | None, typer.Option(min=0, help="First wait up to this many seconds for no call in flight.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Whether LLM calls are paused, and how many are in flight or held.

    Example: agl-client gateway status --json
    """

    async def work(client: AglLiteClient) -> None:
        state = await client.gateway_state(wait_drained)
        render.emit(as_json, state.to_json(), lambda: render.state_table(state))

    _run(ctx, work)


# --- export and health ---------------------------------------------------------------------------------------------


@app.command("export")
def export(
    ctx: typer.Context,
    out: Annotated[Path, typer.Argument(help="The file to write.", show_default=False)],
    status: Annotated[RolloutStatus, typer.Option(help="Rollouts in this state.")] = RolloutStatus.SUCCEEDED,
    fmt: Annotated[
        ExportFormat | None, typer.Option("--format", help="jsonl or parquet (default: from OUT's suffix).")
    ] = None,
    mode: Annotated[str | None, typer.Option(help="Only this mode.")] = None,
    group_id: Annotated[str | None, typer.Option(help="Only this group.")] = None,
    all_outcomes: Annotated[
        bool, typer.Option("--all-outcomes", help="Also calls whose response did not fully reach the agent.")
    ] = False,
    page_size: Annotated[int, typer.Option(min=1, max=1000, help="Rollouts and calls per request.")] = 100,
    rows: Annotated[
        ExportRows,
        typer.Option(
            help="calls: one row per call and choice; trajectories: the merged rows a trainer sees, with their "
            "response mask, logprobs, reward and GRPO advantage."
        ),
    ] = ExportRows.CALLS,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Write one row per LLM call (and choice): ids, logprobs, reward, model version, messages; or, with `--rows
    trajectories`, one row per training sequence (docs/client.md). Streams page by page, so memory stays flat;
    parquet needs the pyarrow extra.

    Example: agl-client export --status succeeded --format parquet calls.parquet
    """
    fmt = fmt or (ExportFormat.PARQUET if out.suffix == ".parquet" else ExportFormat.JSONL)
    opts: Options = ctx.obj

    async def run(
        client: AglLiteClient, writer: RowWriter, progress: Callable[[Any], None]
    ) -> dict[str, Any]:
        if rows is ExportRows.TRAJECTORIES:
            from agl_lite.integrations.export import export_trajectories

            t = await export_trajectories(
                client,
                writer,
                status=status,
                mode=mode,
                group_id=group_id,
                page_size=page_size,
                progress=progress,
            )
            what = f"{t.rows:,} trajectory rows ({t.rollouts:,} rollouts, {t.groups:,} groups)"
            return {
                "rows": t.rows,
                "rollouts": t.rollouts,
                "groups": t.groups,
                "split_groups": t.split_groups,
                "": what,
            }
        c = await export_calls(
            client,
            writer,
            status=status,
            mode=mode,
            group_id=group_id,
            only_ok=not all_outcomes,
            page_size=page_size,
            progress=progress,
        )
        return {
            "rows": c.rows,
            "calls": c.calls,
            "rollouts": c.rollouts,
            "": f"{c.rows:,} rows ({c.calls:,} calls, {c.rollouts:,} rollouts)",
        }

    async def work(client: AglLiteClient) -> None:
        await client.health()  # unreachable: fail before creating the file
        writer = open_writer(out, fmt.value, rows=rows.value)
        started = time.monotonic()
        ok = False
        try:
            with counter(_stderr(), "rows", enabled=opts.progress) as bar:
                task = bar.add_task("exporting", total=None, detail="0 rollouts")

                def progress(stats: Any) -> None:
                    bar.update(task, completed=stats.rows, detail=f"{stats.rollouts:,} rollouts")

                summary = await run(client, writer, progress)
            ok = True
        finally:
            writer.close(ok=ok)
        seconds = time.monotonic() - started
        what = summary.pop("")
        render.emit(
            as_json,
            {**summary, "seconds": seconds, "path": str(out), "format": fmt.value},
            lambda: f"exported {what} to {out} in {seconds:.1f} s",
        )

    _run(ctx, work)


@app.command("health")
def health(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Check that the gateway answers (no key needed); exit 3 if it cannot be reached.

    Example: agl-client --url http://gpu-box:8100 health
    """

    async def work(client: AglLiteClient) -> None:
        started = time.monotonic()
        answer = await client.health()
        ms = (time.monotonic() - started) * 1000
        render.emit(
            as_json,
            {**answer, "url": client.url, "ms": round(ms, 2)},
            lambda: f"{answer.get('status', '?')}  {client.url}  ({ms:.1f} ms)",
        )

    _run(ctx, work, key=False)


@app.command("version")
def version() -> None:
    """Print the agl-lite version.

    Example: agl-client version
    """
    typer.echo(__version__)


def main() -> None:
    """The `agl-client` entry point."""
    try:
        app(prog_name="agl-client")
    except KeyboardInterrupt:
        sys.exit(130)
