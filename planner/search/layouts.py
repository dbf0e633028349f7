"""Parallel layouts of one task on one device set, balanced to the speed of each device.

A search decides *which* devices a task runs on and in what order; this module turns that into
a concrete DP × TP × PP layout. The order matters: devices are cut into tensor-parallel groups
inside one NVLink domain (TP all-reduces every layer, so it never leaves NVLink: one host, or the
hosts a cluster spec joins into one domain, like a GB200 NVL72's trays), consecutive TP groups
form the stages of one pipeline replica, and whatever does not fill a whole group or replica is
left out. Heterogeneous replicas then get batch shares and layer splits balanced with the
simulator's own `replica_seconds`, so a slow stage holds fewer layers and a slow replica fewer
sequences — the two balancing levers HetRL's tasklet level adds over homogeneous systems.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from hetprof.planner.balance import Curve, balance_shares, largest_batch_within  # noqa: F401 (re-exported)
from hetprof.planner.candidate import megatron_order
from hetprof.planner.search.experts import expert_degrees, expert_tp_choices, runs_refused
from hetprof.planner.search.replica_kinds import (
    balance_layers,
    proportional,
    replica_curve,
    replica_key,
    replica_time,
    task_batch,
    task_model,
)
from hetprof.planner.search.splits import sequence_splits, sharded
from hetprof.specs import executable
from hetprof.specs.layout import TaskLayout
from hetprof.specs.plan import TASKS
from hetprof.specs.vocabulary import TaskKind

if TYPE_CHECKING:
    from hetprof.planner.planning import PlanningContext



@dataclasses.dataclass(frozen=True, order=True)
class DegreeOption:
    """A point of the search space before devices are chosen: degrees tensor-parallel `tp` and
    pipeline `pp` a device set can host, and the most replicas `dp` it then holds. Not a layout
    (hetprof.specs.TaskLayout): it names no device, share, split or sharding; a search picks
    among options and `build_layout` turns the chosen one into a layout on ordered devices."""

    tp: int
    pp: int
    dp: int

    def __str__(self) -> str:
        return f"DP{self.dp}×TP{self.tp}×PP{self.pp}"


def canonical_order(planning: PlanningContext, devices: Iterable[str]) -> tuple[str, ...]:
    """A deterministic, locality-first device order: region, then host, then index.

    Hosts of one region are adjacent, so consecutive TP groups (the stages of one pipeline
    replica) sit on the same host or the same region whenever the device set allows it.
    """
    devs = planning.devices
    return tuple(sorted(devices, key=lambda d: (devs[d].region, devs[d].host, devs[d].index)))


def tp_groups(planning: PlanningContext, order: Sequence[str], tp: int) -> list[tuple[str, ...]]:
    """Cut an ordered device list into same-NVLink-domain groups of `tp`, in the order they complete.

    Walking the order, a domain's devices (a host's, unless the spec joins hosts into one NVLink
    domain) wait until `tp` of them have appeared; the group then takes its place. With tp = 1 the
    groups follow the order exactly, so the order alone decides which GPUs become the stages of one
    pipeline replica.
    """
    pending: dict[str, list[str]] = {}
    groups = []
    for d in order:
        waiting = pending.setdefault(planning.devices[d].nvlink_domain, [])
        waiting.append(d)
        if len(waiting) == tp:
            groups.append(tuple(waiting))
            waiting.clear()
    return groups


def arrange(planning: PlanningContext, order: Sequence[str], tp: int, pp: int, cp: int = 1) -> list[tuple[str, ...]]:
    """Replicas (tp·cp·pp device ids each, stage-major: a stage is cp consecutive TP groups) from an
    ordered device list."""
    groups = tp_groups(planning, order, tp)
    per = pp * cp
    dp = len(groups) // per
    return [tuple(d for g in groups[r * per:(r + 1) * per] for d in g) for r in range(dp)]


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def degree_limits(planning: PlanningContext, task: str, max_tp: int = 8, max_pp: int = 4) -> tuple[tuple[int, ...], int]:
    """The TP degrees and the most pipeline stages `task` may have: TP divides the heads, PP ≤ the
    layers, and — when the simulator plans for `hetprof run` (`planning.executable`) — only what the
    executor carries out (hetprof/specs/executable.py: no stages for generation or critic inference,
    TP dividing the KV heads and the FFN width too, none for an MoE model's training and forward passes)."""
    model = task_model(planning, task)
    tps = tuple(tp for tp in divisors(model.heads) if tp <= max_tp)
    stages = min(max_pp, model.layers)
    if planning.executable:
        sliced = model.moe is not None and TASKS[task][0] != TaskKind.GENERATION  # its TP splits dense MLPs only
        tps = tuple(tp for tp in tps if executable.tp_divides(model, tp) and not (sliced and tp > 1))
        stages = stages if executable.may_pipeline(task) else 1
    return tps, stages


def feasible_shapes(planning: PlanningContext, task: str, devices: Sequence[str], max_tp: int = 8,
                    max_pp: int = 4) -> list[DegreeOption]:
    """Every TP×PP×DP the device set can host within `degree_limits`, TP within an NVLink domain.

    DP is the most replicas the set holds for that TP×PP (more replicas never cost memory and
    only add gradient traffic, which the simulator weighs); memory is left to the simulator.
    """
    per_domain: dict[str, int] = {}
    for d in devices:
        domain = planning.devices[d].nvlink_domain
        per_domain[domain] = per_domain.get(domain, 0) + 1
    return shapes_for_hosts(tuple(per_domain.values()), *degree_limits(planning, task, max_tp, max_pp))


def shapes_for_hosts(per_host: Sequence[int], tps: Sequence[int], stages: int) -> list[DegreeOption]:
    """feasible_shapes from the number of devices in each NVLink domain (each host, unless the spec
    joins hosts into one): all that decides them."""
    biggest = max(per_host, default=0)
    shapes = []
    for tp in tps:
        if tp > biggest:
            continue
        groups = sum(n // tp for n in per_host)
        for pp in range(1, stages + 1):
            if groups // pp >= 1:
                shapes.append(DegreeOption(tp, pp, groups // pp))
    return shapes


def build_layout(planning: PlanningContext, task: str, order: Sequence[str], tp: int, pp: int,
                 balanced: bool = True, memo: dict | None = None) -> TaskLayout | None:
    """The layout of `task` with degrees tp×pp on devices taken in `order`; None if none fits.

    balanced=False gives what a heterogeneity-unaware system does: equal layer splits and
    equal batch shares. `memo` (a dict the caller keeps) shares layer splits and time curves
    of replica kinds across calls: a search builds thousands of layouts from the same kinds.
    Context parallelism is tried in rising degree until a layout fits: it computes what cp replicas
    would plus a ring, so it pays only where memory asks; none fitting, the unsplit layout says why."""
    cps = sequence_splits(planning, task, tp, pp)[1]
    first = None
    for cp in cps:
        layout = balanced_layout(planning, task, arrange(planning, order, tp, pp, cp), tp, pp, balanced, memo, cp)
        first = layout if cp == cps[0] else first
        if len(cps) == 1 or (layout is not None and math.isfinite(layout_cost(planning, layout))):
            return layout
    return first


def balanced_layout(planning: PlanningContext, task: str, replicas: Sequence[tuple[str, ...]], tp: int, pp: int,
                    balanced: bool = True, memo: dict | None = None, cp: int = 1) -> TaskLayout | None:
    """A layout over given replicas (stages of tp × `cp` devices) with balanced (or, balanced=False,
    equal) layer splits and shares.

    A training task with several replicas also gets its sharding (`sharding_levels`): the fastest
    level whose layout fits, and of equally fast ones the one sharding least — ZeRO-1/2 move the
    same bytes as DDP, so they are chosen when DDP's state does not fit; FSDP when its overlapped
    traffic beats DDP's exposed all-reduce or nothing less fits. A training or forward pass also
    gets its Ulysses degree (`sequence_splits`, dividing its replicas) the same way: the fastest,
    and of equally fast ones the smallest.
    """
    memo = {} if memo is None else memo
    replicas = list(replicas)
    if not replicas:
        return None
    if pp > task_model(planning, task).layers:
        return None
    replicas = replicas[:task_batch(planning)]
    levels = sharding_levels(planning, task, len(replicas), tp, pp)
    degrees = expert_degrees(planning, task, replicas, tp, pp)
    if len(degrees) > 1 or len(expert_tp_choices(planning, task, tp)) > 1:
        return _expert_layout(planning, task, replicas, tp, pp, balanced, memo, levels, degrees, cp)
    sps = [k for k in sequence_splits(planning, task, tp, pp)[0] if len(replicas) % k == 0] or [1]
    # Balanced once at the level holding least (sharding moves no replica's compute, only what fits), then
    # each level judged on those; at the largest Ulysses degree when the smallest fits nowhere (alike).
    base = _layout_at(planning, task, replicas, tp, pp, balanced, memo, levels[-1], sps[0], cp)
    if len(sps) > 1 and (base is None or not math.isfinite(layout_cost(planning, base))):
        base = _layout_at(planning, task, replicas, tp, pp, balanced, memo, levels[-1], sps[-1], cp)
    if base is None:
        return None
    options = [(sp, level) for sp in sps if base.dp % sp == 0 for level in (levels if base.dp > 1 else ("none",))]
    if len(options) == 1:
        return dataclasses.replace(base, sp=options[0][0], sharding=options[0][1])
    best, best_t = base, math.inf
    for sp, level in options:
        layout = dataclasses.replace(base, sharding=level, sp=sp)
        t = layout_cost(planning, layout)
        if t < best_t * (1 - 1e-9):
            best, best_t = layout, t
    return best


def _expert_layout(planning: PlanningContext, task: str, replicas: list[tuple[str, ...]], tp: int, pp: int,
                   balanced: bool, memo: dict, levels: tuple[str, ...], degrees: tuple[int, ...],
                   cp: int = 1) -> TaskLayout | None:
    """balanced_layout of an MoE task: balanced once at the sharding level and expert-parallel degree
    holding least, then every (degree, level) judged on those shares and splits; the fastest wins, of
    equally fast ones the least expert-parallel and least sharded, experts sliced over TP before whole
    (expert_tp_choices). A degree the kept replicas (those with a share) no longer divide is skipped."""
    base = _layout_at(planning, task, replicas, tp, pp, balanced, memo, levels[-1], cp=cp, ep=degrees[-1])
    if base is None:
        return None
    kept = expert_degrees(planning, task, base.replicas, tp, pp) if base.dp != len(replicas) else degrees
    best, best_t = None, math.inf
    for ep in kept:
        for level in levels if base.dp > 1 else ("none",):
            if ep > 1 and planning.executable and runs_refused(planning, task, ep, tp, pp, level):
                continue
            for etp in expert_tp_choices(planning, task, tp):
                layout = dataclasses.replace(base, sharding=level, ep=ep, etp=etp)
                # Megatron's rank order keeps a stage's expert group on the fewest hosts: tried where it can be
                spread = layout.expert_ranks > 1 and stage_blocks_alike(planning, layout)
                for option in (layout, megatron_order(layout)) if spread else (layout,):
                    t = layout_cost(planning, option)
                    if best is None or t < best_t * (1 - 1e-9):
                        best, best_t = option, t
    return best


def stage_blocks_alike(planning: PlanningContext, layout: TaskLayout) -> bool:
    """Whether `layout`'s pipeline stages can be dealt in Megatron's rank order without changing what
    any device holds: pipelined replicas of one TP degree and layer split on one GPU type."""
    types = {planning.devices[d].type for d in layout.devices()}
    return (layout.pp > 1 and layout.dp > 1 and len(types) == 1 and not layout.tp_varies
            and len(set(layout.layer_splits)) == 1)


def sharding_levels(planning: PlanningContext, task: str, dp: int, tp: int, pp: int) -> tuple[str, ...]:
    """The shardings a layout is tried with, least sharded first: none for all but multi-replica
    training; zero1 never, as zero2 moves the same bytes and holds less; none alone where `hetprof
    run` shards nothing (TP/PP replicas, hetprof/specs/executable.py)."""
    if TASKS[task][0] != TaskKind.TRAINING or dp < 2:
        return ("none",)
    if planning.executable and (tp > 1 or pp > 1):
        return ("none",)
    return ("none", "zero2", "fsdp")


def _layout_at(planning: PlanningContext, task: str, replicas: list[tuple[str, ...]], tp: int, pp: int, balanced: bool,
               memo: dict, sharding: str, sp: int = 1, cp: int = 1, ep: int = 1) -> TaskLayout | None:
    """balanced_layout at one sharding level, Ulysses and context-parallel degree (and, for an MoE task,
    expert-parallel degree: what fits)."""
    model = task_model(planning, task)
    total = task_batch(planning)
    dp = len(replicas)
    if not balanced:
        split = tuple(proportional(model.layers, [1.0] * pp))
        counts = proportional(total, [1.0] * dp)
        return TaskLayout(task=task, tp=tp, pp=pp, replicas=tuple(replicas), shares=tuple(c / total for c in counts),
                          layer_splits=tuple(split for _ in replicas), sharding=sharding, sp=sp, cp=cp)
    nominal = max(1, total // dp)
    shards = sharded(dp, sharding, sp, cp, ep)
    splits = []
    timers = []
    # Planning for `hetprof run`: training replicas average gradients stage by stage, so they share
    # one split — the one balanced for the first (by the locality-first order, the most common) kind.
    shared = planning.executable and pp > 1 and TASKS[task][0] == TaskKind.TRAINING
    for r in replicas:
        kind = replica_key(planning, replicas[0] if shared else r, tp, pp, memo, cp)
        skey = ("split", task, kind, tp, pp, nominal, shards)
        if skey not in memo:
            memo[skey] = balance_layers(planning, task, replicas[0] if shared else r, tp, pp, nominal, shards)
        split = memo[skey]
        splits.append(split)
        tkey = ("curve", task, kind, tp, pp, split, total, shards)
        if tkey not in memo:
            memo[tkey] = replica_curve(planning, task, r, tp, pp, split, total, shards, memo)
        timers.append(memo[tkey])
    # Shares depend only on the sequence of curves (each kept alive by the memo, so ids are stable):
    # mutations that move GPUs of one type between groups rebuild the same sequence again and again.
    ckey = ("shares", *map(id, timers))
    if ckey not in memo:
        memo[ckey] = balance_shares(timers, total)
    counts = memo[ckey]
    if counts is None:
        return None
    keep = [i for i, c in enumerate(counts) if c > 0]
    return TaskLayout(task=task, tp=tp, pp=pp, replicas=tuple(replicas[i] for i in keep),
                      shares=tuple(counts[i] / total for i in keep), layer_splits=tuple(splits[i] for i in keep),
                      sharding=sharding, sp=sp, cp=cp)


def layout_seconds(planning: PlanningContext, layout: TaskLayout) -> float:
    """The layout's task time as its slowest replica (no DP traffic, no colocation effects)."""
    total = task_batch(planning)
    worst = 0.0
    for r, share, split in zip(layout.replicas, layout.shares, layout.layer_splits, strict=True):
        worst = max(worst, replica_time(planning, layout.task, tuple(r), layout.tp, layout.pp,
                                            max(1, round(share * total)), tuple(split), layout.cp))
    return worst


def layout_cost(planning: PlanningContext, layout: TaskLayout) -> float:
    """The task's own seconds on this layout (gradient sync included), inf if it alone overflows memory."""
    judged = planning.task_eval(layout)
    return math.inf if judged.violations else float(judged.seconds)


def best_of(planning: PlanningContext, shapes: Sequence[tuple[int, int]], build) -> tuple[TaskLayout | None, tuple[int, int] | None]:
    """The fastest of the layouts `build(tp, pp)` gives, trying few pipeline depths per TP.

    For each TP degree, deeper pipelines are tried only until one fits memory, plus one more:
    past that, extra stages add bubbles and transfers without freeing anything needed.
    """
    best, best_shape, best_t = None, None, math.inf
    by_tp: dict[int, list[int]] = {}
    for tp, pp in shapes:
        by_tp.setdefault(tp, []).append(pp)
    for tp in sorted(by_tp):
        extra = None
        for pp in sorted(by_tp[tp]):
            if extra is not None and pp > extra:
                break
            layout = build(tp, pp)
            t = math.inf if layout is None else layout_cost(planning, layout)
            if math.isfinite(t) and extra is None:
                extra = pp + 1
            if t < best_t:
                best, best_shape, best_t = layout, (tp, pp), t
    return best, best_shape


def best_layout(planning: PlanningContext, task: str, devices: Sequence[str], max_tp: int = 8, max_pp: int = 4,
                order: Sequence[str] | None = None) -> TaskLayout | None:
    """The fastest balanced layout of `task` on `devices` by its own time, or None if none fits."""
    order = tuple(order) if order is not None else canonical_order(planning, devices)
    shapes = [(s.tp, s.pp) for s in feasible_shapes(planning, task, order, max_tp, max_pp)]
    return best_of(planning, shapes, lambda tp, pp: build_layout(planning, task, order, tp, pp))[0]
