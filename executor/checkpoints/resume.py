"""Where a run starts and what its checkpoints hold, as one rank sees it.

The leader alone decides the starting iteration (0, or the last committed checkpoint's) and the run's
name, and broadcasts both, so every rank resumes from the same point. Each rank saves and loads only
the checkpoint units of its own trained tasks, as their runners name them (runners/trainers.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from hetprof.errors import ExecutionError, HetprofError
from hetprof.executor.checkpoints import checkpoint
from hetprof.executor.options import RunOptions

if TYPE_CHECKING:
    from hetprof.executor.runners.base import RunnerBase


def agree_on_start(options: RunOptions, plan_hash: str, run_name: str, is_leader: bool, leader: int
                   ) -> tuple[int, str]:
    """(first iteration, run name) for every rank: a fresh run's, or the committed checkpoint's."""
    box: list[Any] = [None]
    if is_leader:
        box[0] = _leader_start(options, plan_hash, run_name)
    dist.broadcast_object_list(box, src=leader)
    if "error" in box[0]:
        raise ExecutionError(box[0]["error"])
    return int(box[0]["start"]), box[0]["run"]


def _leader_start(options: RunOptions, plan_hash: str, run_name: str) -> dict[str, Any]:
    if not options.resume:
        return {"start": 0, "run": run_name}
    try:  # the launcher checked the same and warned of any damaged checkpoint it skipped
        start, run, _ = checkpoint.resume_point(options.checkpoint_dir, plan_hash)
    except HetprofError as exc:
        return {"error": str(exc)}
    return {"start": start, "run": run}


def load_units(runners: Mapping[str, RunnerBase], checkpoint_dir: str, start: int, device: torch.device) -> None:
    """Every trained unit on this rank back to its state at iteration `start`."""
    for runner in runners.values():
        for unit in runner.units(lead_only=False):
            path = checkpoint.task_dir(checkpoint_dir, unit) / f"iter-{start:06d}"
            state, _ = checkpoint.load(path, map_location=device)
            runner.load_state(state)


def save_units(runners: Mapping[str, RunnerBase], checkpoint_dir: str, iteration: int, plan_hash: str,
               run_name: str) -> bool:
    """Write the units this rank leads; whether it wrote any (the leader commits when all have).
    Every rank of a unit takes its state, as an FSDP-sharded trainer gathers it collectively."""
    saved = False
    for runner in runners.values():
        leads = set(runner.units(lead_only=True))
        for unit in runner.units(lead_only=False):
            if unit not in leads and not runner.gathers_state():
                continue
            state = runner.state()
            if unit not in leads:
                continue
            checkpoint.save(checkpoint.task_dir(checkpoint_dir, unit), iteration, state,
                            {"plan_hash": plan_hash, "run": run_name, "task": unit},
                            protect=[name] if (name := checkpoint.committed_folder(checkpoint_dir)) else ())
            saved = True
    return saved
