"""How a plan maps onto processes: one worker per planned device, process groups per task and sync edge.

The plan names devices (`host:index`); torch's launcher names processes (global ranks). The
launcher on each host starts one worker per planned device of that host; the workers exchange their
device ids once, and from then on every rank derives the same Topology from the plan, so every
rank creates the same process groups in the same order — which torch.distributed requires.

Anything the runtime cannot carry out (see `check_supported`: pipelined generation, a GPU plan on
a machine without CUDA, ...) is refused here, before a process starts, naming the task and its layout.
"""

from __future__ import annotations

import dataclasses
import datetime
import json

import torch
import torch.distributed as dist

from hetprof.errors import ExecutionError
from hetprof.specs import TASKS, ClusterSpec, Plan
from hetprof.specs.executable import layout_problems

# Order in which a rank that holds several tasks runs them within one iteration.
INFERENCE_ORDER = ("ref_infer", "reward_infer", "critic_infer")
TRAINING_ORDER = ("actor_train", "critic_train")


def planned_devices(plan: Plan) -> list[str]:
    """The devices the plan's tasks use, in cluster order (hosts as listed, then index)."""
    used = {d for t in plan.tasks for d in t.devices()}
    return [d.id for d in plan.cluster_spec().devices() if d.id in used]


def planned_hosts(plan: Plan) -> list[str]:
    """Hosts holding at least one planned device, in cluster order: node rank R runs host R."""
    hosts: list[str] = []
    for dev in planned_devices(plan):
        host = dev.rsplit(":", 1)[0]
        if host not in hosts:
            hosts.append(host)
    return hosts


def host_devices(plan: Plan, host: str) -> list[str]:
    """Planned devices of one host: local rank i of that host's launcher runs the i-th."""
    return [d for d in planned_devices(plan) if d.rsplit(":", 1)[0] == host]


def device_kind(cluster: ClusterSpec, device_id: str) -> str:
    """'cpu' for CPU worker slots, 'cuda' for GPUs."""
    for d in cluster.devices():
        if d.id == device_id:
            return "cpu" if d.type == "cpu" else "cuda"
    raise ExecutionError(f"device {device_id} is not in the plan's cluster")


def check_supported(plan: Plan, cuda_available: bool | None = None) -> str:
    """Refuse what this executor cannot carry out; returns the torch.distributed backend to use.

    Carried out: data parallelism everywhere (uneven shares); tensor parallelism (torch's
    tensor-parallel API over each stage's devices) for every task; pipeline stages
    (torch.distributed.pipelining, the plan's layer split) for training tasks and for the reference
    and reward models, combined with TP and DP. Refused, naming the task and its layout, what
    `hetprof.specs.executable` lists (the planner plans within the same rules): pipeline stages for
    actor_gen and critic_infer, a pipelined training task whose replicas split the layers
    differently, a TP degree that does not divide the heads, KV heads and FFN width; and here two
    replicas of one task on one device, and a GPU plan on a machine without CUDA.
    """
    roles = plan.workload_spec().roles()
    for t in plan.tasks:
        splits = [tuple(k.layer_end - k.layer_start for k in sorted(t.tasklets, key=lambda k: k.stage) if k.replica == r)
                  for r in sorted({k.replica for k in t.tasklets})]
        problems = layout_problems(t.task, t.kind, roles[t.role], t.layout.tp, t.layout.pp, splits, str(t.layout))
        if problems:
            raise ExecutionError(f"{problems[0]}; it is refused rather than changed — replan with `hetprof plan` "
                                 f"(it plans within what `hetprof run` carries out unless given --any-layout) "
                                 f"or edit the plan")
        devices = t.devices()
        if len(set(devices)) != len(devices):
            raise ExecutionError(f"task {t.task} places two replicas on one device ({devices}); "
                                 f"one device runs one replica of a task")
    cluster = plan.cluster_spec()
    kinds = {device_kind(cluster, d) for d in planned_devices(plan)}
    if kinds == {"cpu"}:
        return "gloo"
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    if not cuda_available:
        raise ExecutionError("the plan places tasks on GPUs but this machine has no CUDA device; "
                             "plan for a cluster of `type: cpu` slots to run without a GPU")
    if kinds == {"cuda"}:
        return "nccl"
    return "gloo"  # mixed CPU slots and GPUs: gloo reaches both


