"""Plan file: the placement and parallel layout of every RL task, and what it is predicted to cost.

A plan is self-describing: it embeds the cluster and workload it was made for, the cost model
and profile snapshot it was scored with, and the search that produced it, so `hetprof run` needs
nothing else and `hetprof validate` can compare prediction with measurement later.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, ClassVar, Literal

from hetprof.errors import SpecError
from hetprof.specs.cluster import ClusterSpec
from hetprof.specs.layout import LayoutEntry, TaskLayout, TaskletEntry, entry_field
from hetprof.specs.loader import field, from_data, to_data
from hetprof.specs.positions import load_spec
from hetprof.specs.vocabulary import Task, TaskKind
from hetprof.specs.workload import WorkloadSpec

PLAN_VERSION = 1

# The RL tasks: name -> (kind, model role). Weight sync (actor_train -> actor_gen) is an edge.
TASKS: dict[str, tuple[str, str]] = {str(t): (str(t.kind), str(t.role)) for t in Task}

# Tasks that run on another task's workers with its layout and its very weights: the old-log-prob
# pass is a forward of the trainer's own module before its update (verl's compute_log_prob runs on
# the actor workers), so it is never placed on its own and never needs a weight sync.
FOLLOWS: dict[str, str] = {Task.ACTOR_LOGPROB: Task.ACTOR_TRAIN}

# Generation engines a plan can be made for (`hetprof plan --backend`); `hetprof run` carries out
# only those it has an executor backend for (static batching is priced, to plan for TensorRT-LLM).
GENERATION_BACKENDS = ("hf", "vllm", "static")
RUNNABLE_BACKENDS = ("hf", "vllm")


def workload_tasks(workload: WorkloadSpec) -> list[str]:
    """The tasks a workload has, in workflow order.

    The old-log-prob recompute runs unless the workload trains on the rollout's own log-probs; the
    reference pass only with a KL term (kl_coef > 0); a reward model only for model rewards; the
    critic (values and training) only for PPO.
    """
    tasks = [Task.ACTOR_GEN]
    if not workload.training.use_rollout_logprobs:
        tasks.append(Task.ACTOR_LOGPROB)
    if workload.training.kl_coef > 0:
        tasks.append(Task.REF_INFER)
    if workload.models.reward:
        tasks.append(Task.REWARD_INFER)
    if workload.algorithm == "ppo":
        tasks.append(Task.CRITIC_INFER)
    tasks.append(Task.ACTOR_TRAIN)
    if workload.algorithm == "ppo":
        tasks.append(Task.CRITIC_TRAIN)
    return tasks


_SAME_TP = ("absent (only a generation task's replicas may differ in TP; the others average gradients or follow "
            "a trainer)")


@dataclasses.dataclass
class PlacementEntry:
    """A plan file's entry for one task: the file form of a TaskPlacement (its layout written as the
    degrees, `layout`, and one tasklet per replica and stage, `tasklets`)."""

    task: str = field(help="task name", check=lambda t: t in TASKS, expect="one of " + ", ".join(TASKS))
    group: str = field(help="the group (set of GPUs) this task runs on")
    layout: LayoutEntry = field(default_factory=LayoutEntry, help="DP × TP × PP")
    tasklets: list[TaskletEntry] = field(default_factory=list, help="replica/stage placement")
    predicted_s: float | None = field(None, help="predicted seconds of this task per iteration")
    memory_bytes: float | None = field(None, help="predicted peak memory per device")


@dataclasses.dataclass
class TaskPlacement:
    """One task of a plan: its layout (which names the task), its group and what it is predicted to cost."""

    FILE_FORM: ClassVar[type] = PlacementEntry

    layout: TaskLayout
    group: str
    predicted_s: float | None = None
    memory_bytes: float | None = None

    @property
    def task(self) -> str:
        return self.layout.task

    @property
    def kind(self) -> str:
        return self.layout.kind

    @property
    def role(self) -> str:
        return self.layout.role

    def devices(self) -> list[str]:
        return list(self.layout.devices())

    @classmethod
    def from_file_form(cls, entry: PlacementEntry) -> TaskPlacement:
        if entry.layout.replica_tp is not None and TASKS[entry.task][0] != TaskKind.GENERATION:
            raise SpecError(None, "layout.replica_tp", _SAME_TP, entry.layout.replica_tp)
        return cls(TaskLayout.from_entries(entry.task, entry.layout, entry.tasklets), entry.group,
                   entry.predicted_s, entry.memory_bytes)

    def to_file_form(self) -> PlacementEntry:
        layout, tasklets = self.layout.to_entries()
        return PlacementEntry(self.task, self.group, layout, tasklets, self.predicted_s, self.memory_bytes)


@dataclasses.dataclass
class Group:
    name: str = field(help="group name")
    tasks: list[str] = field(help="tasks that time-share these devices")
    devices: list[str] = field(help="device ids 'host:index'")
    offload: bool = field(False, help="tasks offload their state to host memory between phases even when "
                                      "everything fits (a hybrid engine's sleep/wake); otherwise only when it does not")


@dataclasses.dataclass
class Prediction:
    iteration_s: float = field(help="predicted seconds per RL iteration (steady state)")
    breakdown: dict[str, float] = field(default_factory=dict, help="seconds per task and transfer")
    bottleneck: str = field("", help="what bounds the iteration time")
    memory_headroom: dict[str, float] = field(default_factory=dict,
                                              help="free bytes per device at its peak phase")
    cost_per_iteration: float | None = field(None, help="$ per iteration at the cluster's prices")
    throughput: float | None = field(None, help="sequences per second")


@dataclasses.dataclass
class Plan:
    cluster: dict[str, Any] = field(help="the cluster spec this plan was made for")
    workload: dict[str, Any] = field(help="the workload spec this plan was made for")
    groups: list[Group] = field(help="device groups")
    tasks: list[TaskPlacement] = field(help="placement and layout per task")
    predicted: Prediction = field(help="the simulator's prediction")
    version: int = field(PLAN_VERSION, help="plan format version",
                         check=lambda v: v == PLAN_VERSION, expect=f"plan format version {PLAN_VERSION}")
    cost_model: str = field("analytical", help="cost model the prediction used")
    backend: str = field("hf", help="generation backend the plan was priced for (hetprof run --backend must match)",
                         check=lambda b: b in GENERATION_BACKENDS, expect="one of " + ", ".join(GENERATION_BACKENDS))
    streaming: bool | None = field(None, help="whether the prediction priced generation streaming its rollouts "
                                   "into the next stage (absent: not recorded)")
    profile_snapshot: str = field("", help="content hash of the profile data the cost model saw")
    search: str = field("", help="search that produced the plan")
    seed: int = field(0, help="search seed")
    objective: Literal["throughput", "cost", "throughput-under-budget"] = field("throughput", help="objective")
    search_trace: list[dict[str, Any]] = field(default_factory=list, help="best score over search time")
    search_evaluations: int | None = field(None, help="plans the search scored with the simulator (its effort)")

    # ---- derived views ----------------------------------------------------------------------
    def cluster_spec(self) -> ClusterSpec:
        return ClusterSpec.from_dict(self.cluster, file="<plan cluster>")

    def workload_spec(self) -> WorkloadSpec:
        return WorkloadSpec.from_dict(self.workload, file="<plan workload>")

    def task(self, name: str) -> TaskPlacement:
        for t in self.tasks:
            if t.task == name:
                return t
        raise KeyError(name)

    def validate(self) -> None:
        cluster = ClusterSpec.from_dict(self.cluster, file=None)
        workload = WorkloadSpec.from_dict(self.workload, file=None)
        known = {d.id for d in cluster.devices()}
        groups = {g.name: g for g in self.groups}
        for gi, g in enumerate(self.groups):
            for d in g.devices:
                if d not in known:
                    raise SpecError(None, f"groups[{gi}].devices", "device ids of the plan's cluster", d)
        expected = workload_tasks(workload)
        present = [t.task for t in self.tasks]
        missing = [t for t in expected if t not in present]
        if missing:
            raise SpecError(None, "tasks", f"a placement for every task of the workload ({', '.join(expected)})",
                            f"missing {missing}")
        roles = workload.roles()
        for ti, t in enumerate(self.tasks):
            where, lay = f"tasks[{ti}]", t.layout
            if t.group not in groups:
                raise SpecError(None, f"{where}.group", "a group name of this plan", t.group)
            try:
                lay.validate()
            except SpecError as exc:  # a layout built in code (not loaded) is checked here, path anchored
                raise SpecError(None, f"{where}.{entry_field(exc.field)}", exc.expected, exc.got) from None
            if lay.sharding != "none" and t.kind != TaskKind.TRAINING:
                raise SpecError(None, f"{where}.layout.sharding", "none (only training tasks shard their state)",
                                lay.sharding)
            if lay.etp is not None and roles[t.role].moe is None:
                raise SpecError(None, f"{where}.layout.etp", f"absent for the dense {roles[t.role].name} model "
                                "(expert tensor parallelism splits routed experts)", lay.etp)
            if lay.tp_varies and t.kind != TaskKind.GENERATION:
                raise SpecError(None, f"{where}.layout.replica_tp", _SAME_TP, list(lay.tp_degrees()))
            self._check_stages(where, t, groups[t.group], roles[t.role].layers)
        self._check_followers()

    @staticmethod
    def _check_stages(where: str, t: TaskPlacement, group: Group, layers: int) -> None:
        """Each stage on its group's devices, each replica's stages holding the model's layers 0..layers.
        Tasklets are named by their index as the file lists them (replica by replica, stage by stage)."""
        lay = t.layout
        for r in range(lay.dp):
            for s in range(lay.pp):
                ki = r * lay.pp + s
                for d in lay.stage_devices(r, s):
                    if d not in group.devices:
                        raise SpecError(None, f"{where}.tasklets[{ki}].devices", f"devices of group {t.group}", d)
                if lay.layer_range(r, s)[1] > layers:
                    raise SpecError(None, f"{where}.tasklets[{ki}]", f"a layer range inside [0, {layers})",
                                    lay.layer_range(r, s))
            if sum(lay.layer_splits[r]) != layers:
                raise SpecError(None, f"{where}.tasklets", f"stages of replica {r} covering layers 0..{layers} "
                                "contiguously", [lay.layer_range(r, s) for s in range(lay.pp)])

    def _check_followers(self) -> None:
        """A follower task (FOLLOWS) sits in its leader's group with its leader's devices and degrees."""
        placed = {t.task: (i, t) for i, t in enumerate(self.tasks)}
        for follower, leader in FOLLOWS.items():
            if follower not in placed or leader not in placed:
                continue
            i, f = placed[follower]
            lead = placed[leader][1]
            same = (f.group == lead.group and (f.layout.tp, f.layout.pp, f.layout.cp, f.layout.sp, f.layout.replicas) ==
                    (lead.layout.tp, lead.layout.pp, lead.layout.cp, lead.layout.sp, lead.layout.replicas))
            if not same:
                raise SpecError(None, f"tasks[{i}]", f"{follower} on {leader}'s group, devices and layout "
                                f"(it runs on {leader}'s workers with its weights)",
                                f"group {f.group}, {f.layout} on {f.devices()}")

    # ---- files ------------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path) -> Plan:
        return load_spec(cls, path)

    @classmethod
    def from_dict(cls, data: dict, file: str | None = None) -> Plan:
        return from_data(cls, data, file=file)

    def to_dict(self) -> dict:
        return to_data(self)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")
