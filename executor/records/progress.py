"""The leader's progress bar for `hetprof run`: iteration, reward, tokens/s and the time left.

Shown only on a terminal (a log file or a pipe gets the per-iteration lines alone) and not with
--quiet. Rich draws it below the console lines, which keep printing above it, so nothing that
was printed before is lost.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


def wanted(console: Console, quiet: bool) -> bool:
    """Whether a bar is drawn: on a terminal and not quiet."""
    return console.is_terminal and not quiet


class RunProgress:
    """A bar over the run's iterations, advanced by each iteration record."""

    def __init__(self, console: Console, first: int, total: int) -> None:
        self._progress = Progress(
            TextColumn("[bold]iteration"), MofNCompleteColumn(), BarColumn(),
            TextColumn("reward {task.fields[reward]}  tok/s {task.fields[tokens_per_s]}"),
            TextColumn("ETA"), TimeRemainingColumn(), console=console, transient=False)
        self._task = self._progress.add_task("run", total=total, completed=first, reward="-", tokens_per_s="-")
        self._progress.start()

    def advance(self, record: dict[str, Any]) -> None:
        """Count the record's iteration done and show its reward and throughput."""
        self._progress.update(self._task, completed=int(record["iteration"]) + 1,
                              reward=f"{float(record.get('reward_mean', 0.0)):.3f}",
                              tokens_per_s=f"{float(record.get('tokens_per_s', 0.0)):.0f}")

    @property
    def fields(self) -> dict[str, Any]:
        """What the bar shows now (completed, total and its text fields)."""
        task = self._progress.tasks[0]
        return {"completed": task.completed, "total": task.total, **task.fields}

    def close(self) -> None:
        self._progress.stop()
