"""Candidate + Score <-> the plan file (hetprof.specs.Plan) that `hetprof run` executes.

The plan is self-describing: it embeds the cluster and workload, the prediction with its
breakdown, and where it came from (search, seed, objective, cost model, profile snapshot), so it
can be run, re-scored or checked without the search that made it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from hetprof.errors import InfeasibleError, SpecError
from hetprof.planner.candidate import Candidate, TaskLayout
from hetprof.planner.simulator import Score, Simulator
from hetprof.specs import FOLLOWS, Group, Layout, Plan, Prediction, Tasklet, TaskPlacement
from hetprof.specs.vocabulary import TaskKind


def group_name(index: int) -> str:
    return f"group{index}"


def to_plan(sim: Simulator, candidate: Candidate, score: Score | None = None, *, search: str = "",
            seed: int = 0, objective: str = "throughput", trace: Iterable[Mapping[str, Any]] = (),
            profile_snapshot: str = "", evaluations: int | None = None) -> Plan:
    """The plan file for a feasible candidate; an infeasible one raises InfeasibleError with its reasons."""
    score = score if score is not None else sim.evaluate(candidate)
    if not score.feasible:
        reasons = "; ".join(score.violations[:5]) or "no finite iteration time"
        raise InfeasibleError(f"the {search or 'given'} plan is infeasible: {reasons}")
    placements = []
    layouts, grouped = sim.with_followers(candidate)
    group_of = {t: i for i, g in enumerate(grouped) for t in g}
    groups = [Group(group_name(i), list(tasks), list(devs), offload=i in candidate.offload)
              for i, (tasks, devs) in enumerate(zip(grouped, candidate.group_devices, strict=True))]
    for t in sim.graph.tasks:
        lay = layouts[t]
        tasklets = []
        for r in range(lay.dp):
            start = 0
            for s, layers in enumerate(lay.layer_splits[r]):
                tasklets.append(Tasklet(replica=r, stage=s, devices=list(lay.stage_devices(r, s)),
                                        layer_start=start, layer_end=start + layers, batch_share=lay.shares[r]))
                start += layers
        peak = max(sim.task_eval(lay).memory[d].total for d in lay.devices())
        placements.append(TaskPlacement(task=t, group=group_name(group_of[t]),
                                        layout=Layout(dp=lay.dp, tp=lay.tp, pp=lay.pp, sharding=_sharding(sim, lay),
                                                      replica_tp=_replica_tp(lay)),
                                        tasklets=tasklets,
                                        predicted_s=_finite(score.task_seconds.get(t)), memory_bytes=float(peak)))
    headroom = {d: float(sim.capacity[d] - score.memory_peak.get(d, 0.0)) for d in candidate.devices()}
    prediction = Prediction(iteration_s=score.iteration_s, breakdown=dict(score.breakdown),
                            bottleneck=score.bottleneck, memory_headroom=headroom,
                            cost_per_iteration=score.cost_per_iteration, throughput=score.throughput)
    plan = Plan(cluster=sim.cluster.to_dict(), workload=sim.workload.to_dict(), groups=groups, tasks=placements,
                predicted=prediction, backend=sim.backend, cost_model=getattr(sim.cost_model, "name", "") or type(sim.cost_model).__name__,
                profile_snapshot=profile_snapshot, search=search, seed=seed, objective=objective,
                search_trace=[dict(x) for x in trace], search_evaluations=evaluations)
    plan.validate()
    return plan


def from_plan(plan: Plan) -> Candidate:
    """The candidate a plan file describes (to re-score it, e.g. with another cost model or cluster).

    Followers (the log-prob pass) are left out: the simulator places them beside their leaders.
    """
    plan.validate()
    index = {g.name: i for i, g in enumerate(plan.groups)}
    layouts: dict[str, TaskLayout] = {}
    for ti, tp in enumerate(plan.tasks):
        if tp.task in FOLLOWS:
            continue
        if tp.task in layouts:
            raise SpecError(None, f"tasks[{ti}].task", "each task placed once", tp.task)
        replicas, shares, splits = [], [], []
        for r in range(tp.layout.dp):
            stages = sorted((k for k in tp.tasklets if k.replica == r), key=lambda k: k.stage)
            replicas.append(tuple(d for k in stages for d in k.devices))
            shares.append(stages[0].batch_share)
            splits.append(tuple(k.layer_end - k.layer_start for k in stages))
        layouts[tp.task] = TaskLayout(tp.task, tp.layout.tp, tp.layout.pp, tuple(replicas), tuple(shares),
                                      tuple(splits), tp.layout.sharding)
    groups = [tuple(t.task for t in plan.tasks if index[t.group] == i and t.task not in FOLLOWS)
              for i in range(len(plan.groups))]
    return Candidate(groups, [tuple(g.devices) for g in plan.groups], layouts,
                     [i for i, g in enumerate(plan.groups) if g.offload])


def _sharding(sim, lay) -> str:
    """A layout's sharding as a plan records it: a training task's own; a follower runs on its
    leader's (sharded) model but shards no state of its own, so the plan says none."""
    return lay.sharding if sim.graph.kind_of(lay.task) == TaskKind.TRAINING else "none"


def _replica_tp(lay: TaskLayout) -> list[int] | None:
    """Each replica's TP degree where they differ (a plan names them only then)."""
    degrees = lay.tp_degrees()
    return list(degrees) if len(set(degrees)) > 1 else None


def _finite(x: float | None) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None