@dataclasses.dataclass(frozen=True)
class TaskRanks:
    """One task as processes: the rank and batch share of each data-parallel replica.

    A replica is `pp` stages of `tp` ranks; `tp_ranks[r]` lists all of replica r's ranks stage-major
    (stage 0's TP ranks, then stage 1's, ...), and `stage_layers[r]` each stage's layer range.
    """

    task: str
    kind: str
    role: str
    ranks: tuple[int, ...]  # each replica's lead (stage 0's first TP rank)
    shares: tuple[float, ...]
    devices: tuple[str, ...]  # each replica's lead device
    layout: str
    tp_ranks: tuple[tuple[int, ...], ...] = ()  # every rank of each replica (pp × tp of them)
    pp: int = 1
    stage_layers: tuple[tuple[tuple[int, int], ...], ...] = ()  # per replica, per stage: [start, end)

    @property
    def lead(self) -> int:
        return self.ranks[0]

    @property
    def tp(self) -> int:
        return len(self.tp_ranks[0]) // self.pp if self.tp_ranks else 1

    @property
    def all_ranks(self) -> tuple[int, ...]:
        return tuple(r for replica in self.tp_ranks for r in replica) if self.tp_ranks else self.ranks

    def replica_of(self, rank: int) -> int:
        for i, replica in enumerate(self.tp_ranks or tuple((r,) for r in self.ranks)):
            if rank in replica:
                return i
        raise ValueError(f"rank {rank} runs no replica of {self.task}")

    def position(self, rank: int) -> tuple[int, int, int]:
        """(replica, stage, TP index) of a rank of this task."""
        replica = self.replica_of(rank)
        i = (self.tp_ranks[replica] if self.tp_ranks else (rank,)).index(rank)
        return replica, i // self.tp, i % self.tp

    def rank_at(self, replica: int, stage: int, tp_index: int) -> int:
        return self.tp_ranks[replica][stage * self.tp + tp_index] if self.tp_ranks else self.ranks[replica]


