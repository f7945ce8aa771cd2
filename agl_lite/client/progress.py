"""Progress bars for the CLI (rich, on stderr): counts, rate and elapsed time. Shown only on a terminal, so
scripts and pipes get clean output."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

__all__ = ["RateColumn", "counter", "progress_bar"]


class RateColumn(ProgressColumn):
    """Items per second so far (`12.5 rows/s`)."""

    def __init__(self, unit: str) -> None:
        super().__init__()
        self.unit = unit

    def render(self, task: Task) -> Text:
        elapsed = task.finished_time if task.finished else task.elapsed
        rate = task.completed / elapsed if elapsed else 0.0
        return Text(f"{rate:,.1f} {self.unit}/s", style="progress.data.speed")


def progress_bar(console: Console, unit: str, *, enabled: bool = True) -> Progress:
    """A bar with `done/total`, the rate and the elapsed time (for a known total)."""
    return Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        RateColumn(unit),
        TimeElapsedColumn(),
        console=console,
        disable=not (enabled and console.is_terminal),
        transient=False,
    )


def counter(console: Console, unit: str, *, enabled: bool = True) -> Progress:
    """Counts without a total (`1,234 rows · 3 rollouts`), with the rate and the elapsed time."""
    return Progress(
        TextColumn("[progress.description]{task.description}"),
        TextColumn("{task.completed:,.0f} " + unit + " · {task.fields[detail]}"),
        RateColumn(unit),
        TimeElapsedColumn(),
        console=console,
        disable=not (enabled and console.is_terminal),
        transient=False,
    )
