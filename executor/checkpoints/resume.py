"""Where a run starts and what its checkpoints hold, as one rank sees it.

The leader alone decides the starting iteration (0, or the last committed checkpoint's) and the run's
name, and broadcasts both, so every rank resumes from the same point. Each rank saves and loads only
the checkpoint units of its own trained tasks, as their runners name them (runners/trainers.py), and
its own unit (`rank_unit`): together they hold everything the run continues from, so a resumed run
is the uninterrupted run (docs/DESIGN.md, executor: checkpoints).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
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
            path = checkpoint.task_dir(checkpoint_dir, unit) / checkpoint.iteration_folder(start)
            state, _ = checkpoint.load(path, map_location=device)
            _restore(path, runner.load_state, state)


def save_units(runners: Mapping[str, RunnerBase], checkpoint_dir: str, iteration: int, plan_hash: str,
               run_name: str) -> None:
    """Write the trained units this rank leads (the leader commits once every rank has saved).
    Every rank of a unit takes its state, as an FSDP-sharded trainer gathers it collectively."""
    for runner in runners.values():
        leads = set(runner.units(lead_only=True))
        for unit in runner.units(lead_only=False):
            if unit not in leads and not runner.gathers_state():
                continue
            state = runner.state()
            if unit not in leads:
                continue
            _save(checkpoint_dir, unit, iteration, state, {"plan_hash": plan_hash, "run": run_name, "task": unit})


# ---- the rank's own state ----------------------------------------------------------------------------
# Besides the trained units, every rank saves what it continues from that belongs to no model: its
# random generators, the data position, and the rollouts it generated that no update has trained on
# yet (async mode: the k batches in flight). Those are saved, not regenerated: the weights that
# generated them are gone by the checkpoint, and a sampling engine need not repeat itself bitwise.

def rank_unit(rank: int) -> str:
    """The checkpoint unit of rank `rank`'s own state (a folder like a TP/PP trainer's shard's)."""
    return f"ranks/rank-{rank:05d}"


@dataclass(frozen=True)
class RankState:
    """A rank's own state at a checkpoint: the data position (plain JSON) and the rollouts in flight."""

    data: dict[str, Any]
    rollouts: dict[int, dict[str, torch.Tensor]]


def save_rank(checkpoint_dir: str, rank: int, iteration: int, plan_hash: str, run_name: str,
              data: dict[str, Any], rollouts: Mapping[int, Mapping[str, torch.Tensor]],
              runners: Mapping[str, RunnerBase]) -> None:
    """Write rank `rank`'s generators, data position, in-flight rollouts (batches >= `iteration`) and
    its runners' own state."""
    state = {"rng": checkpoint.rng_state(),
             "rollouts": {str(b): {k: t.cpu() for k, t in r.items()} for b, r in rollouts.items() if b >= iteration},
             "runners": {task: own for task, runner in runners.items() if (own := runner.own_state())}}
    _save(checkpoint_dir, rank_unit(rank), iteration, state,
          {"plan_hash": plan_hash, "run": run_name, "rank": rank, "data": data})


def load_rank(checkpoint_dir: str, rank: int, start: int, device: torch.device,
              runners: Mapping[str, RunnerBase]) -> RankState:
    """Rank `rank`'s state at iteration `start`, its random generators and its runners' own state
    restored (after their units: it overrides what a unit's lead saved); a checkpoint without it (or
    with it malformed) is refused naming the file."""
    path = checkpoint.task_dir(checkpoint_dir, rank_unit(rank)) / checkpoint.iteration_folder(start)
    if not path.is_dir():
        raise checkpoint.CheckpointRefused(f"checkpoint {path}: missing; this rank's random generators, data "
                                           f"position and rollouts in flight are saved there")
    state, meta = checkpoint.load(path, map_location="cpu")
    rollouts: dict[int, dict[str, torch.Tensor]] = {}

    def restore() -> None:
        if not isinstance(meta.get("data"), dict) or not isinstance(state.get("rollouts"), dict):
            raise ValueError("expected a data position in meta.json and rollouts in state.pt")
        for batch, tensors in state["rollouts"].items():
            if not (isinstance(batch, str) and batch.isdigit() and int(batch) >= start and isinstance(tensors, dict)
                    and all(isinstance(t, torch.Tensor) for t in tensors.values())):
                raise ValueError(f"rollouts of batch {batch!r:.20}: expected a batch >= {start} and tensors")
            rollouts[int(batch)] = {k: t.to(device) for k, t in tensors.items()}
        own = state.get("runners")
        if not isinstance(own, dict):
            raise ValueError("expected the runners' own state in state.pt")
        for task, runner in runners.items():
            runner.load_own_state(own.get(task, {}))
        checkpoint.set_rng_state(state.get("rng"))

    _restore(path, restore)
    return RankState(data=meta["data"], rollouts=rollouts)


def _save(checkpoint_dir: str, unit: str, iteration: int, state: dict[str, Any], meta: dict[str, Any]) -> None:
    """One unit's checkpoint, never pruning the committed one (a resume's start)."""
    checkpoint.save(checkpoint.task_dir(checkpoint_dir, unit), iteration, state, meta,
                    protect=[name] if (name := checkpoint.committed_folder(checkpoint_dir)) else ())


def _restore(path: Path, apply: Callable[..., None], *args: Any) -> None:
    """Run `apply(*args)` on a loaded state; a state of the wrong shape is refused naming its folder."""
    try:
        apply(*args)
    except HetprofError:
        raise
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError, IndexError) as exc:
        problem = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        raise checkpoint.CheckpointRefused(f"checkpoint {path}: not the state this run resumes from "
                                           f"({type(exc).__name__}: {problem})") from None
