"""The run's iteration records as TensorBoard scalars and text, written by the leader alone.

Each record (run_record.build_record) becomes scalars under fixed tags, stepped by iteration, so a
resumed run continues the same curves in the same folder (the run keeps its name on resume):

  reward/mean, reward/std, train/kl, train/entropy, train/clip_frac, train/grad_norm, train/lr,
  train/policy_loss, critic/<stat>, batch/response_len, batch/prompt_len, batch/staleness_max,
  throughput/tokens_per_s, time/iteration_s and time/predicted_iteration_s, and per task
  seconds/<task>/measured beside seconds/<task>/predicted (and a custom-scalars chart per task
  with both lines);
  `samples` holds a few prompts, responses and rewards as a markdown table.

torch.utils.tensorboard's writer queues events for its own thread, and the recorder calls it
from the record thread, so the RL loop never waits for the disk.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

SCALARS = {
    "reward/mean": "reward_mean", "reward/std": "reward_std", "train/kl": "kl", "train/entropy": "entropy",
    "train/clip_frac": "clip_frac", "train/grad_norm": "grad_norm", "train/lr": "lr",
    "train/policy_loss": "policy_loss", "batch/response_len": "response_tokens_mean",
    "batch/prompt_len": "prompt_tokens_mean", "batch/staleness_max": "staleness_max",
    "throughput/tokens_per_s": "tokens_per_s", "time/iteration_s": "iteration_s",
    "time/predicted_iteration_s": "predicted_iteration_s",
}


def run_folder(root: str | Path, run: str) -> Path:
    """Where a run's event files go: one subfolder per run name, as TensorBoard lists runs. The name
    may come from a shared checkpoint folder: it must be one path component, never a way out of root."""
    from hetprof.executor.checkpoints.checkpoint import run_name_problem

    if problem := run_name_problem(run):
        raise ValueError(f"TensorBoard run folder: expected {problem}")
    return Path(root) / run


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """Tag -> value of one iteration record (fields that are absent or not numbers are left out)."""
    out = {tag: float(record[key]) for tag, key in SCALARS.items() if _number(record.get(key))}
    out.update({f"critic/{k.removeprefix('critic_')}": float(v) for k, v in record.items()
                if k.startswith("critic_") and _number(v)})
    predicted = record.get("predicted", {})
    for task, seconds in record.get("stages", {}).items():
        out[f"seconds/{task}/measured"] = float(seconds)
        if _number(predicted.get(task)):
            out[f"seconds/{task}/predicted"] = float(predicted[task])
    return out


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


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def _cell(value: Any) -> str:
    """Table-safe text: pipes escaped and line breaks shown as ⏎ (a response may span lines)."""
    return "" if value is None else str(value).replace("|", "\\|").replace("\n", " ⏎ ")
