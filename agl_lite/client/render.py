"""How the CLI shows records: rich tables for people, JSON for scripts. Formatting only, no I/O but printing."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
from rich.console import Console
from rich.table import Table

from agl_lite.client.results import GatewayState
from agl_lite.store.records import Attempt, Event, LLMCall, ModelRecord, Rollout

if TYPE_CHECKING:
    from agl_lite.integrations.trajectory import Row

__all__ = [
    "attempts_table",
    "event_line",
    "events_table",
    "models_table",
    "print_json",
    "rollout_table",
    "rollouts_table",
    "state_table",
    "stdout",
]


def print_json(obj: Any) -> None:
    """One JSON document on stdout (for `--json`)."""
    print(orjson.dumps(obj, option=orjson.OPT_INDENT_2).decode())


def _when(ts: float | None, *, short: bool = False) -> str:
    """Local time; `short` (a list's column): without the year."""
    return (
        ""
        if not ts
        else time.strftime("%m-%d %H:%M:%S" if short else "%Y-%m-%d %H:%M:%S", time.localtime(ts))
    )


def _short(value: Any, width: int = 60) -> str:
    text = value if isinstance(value, str) else orjson.dumps(value).decode()
    return text if len(text) <= width else text[: width - 1] + "…"


def _table(*columns: str, title: str | None = None, ids: int = 0) -> Table:
    """A table whose long cells fold; its first `ids` columns (ids people copy) never wrap: the others give way."""
    table = Table(*columns, title=title, title_justify="left", show_edge=False, pad_edge=False)
    for i, column in enumerate(table.columns):
        column.overflow = "fold"
        if i < ids:
            column.no_wrap = True
    return table


def rollouts_table(rollouts: Sequence[Rollout]) -> Table:
    table = _table("id", "status", "mode", "group", "reward", "att.", "created", ids=2)
    for r in rollouts:
        table.add_row(
            r.id,
            r.status.value,
            r.mode,
            r.group_id or "",
            "" if r.reward is None else f"{r.reward:g}",
            str(r.attempt_count),
            _when(r.created_at, short=True),
        )
    return table


def rollout_table(r: Rollout) -> Table:
    table = _table("field", "value", title=f"rollout {r.id}")
    for name, value in (
        ("status", r.status.value),
        ("mode", r.mode),
        ("group", r.group_id or ""),
        ("reward", "" if r.reward is None else f"{r.reward:g}"),
        ("input", _short(r.input)),
        ("metadata", _short(r.metadata)),
        ("config", _short(dataclasses.asdict(r.config))),
        ("created", _when(r.created_at)),
        ("started", _when(r.started_at)),
        ("ended", _when(r.ended_at)),
        ("message", r.message or ""),
        ("completion cursor", "" if r.completion_seq is None else str(r.completion_seq)),
    ):
        table.add_row(name, value)
    return table


def attempts_table(attempts: Sequence[Attempt]) -> Table:
    table = _table("attempt", "seq", "status", "exit", "started", "ended", "message", title="attempts")
    for a in attempts:
        table.add_row(
            a.id,
            str(a.seq),
            a.status.value,
            "" if a.exit_code is None else str(a.exit_code),
            _when(a.started_at),
            _when(a.ended_at),
            _short(a.message or "", 40),
        )
    return table


def calls_table(calls: Sequence[LLMCall]) -> Table:
    """A rollout's captured calls: one line each, its first choice's reply shortened."""
    table = _table(
        "#", "attempt", "outcome", "model", "version", "prompt", "reply", "finish", "text", title="calls"
    )
    for k, c in enumerate(calls):
        first = c.choices[0] if c.choices else None
        table.add_row(
            str(k),
            c.attempt_id or "",
            c.outcome.value + ("" if not c.late else " (late)"),
            c.model or c.requested_model or "",
            c.model_version or "",
            "" if c.prompt_token_ids is None else str(len(c.prompt_token_ids)),
            "" if first is None else str(len(first.token_ids)),
            "" if first is None else first.finish_reason or "",
            _short(first.text or "" if first is not None else c.error or "", 30),
        )
    return table


def trajectory_table(rows: Sequence[Row], rewards: Sequence[float]) -> Table:
    """A rollout's merged training rows: their lengths, how much of each the policy sampled, their reward."""
    table = _table("row", "steps", "prompt", "response", "trained", "version", "reward", title="trajectory")
    for k, (row, reward) in enumerate(zip(rows, rewards, strict=True)):
        table.add_row(
            str(k),
            str(len(row.spans)),
            str(len(row.prompt_ids)),
            str(len(row.response_ids)),
            str(sum(row.response_mask)),
            row.model_version or "",
            f"{reward:g}",
        )
    return table


def events_table(events: Sequence[Event]) -> Table:
    table = _table("seq", "kind", "source", "attempt", "data", "at")
    for e in events:
        table.add_row(str(e.seq), e.kind, e.source, e.attempt_id or "", _short(e.data), _when(e.created_at))
    return table


def event_line(e: Event) -> str:
    return f"{e.seq:>5}  {_when(e.created_at)}  {e.kind:<12} {e.source:<7} {_short(e.data, 100)}"


def models_table(models: Sequence[ModelRecord]) -> Table:
    table = _table("model", "version", "endpoints", "updated")
    for m in models:
        table.add_row(m.name, m.version, ", ".join(m.endpoints), _when(m.updated_at))
    return table


def state_table(state: GatewayState) -> Table:
    table = _table("field", "value", title="gateway")
    table.add_row("paused", "yes" if state.paused else "no")
    if state.paused:
        table.add_row("mode", state.mode or "")
        table.add_row("hold timeout (s)", "" if state.hold_timeout_s is None else f"{state.hold_timeout_s:g}")
        table.add_row("paused since", _when(state.paused_since))
    table.add_row("in flight", str(state.in_flight))
    table.add_row("held", str(state.held))
    return table


def stdout() -> Console:
    """A console on the current stdout (made per command: test runners swap stdout)."""
    return Console(soft_wrap=False, highlight=False)


R = TypeVar("R", Rollout, Event, ModelRecord)


def show(records: Sequence[R], as_json: bool, table: Callable[[Sequence[R]], Table]) -> None:
    """What every list command prints: the records as one JSON array (`--json`), or their table."""
    emit(as_json, [r.to_json() for r in records], lambda: table(records))


def emit(as_json: bool, data: Any, human: Callable[[], Table | str]) -> None:
    """What a command prints: `data` as one JSON document (`--json`), or what `human()` makes of it for a person
    (a table, or a line)."""
    if as_json:
        print_json(data)
    elif isinstance(shown := human(), str):
        print(shown)
    else:
        stdout().print(shown)
