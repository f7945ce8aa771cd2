"""What the CLI's tables look like in an 80-column terminal: the ids people copy stay on one line."""

from __future__ import annotations

from rich.console import Console

from agl_lite.client import render
from agl_lite.store.records import Rollout, RolloutStatus


def test_rollout_ids_and_statuses_never_wrap_at_80_columns() -> None:
    rollouts = [
        Rollout(
            f"ro-{k:016x}", {}, status=RolloutStatus.SUCCEEDED, group_id="grp-" + "0" * 16, created_at=1.8e9
        )
        for k in range(3)
    ]
    console = Console(width=80, record=True, color_system=None)
    console.print(render.rollouts_table(rollouts))
    lines = console.export_text().splitlines()
    for r in rollouts:
        assert sum(r.id in line for line in lines) == 1
    assert sum("succeeded" in line for line in lines) == 3
    assert max(len(line) for line in lines) <= 80
