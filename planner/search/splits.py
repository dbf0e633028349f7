"""How far a layout splits each sequence: the Ulysses (`sp`) and context-parallel (`cp`) degrees a task is
tried with, and the `Sharded` value that carries them, with a training layout's sharding, to memory.

Both split every sequence of the training and log-prob passes over several GPUs, so a GPU holds a
share of each sequence's activations: Ulysses over data-parallel ranks (all-to-alls of q, k, v and
the output per layer), context parallelism over a stage's TP groups (ring passes of keys and values).
`search.layouts` picks the degrees per shape, as it picks the sharding.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hetprof.specs import executable
from hetprof.specs.plan import TASKS
from hetprof.specs.vocabulary import TaskKind

if TYPE_CHECKING:
    from hetprof.planner.planning import PlanningContext

MAX_SEQUENCE_SPLIT = 8  # most ranks one sequence is split over (Ulysses, context parallel): a host's GPUs
# How a replica's memory is divided: (dp, sharding) of a training layout's state, then optionally
# (sp, cp, ep): the Ulysses and context-parallel ranks each of its sequences is split over, and the
# expert-parallel ranks an MoE model's routed experts are split over — the order of
# PlanningContext.replica_memory's arguments, so a `Sharded` is passed to it unpacked.
Sharded = tuple


def split_cp(shards: Sharded) -> int:
    """The context-parallel degree a `Sharded` carries (1 when it names none)."""
    return shards[3] if len(shards) > 3 else 1


def sharded(dp: int, sharding: str, sp: int = 1, cp: int = 1, ep: int = 1) -> Sharded:
    """The `Sharded` of a layout: (dp, sharding), with (sp, cp, ep) only when one of them is not 1."""
    return (dp, sharding) if sp == cp == ep == 1 else (dp, sharding, sp, cp, ep)


def sequence_splits(planning: PlanningContext, task: str, tp: int,
                    pp: int = 1) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The Ulysses (sp) and context-parallel (cp) degrees `task` is tried with at TP `tp` and PP `pp`,
    smallest first: 1 alone for generation (a decode step has one token per sequence to split); the
    workload's degree where it fixes one; else the powers of two up to MAX_SEQUENCE_SPLIT, Ulysses's
    dividing the heads a TP rank holds (its all-to-all hands each rank whole heads). A plan for
    `hetprof run` keeps only what the executor carries out (`executable.sequence_parallel_problems`):
    Ulysses on whole-model replicas of packed passes, no context parallelism."""
    if TASKS[task][0] == TaskKind.GENERATION:
        return (1,), (1,)
    training = planning.workload.training
    free = tuple(1 << i for i in range(MAX_SEQUENCE_SPLIT.bit_length()) if 1 << i <= MAX_SEQUENCE_SPLIT)
    model = planning.model_of(task)
    heads = model.heads // tp
    sps = (training.sequence_parallel,) if training.sequence_parallel else tuple(k for k in free if heads % k == 0)
    cps = (training.context_parallel,) if training.context_parallel else free
    if planning.executable:
        packed = training.max_tokens_per_microbatch is not None
        kind = TASKS[task][0]
        sps = tuple(k for k in sps if not executable.sequence_parallel_problems(task, kind, model, k, tp, pp,
                                                                                 packed, "")) or (1,)
        cps = (1,)
    return sps, cps
