"""The CLI's progress bars show counts and a rate on a terminal, and stay out of pipes."""

from __future__ import annotations

import io

from rich.console import Console

from agl_lite.client.progress import counter, progress_bar


def terminal() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=True, width=120), out


def test_bar_shows_done_of_total_and_a_rate() -> None:
    console, out = terminal()
    with progress_bar(console, "rollouts") as bar:
        task = bar.add_task("waiting", total=4)
        bar.update(task, completed=3)
    text = out.getvalue()
    assert "3/4" in text
    assert "rollouts/s" in text


def test_counter_shows_count_detail_and_rate() -> None:
    console, out = terminal()
    with counter(console, "rows") as bar:
        task = bar.add_task("exporting", total=None, detail="2 rollouts")
        bar.update(task, completed=1234)
    assert "1,234 rows · 2 rollouts" in out.getvalue()
    assert "rows/s" in out.getvalue()


def test_nothing_is_drawn_when_not_a_terminal_or_disabled() -> None:
    out = io.StringIO()
    with progress_bar(Console(file=out), "rollouts") as bar:
        bar.update(bar.add_task("waiting", total=2), completed=2)
    console, tty = terminal()
    with progress_bar(console, "rollouts", enabled=False) as bar:
        bar.update(bar.add_task("waiting", total=2), completed=2)
    assert out.getvalue() == tty.getvalue() == ""
