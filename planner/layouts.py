"""Parallel layouts of one task on one device set, balanced to the speed of each device.

A search decides *which* devices a task runs on and in what order; this module turns that into
a concrete DP × TP × PP layout. The order matters: devices are cut into tensor-parallel groups
inside one host (TP all-reduces every layer, so it never crosses a host), consecutive TP groups
form the stages of one pipeline replica, and whatever does not fill a whole group or replica is
left out. Heterogeneous replicas then get batch shares and layer splits balanced with the
simulator's own `replica_seconds`, so a slow stage holds fewer layers and a slow replica fewer
sequences — the two balancing levers HetRL's tasklet level adds over homogeneous systems.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from hetprof import catalog
from hetprof.errors import InfeasibleError
from hetprof.models import ModelShape
from hetprof.planner.candidate import TaskLayout
from hetprof.specs.plan import TASKS

if TYPE_CHECKING:
    from hetprof.planner.simulator import Simulator

MAX_LAYER_MOVES = 64


@dataclasses.dataclass(frozen=True, order=True)
class Shape:
    """A layout's degrees: tensor-parallel `tp`, pipeline `pp`, and `dp` replicas."""

    tp: int
    pp: int
    dp: int

    def __str__(self) -> str:
        return f"DP{self.dp}×TP{self.tp}×PP{self.pp}"


def task_model(sim: Simulator, task: str) -> ModelShape:
    """The model a task runs (its role's shape in the workload)."""
    return sim.graph.model_of(task)


def task_batch(sim: Simulator) -> int:
    """Sequences every task handles per iteration (prompts × responses)."""
    return int(sim.workload.sequences_per_step)


def canonical_order(sim: Simulator, devices: Iterable[str]) -> tuple[str, ...]:
    """A deterministic, locality-first device order: region, then host, then index.

    Hosts of one region are adjacent, so consecutive TP groups (the stages of one pipeline
    replica) sit on the same host or the same region whenever the device set allows it.
    """
    devs = sim.devices
    return tuple(sorted(devices, key=lambda d: (devs[d].region, devs[d].host, devs[d].index)))


def tp_groups(sim: Simulator, order: Sequence[str], tp: int) -> list[tuple[str, ...]]:
    """Cut an ordered device list into same-host groups of `tp`, in the order they complete.

    Walking the order, a host's devices wait until `tp` of them have appeared; the group then
    takes its place. With tp = 1 the groups follow the order exactly, so the order alone decides
    which GPUs become the stages of one pipeline replica.
    """
    pending: dict[str, list[str]] = {}
    groups = []
    for d in order:
        waiting = pending.setdefault(sim.devices[d].host, [])
        waiting.append(d)
        if len(waiting) == tp:
            groups.append(tuple(waiting))
            waiting.clear()
    return groups


def arrange(sim: Simulator, order: Sequence[str], tp: int, pp: int) -> list[tuple[str, ...]]:
    """Replicas (tp·pp device ids each, stage-major) from an ordered device list."""
    groups = tp_groups(sim, order, tp)
    dp = len(groups) // pp
    return [tuple(d for g in groups[r * pp:(r + 1) * pp] for d in g) for r in range(dp)]


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def feasible_shapes(sim: Simulator, task: str, devices: Sequence[str], max_tp: int = 8,
                    max_pp: int = 4) -> list[Shape]:
    """Every TP×PP×DP the device set can host: TP divides the heads and fits in a host, PP ≤ layers.

    DP is the most replicas the set holds for that TP×PP (more replicas never cost memory and
    only add gradient traffic, which the simulator weighs); memory is left to the simulator.
    """
    per_host: dict[str, int] = {}
    for d in devices:
        per_host[sim.devices[d].host] = per_host.get(sim.devices[d].host, 0) + 1
    return shapes_for_hosts(task_model(sim, task), tuple(per_host.values()), max_tp, max_pp)


