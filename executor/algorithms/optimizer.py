"""The learner's optimizer and learning-rate schedule, built from the workload's `optimizer` section.

The schedule is a pure function of the optimizer step (`lr_factor`), wrapped in torch's LambdaLR,
so a resumed run's scheduler state is one counter and the curve can be tested at chosen steps.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from hetprof.specs import OptimizerParams, WorkloadSpec


def lr_factor(step: int, schedule: str, warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.0) -> float:
    """The learning rate at optimizer step `step` (0-based) as a fraction of the peak.

    Warm-up: (step + 1) / warmup_steps for the first `warmup_steps` steps, so the first step already
    moves the weights. Then `constant` stays at 1; `linear` and `cosine` fall from 1 right after
    warm-up to `min_lr_ratio` at the last step (`total_steps - 1`) and stay there.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    span = max(1, total_steps - 1 - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    if schedule == "linear":
        shape = 1.0 - progress
    elif schedule == "cosine":
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        raise ValueError(f"unknown learning-rate schedule {schedule!r}")
    return min_lr_ratio + (1.0 - min_lr_ratio) * shape


def optimizer_steps(workload: WorkloadSpec, iterations: int) -> int:
    """Optimizer steps a run of `iterations` takes: every iteration, ppo_epochs × mini_batches."""
    return iterations * workload.ppo_epochs * workload.mini_batches


def build_optimizer(params: Iterable[torch.nn.Parameter], lr: float, config: OptimizerParams) -> torch.optim.AdamW:
    """AdamW with the section's betas, eps and decoupled weight decay."""
    beta1, beta2 = config.betas
    return torch.optim.AdamW(params, lr=lr, betas=(beta1, beta2), eps=config.eps, weight_decay=config.weight_decay)


def build_scheduler(optimizer: torch.optim.Optimizer, config: OptimizerParams,
                    total_steps: int) -> torch.optim.lr_scheduler.LambdaLR | None:
    """The section's schedule over `total_steps` optimizer steps; None for a constant rate without
    warm-up (nothing to step)."""
    if config.lr_schedule == "constant" and config.warmup_steps == 0:
        return None
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, config.lr_schedule, config.warmup_steps, total_steps,
                                          config.min_lr_ratio))
