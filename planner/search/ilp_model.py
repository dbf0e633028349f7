"""The restricted MILP, built: variables, constraints and objective over a RestrictedSpace.

Per group, how many GPUs of each kind it gets (one-hot over counts: integer counts per kind, not
a binary per GPU, so identical GPUs create no symmetry); per task one TP×PP; per task and kind how
many type-pure replicas run. A replica of kind t and shape c processes r[k,t,c] sequences per
second and holds at most m[k,t,c] sequences — constants measured with the simulator's replica
times (`ReplicaRates`). A task's time B/rate is convex in its rate, so it is bounded below by
tangent cuts; the objective is min-max: per workflow stage the busiest group (sync: stages add
up), or the busiest group overall (async: generation overlaps training). Region indicators per
group price what the cluster's links add: the gradient all-reduce of a training task whose group
spans two regions, and the weight sync between the training and generation groups' regions.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from hetprof.errors import InfeasibleError
from hetprof.planner.search import layouts, replica_kinds
from hetprof.planner.search.restricted import RestrictedSpace
from hetprof.specs.plan import TASKS
from hetprof.specs.vocabulary import Task, TaskKind

TANGENTS = 48
STAGE = {TaskKind.GENERATION: 0, TaskKind.INFERENCE: 1, TaskKind.TRAINING: 2}
Shape = tuple[int, int]


def replica_rate(space: RestrictedSpace, task: str, kind: str, tp: int, pp: int, total: int) -> tuple[float, int]:
    """(sequences/s, most sequences that fit) of one replica of `kind` and shape tp×pp; (0, 0) if none fits."""
    planning = space.planning
    reps = space.replicas([d for h in space.hosts[kind] for d in h], tp, pp)
    if not reps:
        return 0.0, 0
    rep = reps[0]
    split = replica_kinds.balance_layers(planning, task, rep, tp, pp, max(1, total // max(1, len(reps))))

    def seconds(b: int) -> float:
        if b <= 0:
            return 0.0
        if replica_kinds.replica_overflow(planning, task, rep, tp, split, b) > 0:
            return math.inf
        return replica_kinds.replica_time(planning, task, rep, tp, pp, b, split)

    most = layouts.largest_batch_within(seconds, math.inf, total)
    if most == 0:
        return 0.0, 0
    ref = max(1, min(most, math.ceil(total / max(1, len(reps)))))
    s = seconds(ref)
    return (ref / s if s > 0 and math.isfinite(s) else 0.0), most


class ReplicaRates:
    """Replica rates by (task, kind, shape, batch), measured once and shared between the solves of
    one problem (hetrl solves several groupings; the rates do not depend on the grouping)."""

    def __init__(self) -> None:
        self.table: dict[tuple, tuple[float, int]] = {}

    def get(self, space: RestrictedSpace, task: str, kind: str, shape: Shape, total: int) -> tuple[float, int]:
        key = (task, kind, shape[0], shape[1], total)
        if key not in self.table:
            self.table[key] = replica_rate(space, task, kind, shape[0], shape[1], total)
        return self.table[key]


@dataclasses.dataclass
class RestrictedModel:
    """The PuLP problem and the variables decoding and warm starts read."""

    prob: Any
    space: RestrictedSpace
    shapes: dict[str, list[Shape]]
    u: dict[tuple[int, str, int], Any]        # group g takes v GPUs of kind t
    z: dict[tuple[str, Shape], Any]           # task k runs shape c
    w: dict[tuple[str, str, Shape], Any]      # replicas of task k on kind t in shape c

    @property
    def tasks(self) -> list[str]:
        return [k for g in self.space.grouping for k in g]


def _rates(space: RestrictedSpace, rates: ReplicaRates, total: int, max_tp: int,
           max_pp: int) -> tuple[dict, dict, dict[str, list[Shape]]]:
    rate, cap, shapes = {}, {}, {}
    for k in [k for g in space.grouping for k in g]:
        shapes[k] = []
        for c in space.shapes(k):
            usable = False
            for t in space.types:
                if c[0] > space.tp_span(t):
                    continue
                r, m = rates.get(space, k, t, c, total)
                if r > 0:
                    rate[k, t, c], cap[k, t, c] = r, m
                    usable = True
            if usable:
                shapes[k].append(c)
        if not shapes[k]:
            raise InfeasibleError(f"ilp: {k} fits on no type-pure replica of this cluster "
                                  f"(TP ≤ {max_tp}, PP ≤ {max_pp})")
    return rate, cap, shapes


def _placement(model: RestrictedModel, rate: dict, cap: dict, total: int) -> dict[str, Any]:
    """Counts, shapes and replicas: the constraints that make a choice a placement; returns T[k]."""
    import pulp

    prob, space, grouping = model.prob, model.space, model.space.grouping
    owner = {k: gi for gi, g in enumerate(grouping) for k in g}
    u, z, w = model.u, model.z, model.w
    T = {k: prob.add_variable(f"T_{k}", 0) for k in model.tasks}
    for g in range(len(grouping)):
        for t in space.types:
            prob += pulp.lpSum(u[g, t, v] for v in range(space.totals[t] + 1)) == 1
        prob += pulp.lpSum(v * u[g, t, v] for t in space.types for v in range(1, space.totals[t] + 1)) >= 1
    for t in space.types:
        prob += pulp.lpSum(space.hosts_needed(t, v) * u[g, t, v] for g in range(len(grouping))
                           for v in range(space.totals[t] + 1)) <= len(space.hosts[t])
    for k in model.tasks:
        prob += pulp.lpSum(z[k, c] for c in model.shapes[k]) == 1
        g = owner[k]
        mine = [(key, var) for key, var in w.items() if key[0] == k]
        for (_, t, c), var in mine:
            prob += var <= var.upBound * z[k, c]
            prob += c[1] * var <= pulp.lpSum(space.tp_groups(t, v, c[0]) * u[g, t, v]
                                             for v in range(space.totals[t] + 1))
        flow = pulp.lpSum(rate[key] * var for key, var in mine)
        prob += pulp.lpSum(cap[key] * var for key, var in mine) >= total
        hi = sum(rate[key] * var.upBound for key, var in mine)
        lo = min(rate[key] for key, _ in mine)
        for j in range(TANGENTS):
            rho = lo * (hi / lo) ** (j / (TANGENTS - 1)) if hi > lo else lo
            prob += T[k] >= 2 * total / rho - total * flow / (rho * rho)
    return T


def _region_links(space: RestrictedSpace, regions: list[str]) -> dict:
    """The slowest link between two regions' hosts (a region with itself: its slowest inner link)."""
    planning = space.planning
    hosts = {r: {planning.devices[h[0]].host for k in space.types if space.region[k] == r for h in space.hosts[k]}
             for r in regions}
    return {(a, b): planning.links.slowest_between(hosts[a], hosts[b]) for a in regions for b in regions}