def shapes_for_hosts(model: ModelShape, per_host: Sequence[int], max_tp: int = 8, max_pp: int = 4) -> list[Shape]:
    """feasible_shapes from the number of devices on each host (all that decides them)."""
    biggest = max(per_host, default=0)
    shapes = []
    for tp in divisors(model.heads):
        if tp > max_tp or tp > biggest:
            continue
        groups = sum(n // tp for n in per_host)
        for pp in range(1, min(max_pp, model.layers) + 1):
            if groups // pp >= 1:
                shapes.append(Shape(tp, pp, groups // pp))
    return shapes


# ---- balancing -----------------------------------------------------------------------------------

def _replica_seconds(sim: Simulator, task: str, devices: tuple[str, ...], tp: int, pp: int, batch: int,
                     split: tuple[int, ...] | None) -> float:
    try:
        t = sim.replica_seconds(task, devices, tp, pp, batch, split)
    except InfeasibleError:
        return math.inf
    return float(t) if t is not None and t == t else math.inf


def _overflow(sim: Simulator, task: str, replica: tuple[str, ...], tp: int, split: Sequence[int], batch: int) -> float:
    """Bytes by which the replica's stages exceed their GPUs' memory at this batch (0 if it fits)."""
    over = 0.0
    for s, layers in enumerate(split):
        dev = sim.devices[replica[s * tp]]
        need = sim.costs.memory(task, dev.type, tp, layers, max(1, batch)).total
        over += max(0.0, need - catalog.lookup(dev.type).memory_bytes)
    return over


def _type_speed(device_type: str, kind: str) -> float:
    """A datasheet speed proxy that only seeds the balancing (decode is bandwidth-bound)."""
    gpu = catalog.lookup(device_type)
    return gpu.hbm_Bps if kind == "generation" else gpu.peak_flops("bf16")


def _proportional(total: int, weights: Sequence[float], minimum: int = 1) -> list[int]:
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


def balance_layers(sim: Simulator, task: str, replica: tuple[str, ...], tp: int, pp: int,
                   batch: int) -> tuple[int, ...]:
    """Layers per stage for one replica: seeded by device speed, then improved one layer at a time."""
    layers = task_model(sim, task).layers
    if pp == 1:
        return (layers,)
    kind = TASKS[task][0]
    stage_types = [sim.devices[replica[s * tp]].type for s in range(pp)]
    split = _proportional(layers, [_type_speed(t, kind) for t in stage_types])

    def judge(candidate: Sequence[int]) -> tuple[float, float]:
        return (_overflow(sim, task, replica, tp, candidate, batch),
                _replica_seconds(sim, task, replica, tp, pp, batch, tuple(candidate)))

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
                score = judge(trial)
                if score < best and (improved is None or score < improved[0]):
                    improved = (score, trial)
        if improved is None:
            break
        best, split = improved
    return tuple(split)


def _replica_key(sim: Simulator, replica: tuple[str, ...], tp: int, pp: int) -> tuple:
    """Replicas with equal device types and equal stage-to-stage links behave identically."""
    types = tuple(sim.devices[d].type for d in replica)
    hops = []
    for s in range(1, pp):
        a, b = sim.devices[replica[(s - 1) * tp]], sim.devices[replica[s * tp]]
        hops.append((a.host == b.host, a.region == b.region))
    hosts = tuple(len({sim.devices[d].host for d in replica[s * tp:(s + 1) * tp]}) for s in range(pp))
    return types, tuple(hops), hosts


def _capacity(seconds_at, limit: float, total: int) -> int:
    """Most sequences (0..total) a replica finishes within `limit` (its time grows with batch)."""
    lo, hi = 0, total
    while lo < hi:
        mid = (lo + hi + 1) // 2
        t = seconds_at(mid)
        if t <= limit and math.isfinite(t):
            lo = mid
        else:
            hi = mid - 1
    return lo


def balance_shares(seconds_at: Sequence, total: int, iterations: int = 40) -> list[int] | None:
    """Sequences per replica minimising the slowest replica's time (min-max, integer).

    `seconds_at[i](b)` is replica i's time for b sequences. Generation time is far from linear in
    the batch (decode is bandwidth-bound and the longest response sets the pace), so shares are
    not proportional to speed: the finishing time T is bisected and each replica takes as many
    sequences as it can finish by T. A replica too slow for even one sequence by the optimal T
    gets none (the caller drops it rather than let it straggle). Times are infinite where a
    batch does not fit in memory; None if the replicas cannot hold the batch at all.
    """
    n = len(seconds_at)
    if n == 0:
        return []
    most = [_capacity(f, math.inf, total) for f in seconds_at]   # what fits in memory at all
    if sum(most) < total:
        return None
    hi = max(seconds_at[i](m) for i, m in enumerate(most) if m)
    lo = 0.0
    for _ in range(iterations):
        mid = (lo + hi) / 2
        if sum(_capacity(f, mid, total) for f in seconds_at) >= total:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-6 * hi:
            break
    counts = [_capacity(f, hi, total) for f in seconds_at]
    surplus = sum(counts) - total
    while surplus > 0:
        # take the surplus from whoever is slowest at its current load
        i = max((j for j in range(n) if counts[j] > 0), key=lambda j: (seconds_at[j](counts[j]), -j))
        counts[i] -= 1
        surplus -= 1
    return counts


def build_layout(sim: Simulator, task: str, order: Sequence[str], tp: int, pp: int,
                 balanced: bool = True) -> TaskLayout | None:
    """The layout of `task` with degrees tp×pp on devices taken in `order`; None if none fits.

    balanced=False gives what a heterogeneity-unaware system does: equal layer splits and
    equal batch shares.
    """
    return balanced_layout(sim, task, arrange(sim, order, tp, pp), tp, pp, balanced)


def balanced_layout(sim: Simulator, task: str, replicas: Sequence[tuple[str, ...]], tp: int, pp: int,
                    balanced: bool = True) -> TaskLayout | None:
    """A layout over given replicas with balanced (or, balanced=False, equal) layer splits and shares."""
    replicas = list(replicas)
    if not replicas:
        return None
    model = task_model(sim, task)
    if pp > model.layers:
        return None
    total = task_batch(sim)
    if total < len(replicas):
        replicas = replicas[:total]
    dp = len(replicas)
    if not balanced:
        split = tuple(_proportional(model.layers, [1.0] * pp))
        counts = _proportional(total, [1.0] * dp)
        return TaskLayout(task=task, tp=tp, pp=pp, replicas=tuple(replicas),
                          shares=tuple(c / total for c in counts), layer_splits=tuple(split for _ in replicas))
    nominal = max(1, total // dp)
    splits_by_key: dict[tuple, tuple[int, ...]] = {}
    splits = []
    for r in replicas:
        key = _replica_key(sim, r, tp, pp)
        if key not in splits_by_key:
            splits_by_key[key] = balance_layers(sim, task, r, tp, pp, nominal)
        splits.append(splits_by_key[key])

    def timer(r: tuple[str, ...], split: tuple[int, ...]):
        def seconds(b: int) -> float:
            if b <= 0:
                return 0.0
            if _overflow(sim, task, r, tp, split, b) > 0:
                return math.inf
            return _replica_seconds(sim, task, r, tp, pp, b, split)
        return functools.lru_cache(maxsize=None)(seconds)

    timers = []
    shared: dict[tuple, object] = {}
    for r, split in zip(replicas, splits, strict=True):
        key = (_replica_key(sim, r, tp, pp), split)
        if key not in shared:
            shared[key] = timer(r, split)
        timers.append(shared[key])
    counts = balance_shares(timers, total)
    if counts is None:
        return None
    keep = [i for i, c in enumerate(counts) if c > 0]
    return TaskLayout(task=task, tp=tp, pp=pp, replicas=tuple(replicas[i] for i in keep),
                      shares=tuple(counts[i] / total for i in keep), layer_splits=tuple(splits[i] for i in keep))


def layout_seconds(sim: Simulator, layout: TaskLayout) -> float:
    """The layout's task time as its slowest replica (no DP traffic, no colocation effects)."""
    total = task_batch(sim)
    worst = 0.0
    for r, share, split in zip(layout.replicas, layout.shares, layout.layer_splits, strict=True):
        worst = max(worst, _replica_seconds(sim, layout.task, tuple(r), layout.tp, layout.pp,
                                            max(1, round(share * total)), tuple(split)))
    return worst


def layout_cost(sim: Simulator, layout: TaskLayout) -> float:
    """The task's own seconds on this layout (gradient sync included), inf if it alone overflows memory."""
    judged = sim.task_eval(layout)
    return math.inf if judged.violations else float(judged.seconds)


def best_layout(sim: Simulator, task: str, devices: Sequence[str], max_tp: int = 8, max_pp: int = 4,
                order: Sequence[str] | None = None) -> TaskLayout | None:
    """The fastest balanced layout of `task` on `devices` by its replicas' time, or None if none fits."""
    order = tuple(order) if order is not None else canonical_order(sim, devices)
    best, best_t = None, math.inf
    for shape in feasible_shapes(sim, task, order, max_tp, max_pp):
        layout = build_layout(sim, task, order, shape.tp, shape.pp)
        if layout is None:
            continue
        t = layout_cost(sim, layout)
        if t < best_t:
            best, best_t = layout, t
    return best
