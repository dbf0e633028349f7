"""One replica kind of a task: its seconds and memory at a batch, its layers balanced over its
stages, and its time curve over batch sizes — what `search.layouts` balances a layout's replicas with.

Replicas with the same device types and links behave alike (`replica_key`), so a search that builds
thousands of layouts from the same kinds shares their splits and curves through a memo.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from hetprof.errors import InfeasibleError
from hetprof.planner.balance import Curve
from hetprof.planner.search.splits import Sharded, split_cp
from hetprof.specs import catalog
from hetprof.specs.models import ModelShape
from hetprof.specs.plan import TASKS
from hetprof.specs.vocabulary import TaskKind

if TYPE_CHECKING:
    from hetprof.planner.planning import PlanningContext

MAX_LAYER_MOVES = 8


def task_model(planning: PlanningContext, task: str) -> ModelShape:
    """The model a task runs (its role's shape in the workload)."""
    return planning.model_of(task)


def task_batch(planning: PlanningContext) -> int:
    """Sequences every task handles per iteration (prompts × responses)."""
    return int(planning.workload.sequences_per_step)


def replica_time(planning: PlanningContext, task: str, devices: tuple[str, ...], tp: int, pp: int, batch: int,
                     split: tuple[int, ...] | None, cp: int = 1) -> float:
    try:
        t = planning.replica_seconds(task, devices, tp, pp, batch, split, *((cp,) if cp > 1 else ()))
    except InfeasibleError:
        return math.inf
    return float(t) if t is not None and t == t else math.inf


def replica_overflow(planning: PlanningContext, task: str, replica: tuple[str, ...], tp: int, split: Sequence[int], batch: int,
                     shards: Sharded = (1, "none")) -> float:
    """Bytes by which the replica's stages exceed their GPUs' memory at this batch (0 if it fits);
    `shards` is (dp, sharding): how a training replica's state is sharded over its peers."""
    over = 0.0
    width = tp * split_cp(shards)  # a stage's devices: tp × cp
    for s, layers in enumerate(split):
        dev = planning.devices[replica[s * width]]
        need = planning.replica_memory(task, dev.type, tp, layers, max(1, batch), *shards).total
        over += max(0.0, need - planning.catalog.lookup(dev.type).memory_bytes)
    return over


def _type_speed(gpu: catalog.GpuType, kind: str) -> float:
    """A datasheet speed proxy that only seeds the balancing (decode is bandwidth-bound)."""
    return gpu.hbm_Bps if kind == TaskKind.GENERATION else gpu.peak_flops("bf16")


def proportional(total: int, weights: Sequence[float], minimum: int = 1) -> list[int]:
    """Integers summing to `total`, each ≥ minimum, proportional to weights (largest remainder)."""
    n = len(weights)
    spare = total - minimum * n
    if spare < 0:
        raise ValueError(f"cannot split {total} into {n} parts of at least {minimum}")
    wsum = sum(weights) or 1.0
    raw = [spare * w / wsum for w in weights]
    base = [int(math.floor(x)) for x in raw]
    left = spare - sum(base)
    order = sorted(range(n), key=lambda i: (raw[i] - base[i], -i), reverse=True)
    for i in order[:left]:
        base[i] += 1
    return [b + minimum for b in base]


def balance_layers(planning: PlanningContext, task: str, replica: tuple[str, ...], tp: int, pp: int,
                   batch: int, shards: Sharded = (1, "none")) -> tuple[int, ...]:
    """Layers per stage for one replica: seeded by device speed, then improved one layer at a time."""
    layers = task_model(planning, task).layers
    if pp == 1:
        return (layers,)
    kind = TASKS[task][0]
    cp = split_cp(shards)
    stage_types = [planning.devices[replica[s * tp * cp]].type for s in range(pp)]
    split = proportional(layers, [_type_speed(planning.catalog.lookup(t), kind) for t in stage_types])

    def judge(candidate: Sequence[int], bar: float = math.inf) -> tuple[float, float]:
        """(bytes over memory, seconds); seconds are not priced when the overflow alone exceeds `bar`
        (a split overflowing more than the best one loses whatever its time)."""
        overflow = replica_overflow(planning, task, replica, tp, candidate, batch, shards)
        if overflow > bar:
            return overflow, math.inf
        if kind == TaskKind.GENERATION:  # stage balance from one pipelined call, not a whole engine run per trial
            seconds = planning.pipeline_seconds(task, replica, tp, pp, min(batch, planning.workload.generation.max_num_seqs),
                                                 candidate)
        else:
            seconds = replica_time(planning, task, replica, tp, pp, batch, tuple(candidate), cp)
        return overflow, seconds

    best = judge(split)
    for _ in range(MAX_LAYER_MOVES):
        improved = None
        for i in range(pp):
            if split[i] <= 1:
                continue
            for j in range(pp):
                if i == j:
                    continue
                trial = list(split)
                trial[i] -= 1
                trial[j] += 1
                score = judge(trial, best[0])
                if score < best and (improved is None or score < improved[0]):
                    improved = (score, trial)
        if improved is None:
            break
        best, split = improved
    return tuple(split)


def replica_key(planning: PlanningContext, replica: tuple[str, ...], tp: int, pp: int, memo: dict | None = None,
                 cp: int = 1) -> tuple:
    """Replicas with equal device types and equal stage-to-stage links behave identically (a stage:
    its tp × cp devices)."""
    if memo is not None:
        hit = memo.get(("kind", replica, tp, pp, cp))
        if hit is None:
            hit = memo[("kind", replica, tp, pp, cp)] = replica_key(planning, replica, tp, pp, cp=cp)
        return hit
    w = tp * cp
    types = tuple(planning.devices[d].type for d in replica)
    hops = []
    for s in range(1, pp):
        a, b = planning.devices[replica[(s - 1) * w]], planning.devices[replica[s * w]]
        hops.append((a.host == b.host, a.region == b.region))
    hosts = tuple(len({planning.devices[d].host for d in replica[s * w:(s + 1) * w]}) for s in range(pp))
    return types, tuple(hops), hosts


def replica_curve(planning: PlanningContext, task: str, replica: tuple[str, ...], tp: int, pp: int,
                  split: tuple[int, ...], total: int, shards: Sharded, memo: dict) -> Curve:
    """The time curve of `replica`, shared with every replica that is priced exactly alike: the same
    stage signature (what decides its seconds), the same stage GPU types (what decides its memory),
    and shards that size its memory alike (sharding none holds the same at any dp). A curve is
    the same numbers whichever such replica built it, so sharing changes no layout, only the work."""
    cp = split_cp(shards)
    first_types = tuple(planning.devices[replica[s * tp * cp]].type for s in range(pp))
    held = (1, "none", *shards[2:]) if shards[1] == "none" or shards[0] == 1 else shards
    signature = planning.stage_signature(replica, tp, pp, *((cp,) if cp > 1 else ()))
    key = ("exact-curve", task, signature, first_types, tp, pp, split, total, held)
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = Curve(_Timer(planning, task, replica, tp, pp, split, shards), total)
    return hit


class _Timer:
    """One replica kind's seconds at a batch, and whether that batch fits its GPUs' memory."""

    def __init__(self, planning: PlanningContext, task: str, replica: tuple[str, ...], tp: int, pp: int,
                 split: tuple[int, ...], shards: Sharded = (1, "none")) -> None:
        self.planning, self.task, self.replica, self.tp, self.pp, self.split = planning, task, replica, tp, pp, split
        self.shards = shards
        self._fits: dict[int, bool] = {}

    def fits(self, b: int) -> bool:
        hit = self._fits.get(b)
        if hit is None:
            hit = self._fits[b] = replica_overflow(self.planning, self.task, self.replica, self.tp, self.split, b,
                                                   self.shards) <= 0
        return hit

    def __call__(self, b: int) -> float:
        if b <= 0:
            return 0.0
        if not self.fits(b):
            return math.inf
        return replica_time(self.planning, self.task, self.replica, self.tp, self.pp, b, self.split, split_cp(self.shards))