def _regions(model: RestrictedModel, T: dict[str, Any]) -> Any:
    """Region indicators per group, the cross-region all-reduce bound, and the weight-sync variable S."""
    import pulp  # noqa: F401 - PuLP's operators on the variables below

    prob, space, grouping = model.prob, model.space, model.space.grouping
    planning = space.planning
    owner = {k: gi for gi, g in enumerate(grouping) for k in g}
    regions = sorted(set(space.region.values()))
    rho = {(g, r): prob.add_variable(f"rho_{g}_{ri}", cat="Binary")
           for g in range(len(grouping)) for ri, r in enumerate(regions)}
    for g in range(len(grouping)):
        for t in space.types:
            for v in range(1, space.totals[t] + 1):
                prob += model.u[g, t, v] <= rho[g, space.region[t]]
    link = _region_links(space, regions)
    cm = planning.cost_model
    for k in model.tasks:
        if TASKS[k][0] != TaskKind.TRAINING:
            continue
        grads = layouts.task_model(planning, k).weight_bytes(planning.workload.weights_dtype)
        for i, r1 in enumerate(regions):
            for r2 in regions[i + 1:]:
                # data parallelism across two regions all-reduces gradients over their link
                cross = cm.collective_time("all_reduce", grads, 2, link[r1, r2])
                prob += T[k] >= cross * (rho[owner[k], r1] + rho[owner[k], r2] - 1)
    sync = prob.add_variable("S", 0)
    for src, dst in ((Task.ACTOR_TRAIN, Task.ACTOR_GEN), (Task.CRITIC_TRAIN, Task.CRITIC_INFER)):
        if src in owner and dst in owner and owner[src] != owner[dst]:
            weights = layouts.task_model(planning, src)
            for r1 in regions:
                for r2 in regions:
                    cost = cm.weight_sync_time(weights, link[r1, r2], 1, planning.workload.weights_dtype)
                    prob += sync >= cost * (rho[owner[src], r1] + rho[owner[dst], r2] - 1)
    return sync


def _objective(model: RestrictedModel, T: dict[str, Any], sync: Any) -> None:
    import pulp

    prob, grouping = model.prob, model.space.grouping
    if model.space.planning.workload.mode == "async":
        Z = prob.add_variable("Z", 0)
        for g in grouping:
            prob += Z >= pulp.lpSum(T[k] for k in g) + (sync if Task.ACTOR_GEN in g else 0)
        prob += Z
        return
    Zs = {s: prob.add_variable(f"Z_{s}", 0) for s in set(STAGE.values())}
    for g in grouping:
        for s in Zs:
            members = [k for k in g if STAGE[TASKS[k][0]] == s]
            if members:
                prob += Zs[s] >= pulp.lpSum(T[k] for k in members)
    prob += pulp.lpSum(Zs.values()) + sync


def build_model(space: RestrictedSpace, rates: ReplicaRates) -> RestrictedModel:
    """The MILP of `space` (its grouping fixed), replica constants from `rates`."""
    import pulp

    total = layouts.task_batch(space.planning)
    rate, cap, shapes = _rates(space, rates, total, space.max_tp, space.max_pp)
    prob = pulp.LpProblem("hetrl_restricted", pulp.LpMinimize)
    types, grouping = space.types, space.grouping
    u = {(g, t, v): prob.add_variable(f"u_{g}_{ti}_{v}", cat="Binary")
         for g in range(len(grouping)) for ti, t in enumerate(types) for v in range(space.totals[t] + 1)}
    z = {(k, c): prob.add_variable(f"z_{k}_{c[0]}x{c[1]}", cat="Binary")
         for k in [k for g in grouping for k in g] for c in shapes[k]}
    w = {}
    for (k, t, c) in rate:
        most = space.tp_groups(t, space.totals[t], c[0]) // c[1]
        w[k, t, c] = prob.add_variable(f"w_{k}_{types.index(t)}_{c[0]}x{c[1]}", 0, most, cat="Integer")
    model = RestrictedModel(prob, space, shapes, u, z, w)
    T = _placement(model, rate, cap, total)
    _objective(model, T, _regions(model, T))
    return model
