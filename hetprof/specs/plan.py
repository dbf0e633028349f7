"""Plan file: the placement and parallel layout of every RL task, and what it is predicted to cost.

A plan is self-describing: it embeds the cluster and workload it was made for, the cost model
and profile snapshot it was scored with, and the search that produced it, so `hetprof run` needs
nothing else and `hetprof validate` can compare prediction with measurement later.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from hetprof.errors import SpecError
from hetprof.specs.cluster import ClusterSpec
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

# Data-parallel sharding of a training task's state over its replicas: what each level shards.
SHARDING: dict[str, tuple[str, ...]] = {
    "none": (),                                   # DDP: every replica holds everything
    "zero1": ("optimizer",),
    "zero2": ("optimizer", "grads"),
    "fsdp": ("optimizer", "grads", "params"),     # ZeRO-3 / FSDP full shard
}

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


MAX_DEGREE = 1 << 16  # a parallel degree: loops over replicas and stages are sized by it
_DEGREE = f"a positive integer at most {MAX_DEGREE:,}"


def _degree(x: int) -> bool:
    return 0 < x <= MAX_DEGREE


@dataclasses.dataclass
class Layout:
    dp: int = field(1, help="data-parallel replicas", check=_degree, expect=_DEGREE)
    tp: int = field(1, help="tensor-parallel degree", check=_degree, expect=_DEGREE)
    pp: int = field(1, help="pipeline stages", check=_degree, expect=_DEGREE)
    sharding: str = field("none", help="data-parallel sharding of training state: none (DDP), zero1, zero2, "
                          "fsdp (ZeRO-3)", check=lambda s: s in SHARDING, expect="one of " + ", ".join(SHARDING))
    replica_tp: list[int] | None = field(None, help="a generation task's TP degree per replica when its replicas "
                                         "differ (then tp is the largest); absent: every replica has tp",
                                         check=lambda v: all(_degree(x) for x in v), expect=f"a list of {_DEGREE}s")

    def tp_of(self, replica: int) -> int:
        """Replica `replica`'s TP degree: its own where the replicas differ, else the common `tp`."""
        return self.replica_tp[replica] if self.replica_tp else self.tp

    @property
    def world(self) -> int:
        return sum(self.tp_of(r) for r in range(self.dp)) * self.pp

    def validate(self) -> None:
        if self.replica_tp is None:
            return
        if len(self.replica_tp) != self.dp:
            raise SpecError(None, "replica_tp", f"one TP degree per replica (dp = {self.dp})", len(self.replica_tp))
        if max(self.replica_tp) != self.tp:
            raise SpecError(None, "tp", f"the largest of replica_tp ({max(self.replica_tp)})", self.tp)

    def __str__(self) -> str:
        return layout_name(self.replica_tp or [self.tp] * self.dp, self.pp, self.sharding)


def layout_name(degrees: Sequence[int], pp: int, sharding: str = "none") -> str:
    """'DP2×TP2×PP1'; replicas of different TP are counted per degree: 'DP3(2×TP1+1×TP2)×PP1'."""
    shard = "" if sharding == "none" else f" {sharding}"
    counts = {tp: degrees.count(tp) for tp in dict.fromkeys(degrees)}
    if len(counts) == 1:
        return f"DP{len(degrees)}×TP{degrees[0]}×PP{pp}{shard}"
    mix = "+".join(f"{n}×TP{tp}" for tp, n in counts.items())
    return f"DP{len(degrees)}({mix})×PP{pp}{shard}"


@dataclasses.dataclass
class Tasklet:
    """One (replica, stage) of a task: its replica's TP degree of devices holding layers [layer_start, layer_end)."""

    replica: int = field(help="data-parallel replica index")
    stage: int = field(help="pipeline stage index")
    devices: list[str] = field(help="device ids 'host:index', one per TP rank")
    layer_start: int = field(0, help="first layer held (inclusive)")
    layer_end: int = field(0, help="last layer held (exclusive)")
    batch_share: float = field(1.0, help="fraction of the task's batch this replica processes",
                               check=lambda x: 0 <= x <= 1, expect="a fraction in [0, 1]")


