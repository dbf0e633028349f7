"""The run's iteration records as TensorBoard scalars and text, written by the leader alone.

Each record (run_record.build_record) becomes scalars under fixed tags (scalars.py: hetprof's own
and verl's names), stepped by iteration, so a resumed run continues the same curves in the same
folder (the run keeps its name on resume); a custom-scalars chart per task draws its measured and
predicted seconds together, and `samples` holds a few prompts, responses and rewards as a markdown table.

torch.utils.tensorboard's writer queues events for its own thread, and the recorder calls it
from the record thread, so the RL loop never waits for the disk.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hetprof.executor.records.run_name import run_name_problem
from hetprof.executor.records.scalars import scalars


def run_folder(root: str | Path, run: str) -> Path:
    """Where a run's event files go: one subfolder per run name, as TensorBoard lists runs. The name
    may come from a shared checkpoint folder: it must be one path component, never a way out of root."""
    if problem := run_name_problem(run):
        raise ValueError(f"TensorBoard run folder: expected {problem}")
    return Path(root) / run


def samples_markdown(samples: list[dict[str, Any]]) -> str:
    """A markdown table of sample prompts and responses (TensorBoard's text plugin renders it)."""
    rows = ["| prompt | response | answer | reward |", "|---|---|---|---|"]
    for s in samples:
        cells = [_cell(s.get("prompt")), _cell(s.get("response")), _cell(s.get("answer")),
                 f"{float(s.get('reward', 0.0)):.3f}"]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def chart_layout(tasks: list[str]) -> dict[str, dict[str, list[Any]]]:
    """TensorBoard's custom-scalars layout: per task one chart with its measured and predicted lines."""
    return {"seconds: measured vs predicted": {
        task: ["Multiline", [f"seconds/{task}/measured", f"seconds/{task}/predicted"]] for task in tasks}}


class TensorBoardLog:
    """One run's event file; `write` adds an iteration record, `close` flushes it.

    A resumed run starts at its checkpoint's iteration `first`: TensorBoard drops what the earlier
    process wrote from that step on (`purge_step`), since those iterations are run again.
    """

    def __init__(self, root: str | Path, run: str, first: int = 0) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.folder = run_folder(root, run)
        self._writer = SummaryWriter(log_dir=str(self.folder), flush_secs=10, purge_step=first or None)
        self._charted = False

    def write(self, record: dict[str, Any]) -> None:
        step = int(record["iteration"])
        if not self._charted:  # the tasks are known from the first record
            self._writer.add_custom_scalars(chart_layout(list(record.get("stages", {}))))
            self._charted = True
        for tag, value in scalars(record).items():
            self._writer.add_scalar(tag, value, step, walltime=record.get("time"))
        if record.get("samples"):
            self._writer.add_text("samples", samples_markdown(record["samples"]), step, walltime=record.get("time"))

    def close(self) -> None:
        self._writer.close()


def _cell(value: Any) -> str:
    """Table-safe text: pipes escaped and line breaks shown as ⏎ (a response may span lines)."""
    return "" if value is None else str(value).replace("|", "\\|").replace("\n", " ⏎ ")
