"""Layouts pinned by hand: a known run's GPU split and per-task parallelism, priced as it ran.

A search proposes candidates; to check the simulator against a published run (or to price a
layout a team already uses) the layout is given instead. A pinned layout names groups of GPUs —
each the next `gpus` devices of the cluster in its listed order — and, per task kind
(`generation`, `inference`, `training`) or per task name, the group a task runs on and its
TP × PP (× CP, with a Ulysses degree, and an MoE model's expert-parallel degree); data parallelism fills the group. Tasks named in one group time-share its GPUs, as the
planner's groups do; a group listed under `offload` swaps each task's state to host memory and back
around it every step, as a hybrid engine does by configuration. Naming kinds rather than tasks keeps a layout valid when the workload's task
graph gains or drops a pass (a log-prob recompute, a reference only with KL).
"""

from __future__ import annotations

import dataclasses

from hetprof.errors import SpecError
from hetprof.planner.candidate import Candidate, even_layout
from hetprof.specs import SHARDING
from hetprof.specs.layout import TaskLayout
from hetprof.specs.loader import field, from_data, positive
from hetprof.specs.vocabulary import TaskKind

KINDS = (TaskKind.GENERATION, TaskKind.INFERENCE, TaskKind.TRAINING)


@dataclasses.dataclass
class PinnedTask:
    """Where one task (or every task of a kind) runs and how it is split."""

    group: str = field(help="name of the GPU group the task runs on")
    tp: int = field(1, help="tensor-parallel degree", check=positive, expect="a positive integer")
    pp: int = field(1, help="pipeline-parallel degree", check=positive, expect="a positive integer")
    sharding: str = field("none", help="training state sharded over the replicas: none (DDP), zero1, zero2, fsdp",
                          check=lambda s: s in SHARDING, expect="one of " + ", ".join(SHARDING))
    cp: int = field(1, help="context-parallel degree: each stage holds tp × cp GPUs sharing every sequence",
                    check=positive, expect="a positive integer")
    sp: int = field(1, help="Ulysses degree: this many replicas share each sequence (a divisor of the replicas)",
                    check=positive, expect="a positive integer")
    ep: int = field(1, help="expert-parallel degree of an MoE model: the routed experts split over this many "
                    "consecutive replicas (Megatron's expert_model_parallel_size over TP1, vLLM's EP over DP)",
                    check=positive, expect="a positive integer")
    etp: int | None = field(None, help="expert tensor-parallel degree of an MoE training or inference task: 1 keeps "
                            "the routed experts whole and folds the EP group over the TP ranks (Megatron's "
                            "expert_tensor_parallel_size 1, EP = ep × tp); absent: tp", check=positive,
                            expect="a positive integer")
    pipeline_outermost: bool = field(False, help="deal the group's GPUs in Megatron's rank order (tp-cp-ep-dp-pp: "
                                     "a stage's replicas on neighbouring GPUs) rather than each replica's stages")


@dataclasses.dataclass
class PinnedLayout:
    """GPU groups (in cluster device order) and each task kind's or task's placement."""

    groups: dict[str, int] = field(help="group name -> number of GPUs, taken in the cluster's device order")
    tasks: dict[str, PinnedTask] = field(help="task kind (generation, inference, training) or task name -> placement")
    offload: list[str] = field(default_factory=list,
                               help="groups whose tasks offload their state to host memory between phases by "
                                    "configuration (a hybrid engine: verl's param/optimizer offload, vLLM sleep/wake)")

    def validate(self) -> None:
        for name, count in self.groups.items():
            if count < 1:
                raise SpecError(None, f"groups.{name}", "a positive number of GPUs", count)
        for key, task in self.tasks.items():
            if task.group not in self.groups:
                raise SpecError(None, f"tasks.{key}.group", "one of the groups (" + ", ".join(self.groups) + ")",
                                task.group)
        for i, name in enumerate(self.offload):
            if name not in self.groups:
                raise SpecError(None, f"offload[{i}]", "one of the groups (" + ", ".join(self.groups) + ")", name)

    @classmethod
    def from_dict(cls, data: object, file: str | None = None) -> PinnedLayout:
        return from_data(cls, data, file=file)


def pinned_candidate(sim, layout: PinnedLayout, file: str | None = None, path: str = "layout") -> Candidate:
    """The candidate `layout` pins for the simulator's cluster and workload (every task placed).

    Raises SpecError naming the field when a task has no placement, a group does not divide into
    TP × PP replicas, or the groups need more GPUs than the cluster has.
    """
    devices = list(sim.devices)
    needed = sum(layout.groups.values())
    if needed > len(devices):
        raise SpecError(file, _join(path, "groups"), f"at most the cluster's {len(devices)} GPUs in all", needed)
    group_devices: dict[str, tuple[str, ...]] = {}
    start = 0
    for name, count in layout.groups.items():
        group_devices[name] = tuple(devices[start:start + count])
        start += count
    members: dict[str, list[str]] = {name: [] for name in layout.groups}
    layouts: dict[str, TaskLayout] = {}
    for task in sim.tasks:
        key = task if task in layout.tasks else sim.graph.kind_of(task)
        if key not in layout.tasks:
            raise SpecError(file, _join(path, f"tasks.{key}"), f"a placement for task {task} (by name or kind)", None)
        pin = layout.tasks[key]
        if pin.sharding != "none" and sim.graph.kind_of(task) != TaskKind.TRAINING:
            raise SpecError(file, _join(path, f"tasks.{key}.sharding"), f"none for {task} (only training shards)",
                            pin.sharding)
        for name in ("cp", "sp"):
            if getattr(pin, name) != 1 and sim.graph.kind_of(task) == TaskKind.GENERATION:
                raise SpecError(file, _join(path, f"tasks.{key}.{name}"), f"1 for {task} (a decode step splits no "
                                "sequence)", getattr(pin, name))
        members[pin.group].append(task)
        try:
            even = even_layout(task, group_devices[pin.group], pin.tp, pin.pp, sim.graph.model_of(task).layers,
                               cp=pin.cp, sp=pin.sp, pipeline_outermost=pin.pipeline_outermost)
        except ValueError as exc:
            raise SpecError(file, _join(path, f"tasks.{key}"), "TP × PP × CP dividing its group's GPUs",
                            str(exc)) from None
        if even.dp % pin.sp:
            raise SpecError(file, _join(path, f"tasks.{key}.sp"), f"a divisor of the task's {even.dp} replicas", pin.sp)
        if pin.ep > 1 and (even.dp % pin.ep or sim.graph.model_of(task).moe is None
                           or sim.graph.model_of(task).moe.experts % pin.ep):
            raise SpecError(file, _join(path, f"tasks.{key}.ep"), f"a divisor of the task's {even.dp} replicas and "
                            "of its model's experts (an MoE model)", pin.ep)
        if pin.etp is not None and (pin.etp not in (1, pin.tp) or sim.graph.model_of(task).moe is None
                                    or sim.graph.kind_of(task) == TaskKind.GENERATION):
            raise SpecError(file, _join(path, f"tasks.{key}.etp"), "1 (whole experts) or the task's tp, on an MoE "
                            "model's training or inference task (vLLM slices experts over TP)", pin.etp)
        layouts[task] = dataclasses.replace(even, sharding=pin.sharding, ep=pin.ep, etp=pin.etp)
    used = [name for name in layout.groups if members[name]]
    return Candidate([members[n] for n in used], [group_devices[n] for n in used], layouts,
                     [i for i, n in enumerate(used) if n in layout.offload])


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name