class Topology:
    """The plan seen as ranks: which tasks each rank runs, who leads, who takes part in each group."""

    def __init__(self, plan: Plan, rank_of: dict[str, int]):
        self.plan = plan
        self.rank_of = rank_of
        self.device_of = {r: d for d, r in rank_of.items()}
        self.tasks: dict[str, TaskRanks] = {}
        for t in plan.tasks:
            tasklets = sorted(t.tasklets, key=lambda k: (k.replica, k.stage))
            missing = [d for k in tasklets for d in k.devices if d not in rank_of]
            if missing:
                raise ExecutionError(f"task {t.task}: no worker runs device(s) {missing}")
            replicas = sorted({k.replica for k in tasklets})
            stages = [[k for k in tasklets if k.replica == r] for r in replicas]
            self.tasks[t.task] = TaskRanks(
                t.task, TASKS[t.task][0], TASKS[t.task][1],
                tuple(rank_of[s[0].devices[0]] for s in stages), tuple(s[0].batch_share for s in stages),
                tuple(s[0].devices[0] for s in stages), str(t.layout),
                tuple(tuple(rank_of[d] for k in s for d in k.devices) for s in stages), len(stages[0]),
                tuple(tuple(_layer_range(k, t, plan) for k in s) for s in stages))
        if "actor_gen" not in self.tasks or "actor_train" not in self.tasks:
            raise ExecutionError("a plan needs placements for actor_gen and actor_train")
        self.groups: dict[str, dist.ProcessGroup | None] = {}

    # ---- who does what ----------------------------------------------------------------------
    @property
    def leader(self) -> int:
        """The rank that assembles each batch and records the iteration: actor_train replica 0."""
        return self.tasks["actor_train"].lead

    @property
    def generators(self) -> tuple[int, ...]:
        """Every rank holding a generator copy (all TP ranks of every replica)."""
        return self.tasks["actor_gen"].all_ranks

    @property
    def sync_ranks(self) -> list[int]:
        """Members of the weight-sync edge actor_train → actor_gen (the trainer leader broadcasts)."""
        return self.sync_members("weight_sync")

    def sync_source(self, edge: str) -> int:
        """The rank that broadcasts on a sync edge: replica 0 of the training task."""
        return self.tasks["actor_train" if edge == "weight_sync" else "critic_train"].lead

    def sync_members(self, edge: str) -> list[int]:
        """Ranks on a weight-sync edge: actor_train → actor_gen, and (PPO) critic_train → critic_infer."""
        if edge == "weight_sync":
            return sorted({self.leader, *self.generators})
        if edge == "critic_sync" and "critic_train" in self.tasks and "critic_infer" in self.tasks:
            return sorted({self.tasks["critic_train"].lead, *self.tasks["critic_infer"].all_ranks})
        return []

    def tasks_on(self, rank: int) -> list[str]:
        return [name for name, t in self.tasks.items() if rank in t.all_ranks]

    def inference_tasks(self) -> list[TaskRanks]:
        return [self.tasks[n] for n in INFERENCE_ORDER if n in self.tasks]

    def training_tasks(self) -> list[TaskRanks]:
        return [self.tasks[n] for n in TRAINING_ORDER if n in self.tasks]

    def describe(self, rank: int) -> str:
        """'rank 2 (device localhost:2; tasks actor_gen)' — how a failure names a worker."""
        return f"rank {rank} (device {self.device_of.get(rank, '?')}; tasks {', '.join(self.tasks_on(rank)) or '-'})"

    # ---- process groups ---------------------------------------------------------------------
    # Names of a task's model-parallel groups (created by build_groups when they have ≥ 2 ranks).
    @staticmethod
    def tp_group(task: str, replica: int, stage: int) -> str:
        """The TP ranks of one stage of one replica (shards of the same layers)."""
        return f"{task}/tp{replica}.{stage}"

    @staticmethod
    def pp_group(task: str, replica: int, tp_index: int) -> str:
        """One rank per stage of a replica, at the same TP index: a pipeline."""
        return f"{task}/pp{replica}.{tp_index}"

    @staticmethod
    def dp_group(task: str, stage: int, tp_index: int) -> str:
        """The ranks holding the same shard in every replica: they average gradients."""
        return f"{task}/dp{stage}.{tp_index}"

    @staticmethod
    def replica_group(task: str, replica: int) -> str:
        """Every rank of one replica (the gradient norm of a sharded model sums over it)."""
        return f"{task}/replica{replica}"

    @staticmethod
    def tie_group(task: str, replica: int, tp_index: int) -> str:
        """First and last stage of a pipeline: their copies of a tied embedding add gradients."""
        return f"{task}/tie{replica}.{tp_index}"

    def pipeline_ranks(self, task: str, replica: int, tp_index: int) -> tuple[int, ...]:
        t = self.tasks[task]
        return tuple(t.rank_at(replica, s, tp_index) for s in range(t.pp))

    def build_groups(self, backend: str | None = None) -> None:
        """Create one group per training task (its DDP replicas) and one for the sync edge, plus the
        TP, pipeline, data-parallel and replica groups of model-parallel tasks.

        Every rank calls this with the same topology, so the new_group calls line up.
        """
        for t in self.training_tasks():
            self.groups[t.task] = dist.new_group(sorted(t.ranks), backend=backend)
        for t in self.inference_tasks():
            self.groups[t.task] = dist.new_group(sorted(t.ranks), backend=backend)
        self.groups["actor_gen"] = dist.new_group(sorted(self.generators), backend=backend)

        def add(name: str, ranks: list[int]) -> None:
            if len(ranks) > 1:
                self.groups[name] = dist.new_group(ranks, backend=backend)

        for t in self.tasks.values():
            if t.tp == 1 and t.pp == 1:
                continue
            replicas = range(len(t.ranks))
            for r in replicas:
                for s in range(t.pp):
                    add(self.tp_group(t.task, r, s), [t.rank_at(r, s, j) for j in range(t.tp)])
                for j in range(t.tp):
                    add(self.pp_group(t.task, r, j), list(self.pipeline_ranks(t.task, r, j)))
                    if t.pp > 1 and t.kind == "training":
                        add(self.tie_group(t.task, r, j), [t.rank_at(r, 0, j), t.rank_at(r, t.pp - 1, j)])
                if t.kind == "training":
                    add(self.replica_group(t.task, r), list(t.tp_ranks[r]))
            if t.kind == "training":
                for s in range(t.pp):
                    for j in range(t.tp):
                        add(self.dp_group(t.task, s, j), [t.rank_at(r, s, j) for r in replicas])
        self.groups["weight_sync"] = dist.new_group(self.sync_ranks, backend=backend)
        # Tensor-dict messages match by tag, which gloo honours and NCCL does not (a rank that both
        # generates ahead and serves inference would see its messages cross), so on GPUs they travel
        # over a gloo group through host memory; they are small next to the weights.
        self.groups["messages"] = (dist.new_group(sorted(self.device_of), backend="gloo")
                                   if dist.get_backend() == "nccl" else None)
        # Per-iteration reports (times, statistics) go to the leader's record-writing thread on a
        # group of their own, so that thread's receives never interleave with the loop's messages.
        self.groups["reports"] = dist.new_group(sorted(self.device_of), backend="gloo")
        if self.sync_members("critic_sync"):
            self.groups["critic_sync"] = dist.new_group(self.sync_members("critic_sync"), backend=backend)

    def to_json(self) -> str:
        return json.dumps({name: dataclasses.asdict(t) for name, t in self.tasks.items()})


