"""What the user sees: rich progress bars while suites run, one summary table at the end."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from hetprof.profiler.context import SummaryRow


class ProgressView:
    """A progress bar per (suite, device); `add(label, total)` returns the bar's advance function."""

    def __init__(self, console: Console):
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=console, transient=False)

    def __enter__(self) -> ProgressView:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)

    def add(self, label: str, total: int) -> Callable[[int], None]:
        task = self.progress.add_task(label, total=max(total, 1))

        def advance(n: int = 1) -> None:
            self.progress.advance(task, n)

        return advance


def summary_table(rows: list[SummaryRow], seconds: float, db_path: Path) -> Table:
    table = Table(title=f"hetprof profile: {len(rows)} benchmark runs in {seconds:.1f} s -> {db_path}")
    table.add_column("suite")
    table.add_column("benchmark", no_wrap=True, min_width=21)  # names are what users grep for: never cut
    table.add_column("device", no_wrap=True)
    table.add_column("samples", justify="right")
    table.add_column("result")
    for r in rows:
        table.add_row(r.suite, r.benchmark, r.device, str(r.samples), r.headline)
    return table
