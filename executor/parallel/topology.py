"""The plan seen as processes: which ranks run each task's replicas and stages, and who leads.

The workers exchange their device ids once; from then on every rank derives the same Topology from
the plan, so every rank builds the same process groups in the same order (process_groups.py), which
torch.distributed requires. Plain data only: nothing here talks to other processes.
"""

from __future__ import annotations

import dataclasses
import json

from hetprof.errors import ExecutionError
from hetprof.specs import TASKS, Plan
from hetprof.specs.vocabulary import INFERENCE_ORDER, SYNC_EDGES, TRAINING_ORDER, SyncEdge, Task


@dataclasses.dataclass(frozen=True)
class TaskRanks:
    """One task as processes: the rank and batch share of each data-parallel replica.

    A replica is `pp` stages of `tp_of(r)` ranks; `tp_ranks[r]` lists all of replica r's ranks
    stage-major (stage 0's TP ranks, then stage 1's, ...), and `stage_layers[r]` each stage's layer
    range. Only a generation task's replicas may differ in TP (the plan's `replica_tp`).
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
    sharding: str = "none"  # training state over the replicas: none (DDP), zero2, fsdp (FSDP2)

    @property
    def lead(self) -> int:
        return self.ranks[0]

    @property
    def tp(self) -> int:
        """The largest TP degree of the task's replicas (every replica's, unless they differ)."""
        return max(self.tp_of(r) for r in range(len(self.ranks)))

    def tp_of(self, replica: int) -> int:
        """Replica `replica`'s TP degree."""
        return len(self.tp_ranks[replica]) // self.pp if self.tp_ranks else 1

    @property
    def all_ranks(self) -> tuple[int, ...]:
        return tuple(r for replica in self.tp_ranks for r in replica) if self.tp_ranks else self.ranks

    @property
    def replica_ranks(self) -> tuple[tuple[int, ...], ...]:
        """Every rank of each replica (a replica's slice of the batch goes to all of them)."""
        return self.tp_ranks or tuple((r,) for r in self.ranks)

    def replica_of(self, rank: int) -> int:
        for i, replica in enumerate(self.replica_ranks):
            if rank in replica:
                return i
        raise ValueError(f"rank {rank} runs no replica of {self.task}")

    def position(self, rank: int) -> tuple[int, int, int]:
        """(replica, stage, TP index) of a rank of this task."""
        replica = self.replica_of(rank)
        i = (self.tp_ranks[replica] if self.tp_ranks else (rank,)).index(rank)
        tp = self.tp_of(replica)
        return replica, i // tp, i % tp

    def rank_at(self, replica: int, stage: int, tp_index: int) -> int:
        return (self.tp_ranks[replica][stage * self.tp_of(replica) + tp_index] if self.tp_ranks
                else self.ranks[replica])


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
                tuple(tuple(_layer_range(k, t, plan) for k in s) for s in stages), t.layout.sharding)
        if Task.ACTOR_GEN not in self.tasks or Task.ACTOR_TRAIN not in self.tasks:
            raise ExecutionError("a plan needs placements for actor_gen and actor_train")

    # ---- who does what ----------------------------------------------------------------------
    @property
    def leader(self) -> int:
        """The rank that assembles each batch and records the iteration: actor_train replica 0."""
        return self.tasks[Task.ACTOR_TRAIN].lead

    @property
    def generators(self) -> tuple[int, ...]:
        """Every rank holding a generator copy (all TP ranks of every replica)."""
        return self.tasks[Task.ACTOR_GEN].all_ranks

    def sync_source(self, edge: str) -> int:
        """The rank that broadcasts on a sync edge: replica 0 of the training task."""
        return self.tasks[SYNC_EDGES[SyncEdge(edge)][1]].lead

    def sync_receivers(self, edge: str) -> tuple[int, ...]:
        """Every rank holding a copy the edge overwrites (each TP rank of each receiving replica)."""
        _, _, receiver = SYNC_EDGES[SyncEdge(edge)]
        return self.tasks[receiver].all_ranks if receiver in self.tasks else ()

    def sync_members(self, edge: str) -> list[int]:
        """Ranks on a weight-sync edge: actor_train → actor_gen, and (PPO) critic_train → critic_infer."""
        _, sender, receiver = SYNC_EDGES[SyncEdge(edge)]
        if sender not in self.tasks or receiver not in self.tasks:
            return []
        return sorted({self.tasks[sender].lead, *self.tasks[receiver].all_ranks})

    def tasks_on(self, rank: int) -> list[str]:
        return [name for name, t in self.tasks.items() if rank in t.all_ranks]

    def inference_tasks(self) -> list[TaskRanks]:
        return [self.tasks[n] for n in INFERENCE_ORDER if n in self.tasks]

    def training_tasks(self) -> list[TaskRanks]:
        return [self.tasks[n] for n in TRAINING_ORDER if n in self.tasks]

    def describe(self, rank: int) -> str:
        """'rank 2 (device localhost:2; tasks actor_gen)' — how a failure names a worker."""
        return f"rank {rank} (device {self.device_of.get(rank, '?')}; tasks {', '.join(self.tasks_on(rank)) or '-'})"

    def pipeline_ranks(self, task: str, replica: int, tp_index: int) -> tuple[int, ...]:
        t = self.tasks[task]
        return tuple(t.rank_at(replica, s, tp_index) for s in range(t.pp))

    def to_json(self) -> str:
        return json.dumps({name: dataclasses.asdict(t) for name, t in self.tasks.items()})


def _layer_range(tasklet, placement, plan: Plan) -> tuple[int, int]:
    """A tasklet's [layer_start, layer_end); a single-stage tasklet that leaves them 0 holds all layers."""
    if tasklet.layer_end > tasklet.layer_start:
        return tasklet.layer_start, tasklet.layer_end
    return 0, plan.workload_spec().roles()[placement.role].layers