def _layer_range(tasklet, placement, plan: Plan) -> tuple[int, int]:
    """A tasklet's [layer_start, layer_end); a single-stage tasklet that leaves them 0 holds all layers."""
    if tasklet.layer_end > tasklet.layer_start:
        return tasklet.layer_start, tasklet.layer_end
    return 0, plan.workload_spec().roles()[placement.role].layers


# ---- point-to-point exchange of tensor dicts ------------------------------------------------
# Rollouts and inference results travel between task leaders as {name: tensor}. Each message is
# two sends whatever the number of tensors: the sizes, then one byte buffer holding a JSON header
# (names, dtypes, shapes, offsets) followed by every tensor's bytes. Per-send latency, not bandwidth,
# dominates these small messages, so packing them is what keeps the exchange cheap. Tags keep
# messages of different kinds and batches apart.

def _dtype(name: str) -> torch.dtype:
    value = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise ExecutionError(f"message header names an unknown dtype {name!r}")
    return value


def pack(tensors: dict[str, torch.Tensor], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(sizes [2] int64, buffer uint8) of a tensor dict; `unpack` inverts it."""
    parts, header, offset = [], {}, 0
    for name, t in tensors.items():
        raw = t.detach().contiguous().reshape(-1).view(torch.uint8).to(device)
        header[name] = [str(t.dtype), list(t.shape), offset, raw.numel()]
        parts.append(raw)
        offset += raw.numel()
    head = torch.frombuffer(bytearray(json.dumps(header).encode()), dtype=torch.uint8).to(device)
    buffer = torch.cat([head, *parts]) if parts else head
    return torch.tensor([head.numel(), offset], dtype=torch.int64, device=device), buffer


def unpack(sizes: torch.Tensor, buffer: torch.Tensor) -> dict[str, torch.Tensor]:
    head_len = int(sizes[0])
    header = json.loads(bytes(buffer[:head_len].cpu().numpy().tobytes()).decode())
    data = buffer[head_len:]
    out = {}
    for name, (dtype, shape, offset, nbytes) in header.items():
        out[name] = data[offset:offset + nbytes].clone().view(_dtype(dtype)).reshape(shape)
    return out


class Outbox:
    """Non-blocking sends whose buffers stay alive until delivered (generators run ahead)."""

    def __init__(self, timeout_s: float = 300.0, group: dist.ProcessGroup | None = None) -> None:
        self.group = group
        self._pending: list[tuple[dist.Work, torch.Tensor]] = []
        self.timeout = datetime.timedelta(seconds=timeout_s)

    def send(self, tensors: dict[str, torch.Tensor], dst: int, tag: int, device: torch.device) -> None:
        for t in pack(tensors, device):
            self._pending.append((dist.isend(t, dst, tag=tag, group=self.group), t))
        self._prune()

    def _prune(self) -> None:
        self._pending = [(w, t) for w, t in self._pending if not w.is_completed()]

    def flush(self) -> None:
        for work, _ in self._pending:
            if work.wait(self.timeout) is False:
                raise ExecutionError(f"a message was not delivered within {self.timeout.total_seconds():.0f} s; "
                                     f"its receiver is dead or hung")
        self._pending.clear()


def recv_tensors(src: int, tag: int, device: torch.device, group: dist.ProcessGroup | None = None
                 ) -> dict[str, torch.Tensor]:
    sizes = torch.empty(2, dtype=torch.int64, device=device)
    dist.recv(sizes, src, tag=tag, group=group)
    buffer = torch.empty(int(sizes.sum()), dtype=torch.uint8, device=device)
    dist.recv(buffer, src, tag=tag, group=group)
    return unpack(sizes, buffer)
