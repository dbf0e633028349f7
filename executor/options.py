"""What `hetprof run` passes to every worker besides the plan: one frozen record of plain values.

Its own module so the launcher, the worker entry point and the per-rank roles all read it without
importing each other (the start method pickles it into each worker process).
"""

from __future__ import annotations

import dataclasses

from hetprof.errors import HetprofError


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """Everything a worker needs besides the plan; plain values so the start method can send it."""

    plan_path: str
    iterations: int = 20
    backend: str | None = "hf"  # None: the plan's own (the launcher resolves it before workers start)
    checkpoint_dir: str | None = None
    checkpoint_every: int = 5
    resume: bool = False
    log: str | None = None
    db: str | None = None
    seed: int = 0
    prompts: str | None = None
    reward: str = "arithmetic"
    timeout_s: float = 120.0
    bucket_mb: float = 32.0
    verify_sync: bool = False
    quiet: bool = False
    overrides: tuple[str, ...] = ()  # `--set key.path=value` on the plan's workload (launch_checks.load_plan)
    tensorboard_dir: str | None = None  # event files under <dir>/<run name>; None: no TensorBoard
    wandb_project: str | None = None  # a Weights & Biases project the records also go to; None: no W&B
    wandb_dir: str | None = None  # where wandb keeps its local files (its own `wandb/` folder goes there)
    trace_dir: str | None = None  # torch.profiler traces, one file per rank; None: no trace
    trace_iterations: int = 2
    allow_prompts_outside: bool = False  # a plan's data.prompts may lie outside the plan's folder

    def validate(self) -> None:
        if self.iterations < 1:
            raise HetprofError(f"--iterations must be at least 1, got {self.iterations}")
        if self.checkpoint_every < 1:
            raise HetprofError(f"--checkpoint-every must be at least 1, got {self.checkpoint_every}")
        if self.resume and not self.checkpoint_dir:
            raise HetprofError("--resume needs --checkpoint-dir (where the checkpoints are)")
        if self.trace_iterations < 1:
            raise HetprofError(f"--trace-iterations must be at least 1, got {self.trace_iterations}")
        if self.timeout_s <= 0:
            raise HetprofError(f"--timeout must be positive, got {self.timeout_s}")

    def checkpoint_due(self, iterations_done: int) -> bool:
        """Whether a checkpoint is written after `iterations_done` iterations (every N, and the last)."""
        return bool(self.checkpoint_dir) and (iterations_done % self.checkpoint_every == 0
                                              or iterations_done == self.iterations)
