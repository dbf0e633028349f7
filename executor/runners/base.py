"""The TaskRunner protocol: what the loop, weight sync and checkpoints ask of the runner of one task.

A runner owns its task's model, its placement (the task's ranks) and, for a trainer, its learner.
The loop calls `run` with the task's input; the timing wrapper (loop/timing.py) asks `spans` and
`priced` what to record. Weight sync asks a trainer (`sync_model`, `full_weights`) and a copy's
runner (`sync_model`, `sync_target`, `apply_weights`, `weights_arrived`); checkpoints and exports
ask every runner for its `units` (a trainer's `state`, `load_state`). `RunnerBase` answers "nothing
here" for everything a family does not own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import torch

from hetprof.errors import ExecutionError
from hetprof.executor.parallel.experts import shard_experts
from hetprof.executor.parallel.sharded import ShardedModel
from hetprof.executor.parallel.topology import TaskRanks
from hetprof.executor.parallel.weightsync import flatten_params
from hetprof.executor.runners.context import RankContext
from hetprof.runtime.ulysses import ULYSSES_ATTENTION, SequenceParallel
from hetprof.runtime.varlen_attention import VARLEN_ATTENTION

Tensors = dict[str, torch.Tensor]
WorkTiming = dict[str, Any]  # one priced unit of work and its seconds (records/iteration_report.py)


@runtime_checkable
class TaskRunner(Protocol):
    task: str
    placement: TaskRanks  # the task's ranks: its replicas, shares, stages
    module: torch.nn.Module | None  # the model it owns (None: it uses another runner's)
    reports: bool  # whether this rank reports its replica's work (the replica's first rank)

    def run(self, work: Any) -> Any:
        """The task's work on this rank's share of a batch."""

    def spans(self, result: Any, start: float, end: float) -> dict[str, tuple[float, float]]:
        """The tasks `run` did, each with its (start, end) perf_counter span."""

    def priced(self, work: Any, result: Any, seconds: dict[str, float]) -> dict[str, list[WorkTiming]]:
        """The work done in the plan's priced units, per task, with its measured seconds."""

    def close(self) -> None: ...

    def full_weights(self) -> Tensors | None: ...

    def sync_model(self) -> torch.nn.Module: ...

    def sync_target(self) -> torch.nn.Module: ...

    def apply_weights(self) -> Callable[[Tensors], Any]: ...

    def weights_arrived(self) -> dict[str, float]: ...

    def units(self, lead_only: bool) -> list[str]: ...

    def own_state(self) -> dict[str, Any]: ...

    def load_own_state(self, state: dict[str, Any]) -> None: ...


class RunnerBase:
    """Defaults for a runner: a task on this rank's ranks that owns no synced or checkpointed model."""

    module: torch.nn.Module | None = None
    after: tuple[str, ...] = ()  # tasks whose runners this one uses, so built first on its rank

    def __init__(self, ctx: RankContext, task: str, peers: Mapping[str, RunnerBase]) -> None:
        """`peers`: the runners already built on this rank (those of `after` among them)."""
        self.ctx = ctx
        self.task = task
        self.placement = ctx.placement(task)

    @property
    def replica(self) -> int:
        return self.placement.replica_of(self.ctx.rank)

    @property
    def reports(self) -> bool:
        """A replica reports its work once, by its first rank; a Ulysses group (its `sp` replicas ran
        the same rows together) by its first replica's."""
        tr = self.placement
        return self.ctx.rank == tr.batch_leads[tr.batch_group_of(self.ctx.rank)]

    @property
    def sequence_parallel(self) -> SequenceParallel | None:
        """This rank's Ulysses group when the plan splits the task's sequences over `sp` replicas."""
        tr = self.placement
        if tr.sp == 1:
            return None
        return SequenceParallel.of(self.ctx.groups.sequence(self.task, tr.batch_group_of(self.ctx.rank)))

    @property
    def pack_tokens(self) -> int | None:
        """Tokens per packed forward (None: padded): the workload's budget per rank, so a Ulysses
        group's pack holds `sp` times it, each rank a slice of at most the budget."""
        budget = self.ctx.workload.training.max_tokens_per_microbatch
        return budget * self.placement.sp if budget is not None else None

    @property
    def attention(self) -> str:
        """The attention the task's models are built with: Ulysses' where its sequences are split."""
        return ULYSSES_ATTENTION if self.placement.sp > 1 else VARLEN_ATTENTION

    def spans(self, result: Any, start: float, end: float) -> dict[str, tuple[float, float]]:
        return {self.task: (start, end)}

    def priced(self, work: Any, result: Any, seconds: dict[str, float]) -> dict[str, list[WorkTiming]]:
        return {}

    def close(self) -> None:
        pass

    # ---- weight sync: the sending trainer ------------------------------------------------------------
    def full_weights(self) -> Tensors | None:
        """A sharded trainer's full weights (a collective of its replicas); None where already full."""
        return None

    def sync_model(self) -> torch.nn.Module:
        """The module whose parameters a sync edge sends (trainer) or overwrites (copy): full names
        and shapes (a pipeline stage's meta skeleton where the task is pipelined)."""
        raise ExecutionError(f"weight sync: this rank holds no {self.task} model")

    # ---- weight sync: the receiving copy ------------------------------------------------------------
    def sync_target(self) -> torch.nn.Module:
        """The module a received sync lands in (names and shapes; flattened buckets written in place)."""
        raise ExecutionError(f"weight sync: {self.task} holds no copy a sync overwrites")

    def apply_weights(self) -> Callable[[Tensors], Any]:
        raise ExecutionError(f"weight sync: {self.task} holds no copy a sync overwrites")

    def weights_arrived(self) -> dict[str, float]:
        """After a sync landed: the engine's checks of the new weights (none by default)."""
        return {}

    # ---- checkpoints -------------------------------------------------------------------------------
    def units(self, lead_only: bool) -> list[str]:
        """Checkpoint units this rank holds (writes, with `lead_only`); none for an untrained task."""
        return []

    def own_state(self) -> dict[str, Any]:
        """What this rank's part of the task continues from that no checkpoint unit holds (saved with
        the rank's own state, checkpoints/resume.py); nothing by default."""
        return {}

    def load_own_state(self, state: dict[str, Any]) -> None:
        """The state `own_state` took on this rank."""


def place(ctx: RankContext, task: str, model: torch.nn.Module, head: str, flatten: bool = True
          ) -> tuple[torch.nn.Module, ShardedModel | None]:
    """Shard a generation/inference model over its replica's TP ranks and pipeline stages, or its
    experts over its EP group (whole-model replicas; the task runs its passes in
    experts.expert_lockstep), or (one device) lay its weights out flat so weight syncs land in
    place. `head`: "lm" or "value"."""
    tr = ctx.placement(task)
    if tr.tp_of(tr.replica_of(ctx.rank)) > 1 or tr.pp > 1:  # this rank's replica is TP- or PP-sharded
        sharded = ShardedModel(model, ctx.topo, ctx.groups, task, ctx.rank, ctx.device, head)
        return sharded.module, sharded
    if tr.ep > 1:  # no weight sync lands in an EP copy (hetprof.specs.executable refuses one)
        shard_experts(model, ctx.groups.experts(task, tr.expert_group_of(ctx.rank)))
        return model, None
    if flatten:
        flatten_params(model, ctx.options.bucket_mb)
    return model, None