@dataclasses.dataclass
class TaskPlacement:
    task: str = field(help="task name", check=lambda t: t in TASKS, expect="one of " + ", ".join(TASKS))
    group: str = field(help="the group (set of GPUs) this task runs on")
    layout: Layout = field(default_factory=Layout, help="DP × TP × PP")
    tasklets: list[Tasklet] = field(default_factory=list, help="replica/stage placement")
    predicted_s: float | None = field(None, help="predicted seconds of this task per iteration")
    memory_bytes: float | None = field(None, help="predicted peak memory per device")

    @property
    def kind(self) -> str:
        return TASKS[self.task][0]

    @property
    def role(self) -> str:
        return TASKS[self.task][1]

    def devices(self) -> list[str]:
        return [d for t in self.tasklets for d in t.devices]


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
            where = f"tasks[{ti}]"
            if t.group not in groups:
                raise SpecError(None, f"{where}.group", "a group name of this plan", t.group)
            if t.layout.sharding != "none" and t.kind != TaskKind.TRAINING:
                raise SpecError(None, f"{where}.layout.sharding", "none (only training tasks shard their state)",
                                t.layout.sharding)
            if t.layout.replica_tp is not None and t.kind != TaskKind.GENERATION:
                raise SpecError(None, f"{where}.layout.replica_tp", "absent (only a generation task's replicas may "
                                "differ in TP; the others average gradients or follow a trainer)", t.layout.replica_tp)
            try:
                t.layout.validate()
            except SpecError as exc:  # a Layout built in code (not loaded) is checked here, path anchored
                raise SpecError(None, f"{where}.layout.{exc.field}", exc.expected, exc.got) from None
            if len(t.tasklets) != t.layout.dp * t.layout.pp:
                raise SpecError(None, f"{where}.tasklets", f"dp × pp = {t.layout.dp * t.layout.pp} tasklets",
                                len(t.tasklets))
            layers = roles[t.role].layers
            for ki, k in enumerate(t.tasklets):
                if not 0 <= k.replica < t.layout.dp:
                    raise SpecError(None, f"{where}.tasklets[{ki}].replica", f"a replica index below dp = "
                                    f"{t.layout.dp}", k.replica)
                tp = t.layout.tp_of(k.replica)
                if len(k.devices) != tp:
                    what = f"replica_tp[{k.replica}]" if t.layout.replica_tp else "tp"
                    raise SpecError(None, f"{where}.tasklets[{ki}].devices", f"{what} = {tp} devices", len(k.devices))
                for d in k.devices:
                    if d not in groups[t.group].devices:
                        raise SpecError(None, f"{where}.tasklets[{ki}].devices", f"devices of group {t.group}", d)
                if not 0 <= k.layer_start < k.layer_end <= layers:
                    raise SpecError(None, f"{where}.tasklets[{ki}]", f"a layer range inside [0, {layers})",
                                    (k.layer_start, k.layer_end))
            for replica in range(t.layout.dp):
                stages = sorted((k for k in t.tasklets if k.replica == replica), key=lambda k: k.stage)
                bounds = [(k.layer_start, k.layer_end) for k in stages]
                if not bounds or bounds[0][0] != 0 or bounds[-1][1] != layers or any(
                        a[1] != b[0] for a, b in zip(bounds, bounds[1:], strict=False)):
                    raise SpecError(None, f"{where}.tasklets", f"stages of replica {replica} covering layers "
                                    f"0..{layers} contiguously", bounds)
            shares = {k.replica: k.batch_share for k in t.tasklets}
            if not math.isclose(sum(shares.values()), 1.0, abs_tol=1e-6):
                raise SpecError(None, f"{where}.tasklets", "batch shares over replicas summing to 1",
                                round(sum(shares.values()), 6))
        self._check_followers(groups)

    def _check_followers(self, groups: dict[str, Group]) -> None:
        """A follower task (FOLLOWS) sits in its leader's group with its leader's devices and degrees."""
        placed = {t.task: (i, t) for i, t in enumerate(self.tasks)}
        for follower, leader in FOLLOWS.items():
            if follower not in placed or leader not in placed:
                continue
            i, f = placed[follower]
            lead = placed[leader][1]
            same = (f.group == lead.group and (f.layout.dp, f.layout.tp, f.layout.pp, f.layout.replica_tp) ==
                    (lead.layout.dp, lead.layout.tp, lead.layout.pp, lead.layout.replica_tp)
                    and f.devices() == lead.devices())
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
