"""The run's iteration records in Weights & Biases (`hetprof run --wandb PROJECT`), written by the leader alone.

The same scalars as TensorBoard (scalars.py: hetprof's tags and verl's names) plus the samples as a
table, each record stepped by its `iteration` (a metric of its own, so a resumed run, which runs
again the iterations after its checkpoint, logs them without wandb refusing a step that went back).
The W&B run takes the run's name as its id, so a resumed run continues it. `wandb` is an optional
package (`pip install 'hetprof[wandb]'`), imported only when a run asks for it; its own settings
apply (`WANDB_MODE=offline` writes the run under the folder given, for `wandb sync` later).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from hetprof.errors import HetprofError
from hetprof.executor.records.scalars import scalars

CONFIG_FIELDS = ("run", "plan_hash", "mode", "algorithm", "staleness_bound", "layouts", "devices")
SAMPLE_COLUMNS = ("prompt", "response", "answer", "reward")


def check_wandb(project: str | None) -> None:
    """`--wandb` needs the wandb package in this Python: refused before any worker starts."""
    if project and importlib.util.find_spec("wandb") is None:
        raise HetprofError(f"--wandb {project}: the wandb package is not installed in this Python "
                           f"(pip install 'hetprof[wandb]')")


class WandbLog:
    """One run in a W&B project; `write` adds an iteration record, `close` finishes the run."""

    def __init__(self, project: str, run: str, folder: str | Path) -> None:
        import wandb

        Path(folder).mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(project=project, name=run, id=run, resume="allow", dir=str(folder))
        self._run.define_metric("iteration")
        self._run.define_metric("*", step_metric="iteration")
        self._configured = False

    def write(self, record: dict[str, Any]) -> None:
        if not self._configured:  # what the run is, known from its first record
            self._run.config.update({k: record[k] for k in CONFIG_FIELDS if k in record}, allow_val_change=True)
            self._configured = True
        data: dict[str, Any] = {"iteration": int(record["iteration"]), **scalars(record)}
        if record.get("samples"):
            import wandb

            rows = [[s.get(c) if c != "reward" else float(s.get(c, 0.0)) for c in SAMPLE_COLUMNS]
                    for s in record["samples"]]
            data["samples"] = wandb.Table(columns=list(SAMPLE_COLUMNS), data=rows)
        self._run.log(data)

    def close(self) -> None:
        self._run.finish()
