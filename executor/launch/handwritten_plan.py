"""Plans written by hand: place each task on devices yourself and get a plan `hetprof run` accepts.

The planner is the usual source of plans, but an engineer reproducing a placement (a baseline, a
bug report, a quick experiment on a new cluster) wants to say "generation on these two, training on
that one" without a search. Tasks that share a device set form one group, as the planner's
time-sharing groups do; the prediction is left empty (the runtime then reports no ratio) unless
one is passed in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hetprof.errors import SpecError
from hetprof.specs import (
    FOLLOWS,
    ClusterSpec,
    Group,
    Plan,
    Prediction,
    TaskLayout,
    TaskPlacement,
    WorkloadSpec,
)
from hetprof.specs import workload_tasks as tasks_of
from hetprof.specs.vocabulary import Task, TaskKind


def handwritten_plan(cluster: ClusterSpec | Mapping[str, Any], workload: WorkloadSpec | Mapping[str, Any],
                placement: Mapping[str, Sequence[str]], shares: Mapping[str, Sequence[float]] | None = None,
                predicted: Prediction | None = None, task_seconds: Mapping[str, float] | None = None,
                sharding: Mapping[str, str] | None = None, backend: str = "hf",
                sequence_parallel: Mapping[str, int] | None = None,
                expert_parallel: Mapping[str, int] | None = None) -> Plan:
    """A plan from placements: `placement[task]` lists each replica's device, or its list of devices
    for tensor parallelism (one TP degree for all replicas of a task, except that generation replicas
    may differ in TP); `shares[task]` their
    batch shares; `sharding[task]` a training task's data-parallel sharding (none, zero2, fsdp);
    `sequence_parallel[task]` its Ulysses degree (`sp`: that many consecutive replicas share each sequence);
    `expert_parallel[task]` its EP degree (`ep`: that many consecutive replicas split the experts).
    A follower (the log-prob pass) goes where its leader goes, with its leader's degree, unless placed."""
    cluster_d = cluster.to_dict() if isinstance(cluster, ClusterSpec) else dict(cluster)
    workload_d = workload.to_dict() if isinstance(workload, WorkloadSpec) else dict(workload)
    wl = WorkloadSpec.from_dict(workload_d)
    layers = wl.roles()
    placements = []
    placement = {**{f: placement[lead] for f, lead in FOLLOWS.items() if lead in placement}, **placement}
    shares = {**{f: shares[lead] for f, lead in FOLLOWS.items() if lead in (shares or {})}, **(shares or {})}
    sp = sequence_parallel or {}
    sp = {**{f: sp[lead] for f, lead in FOLLOWS.items() if lead in sp}, **sp}
    ep = expert_parallel or {}
    ep = {**{f: ep[lead] for f, lead in FOLLOWS.items() if lead in ep}, **ep}
    for task in tasks_of(wl):
        if task not in placement:
            raise SpecError(None, f"placement.{task}", "a list of device ids for every task of the workload", None)
        devices = [[d] if isinstance(d, str) else list(d) for d in placement[task]]
        if not devices:
            raise SpecError(None, f"placement.{task}", "at least one device", devices)
        degrees = [len(d) for d in devices]
        tp = max(degrees)
        if len(set(degrees)) > 1 and Task(task).kind != TaskKind.GENERATION:
            raise SpecError(None, f"placement.{task}", "replicas with the same number of devices (TP degree; "
                            "only generation replicas may differ)", devices)
        share = list((shares or {}).get(task) or [1.0 / len(devices)] * len(devices))
        if len(share) != len(devices):
            raise SpecError(None, f"shares.{task}", f"{len(devices)} shares (one per replica)", share)
        total = sum(share)
        share = [s / total for s in share]
        role = Task(task).role
        n_layers = layers[role].layers
        layout = TaskLayout(task, tp, 1, tuple(tuple(d) for d in devices), tuple(share), ((n_layers,),) * len(devices),
                            (sharding or {}).get(task, "none"), sp=sp.get(task, 1), ep=ep.get(task, 1))
        placements.append(TaskPlacement(layout, group="", predicted_s=(task_seconds or {}).get(task)))
    # Tasks whose device sets overlap time-share those devices: they form one group, as in the planner.
    components: list[tuple[set[str], list[str]]] = []
    for p in placements:
        devices, tasks = set(p.devices()), [p.task]
        for comp in [c for c in components if c[0] & devices]:
            components.remove(comp)
            devices |= comp[0]
            tasks = comp[1] + tasks
        components.append((devices, tasks))
    order = {d.id: i for i, d in enumerate(ClusterSpec.from_dict(cluster_d).devices())}
    groups = [Group(name=f"g{i}", tasks=tasks, devices=sorted(devs, key=lambda d: order.get(d, 0)))
              for i, (devs, tasks) in enumerate(components)]
    for p in placements:
        p.group = next(g.name for g in groups if p.task in g.tasks)
    plan = Plan(cluster=cluster_d, workload=workload_d, groups=groups,
                tasks=placements, predicted=predicted or Prediction(iteration_s=0.0), search="manual", backend=backend)
    plan.validate()
    return Plan.from_dict(plan.to_dict())
