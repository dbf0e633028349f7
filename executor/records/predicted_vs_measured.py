"""Predicted against measured: how well the plan's cost model foresaw the run, per task and iteration.

The plan carries its prediction (iteration time and per-task seconds); every iteration record
carries what was measured. Steady state is what the simulator predicts, so the first iterations
(start-up, allocator and cache warm-up) are left out of the summary by default, and the median is
used so one slow iteration on a shared machine does not decide the verdict.
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from hetprof.display import shown
from hetprof.errors import HetprofError
from hetprof.executor.records.run_log import check_record, read_db, read_log


def load_records(source: str, db_file: str | Path | None) -> list[dict[str, Any]]:
    """Iteration records from a JSONL log path, else from the profile database by run id."""
    if os.path.lexists(source):  # a FIFO or device named as the log is refused by read_log, not taken for a run id
        records = read_log(source)
    elif db_file is not None and Path(db_file).is_file():
        records = read_db(db_file, source)
        for rec in records:
            check_record(rec, f"run {source} in {db_file}")
    else:
        raise HetprofError(f"{source!r} is neither a run log file nor a run id in the profile database "
                           f"({db_file or 'no database'})")
    if not records:
        raise HetprofError(f"{source}: no iteration records")
    for rec in records:  # a record needs its iteration's time; a stored run can lack that row
        if not isinstance(rec.get("iteration_s"), (int, float)):
            raise HetprofError(f"{source}: iteration {rec.get('iteration', '?')} has no measured iteration "
                               "time (its 'iteration' row is missing)")
    return records


def ratio(measured: float | None, predicted: float | None) -> float | None:
    if measured is None or not predicted:
        return None
    return measured / predicted


def summary(records: list[dict[str, Any]], skip: int = 1) -> dict[str, dict[str, float | None]]:
    """{task or 'iteration': {predicted, measured (median), ratio}} over the steady-state iterations."""
    steady = records[skip:] if len(records) > skip else records
    out: dict[str, dict[str, float | None]] = {}
    tasks: list[str] = []
    for rec in steady:
        tasks.extend(t for t in rec.get("stages", {}) if t not in tasks)
    for task in tasks:
        values = [r["stages"][task] for r in steady if task in r.get("stages", {})]
        predicted = next((r["predicted"][task] for r in steady if r.get("predicted", {}).get(task)), None)
        measured = statistics.median(values) if values else None
        out[task] = {"predicted": predicted, "measured": measured, "ratio": ratio(measured, predicted)}
    measured = statistics.median(r["iteration_s"] for r in steady)
    predicted = next((r.get("predicted_iteration_s") for r in steady if r.get("predicted_iteration_s")), None)
    out["iteration"] = {"predicted": predicted, "measured": measured, "ratio": ratio(measured, predicted)}
    return out


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "—" if x is None else format(x, spec)


def render(records: list[dict[str, Any]], skip: int = 1, console: Console | None = None) -> None:
    console = console or Console()
    run = records[0].get("run", "?")
    per_task = Table(title=shown(f"run {run}: predicted vs measured per task (median of iterations ≥ {skip})"))
    for col in ("task", "predicted s", "measured s", "measured / predicted"):
        per_task.add_column(col, justify="left" if col == "task" else "right")
    for task, row in summary(records, skip).items():
        per_task.add_row(shown(task), _fmt(row["predicted"]), _fmt(row["measured"]), _fmt(row["ratio"], ".2f"))
    console.print(per_task)
    rows = []
    for rec in records:
        pred = rec.get("predicted_iteration_s")
        rows.append([rec["iteration"], _fmt(pred), _fmt(rec["iteration_s"]), _fmt(ratio(rec["iteration_s"], pred), ".2f"),
                     _fmt(rec.get("reward_mean")), _fmt(rec.get("kl"), ".4f"), str(rec.get("staleness_max", "—"))])
    from hetprof.display import Col, fitted_table

    # a narrow terminal loses staleness, then KL, then reward; the times and their ratio always stay
    columns = (Col("iteration", "right"), Col("predicted s", "right"), Col("measured s", "right"),
               Col("ratio", "right"), Col("reward", "right", drop=1), Col("kl", "right", drop=2),
               Col("staleness", "right", drop=3))
    console.print(fitted_table(console, columns, rows, title="per iteration", hint="a wider terminal shows them"))
