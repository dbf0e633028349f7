"""The plan seen as processes: which ranks run each task's replicas and stages, and who leads.

The workers exchange their device ids once; from then on every rank derives the same Topology from
the plan, so every rank builds the same process groups in the same order (process_groups.py), which
torch.distributed requires. Plain data only: nothing here talks to other processes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from hetprof.errors import ExecutionError
from hetprof.specs import Plan, TaskLayout
from hetprof.specs.vocabulary import INFERENCE_ORDER, SYNC_EDGES, TRAINING_ORDER, SyncEdge, Task


@dataclasses.dataclass(frozen=True)
class TaskRanks:
    """One task as processes: its layout (the plan's TaskLayout) with each device's rank in its place.

    `replica_ranks[r]` lists every rank of replica r stage-major, exactly as the layout lists the
    replica's devices; everything else (degrees, shares, layer ranges, TP per replica) is the layout's.
    """

    layout: TaskLayout
    replica_ranks: tuple[tuple[int, ...], ...]  # every rank of each replica (its slice of the batch goes to all)

    @classmethod
    def of(cls, layout: TaskLayout, rank_of: Mapping[str, int]) -> TaskRanks:
        return cls(layout, tuple(tuple(rank_of[d] for d in devices) for devices in layout.replicas))

    @property
    def task(self) -> str:
        return self.layout.task

    @property
    def kind(self) -> str:
        return self.layout.kind

    @property
    def role(self) -> str:
        return self.layout.role

    @property
    def pp(self) -> int:
        return self.layout.pp

    @property
    def tp(self) -> int:
        """The largest TP degree of the task's replicas (every replica's, unless they differ)."""
        return self.layout.tp

    def tp_of(self, replica: int) -> int:
        """Replica `replica`'s TP degree (the layout's)."""
        return self.layout.tp_of(replica)

    @property
    def shares(self) -> tuple[float, ...]:
        return self.layout.shares

    @property
    def sharding(self) -> str:
        """Training state over the replicas: none (DDP), zero2, fsdp (FSDP2)."""
        return self.layout.sharding

    @property
    def stage_layers(self) -> tuple[tuple[tuple[int, int], ...], ...]:
        """Per replica, per stage: the [start, end) of the layers it holds."""
        lay = self.layout
        return tuple(tuple(lay.layer_range(r, s) for s in range(lay.pp)) for r in range(lay.dp))

    @property
    def ranks(self) -> tuple[int, ...]:
        """Each replica's lead (stage 0's first TP rank)."""
        return tuple(replica[0] for replica in self.replica_ranks)

    @property
    def lead_devices(self) -> tuple[str, ...]:
        """Each replica's lead device."""
        return tuple(devices[0] for devices in self.layout.replicas)

    @property
    def lead(self) -> int:
        return self.replica_ranks[0][0]

    @property
    def all_ranks(self) -> tuple[int, ...]:
        return tuple(r for replica in self.replica_ranks for r in replica)

    # ---- who takes which rows: a replica, or with Ulysses `sp` consecutive replicas together ------------
    @property
    def sp(self) -> int:
        """The Ulysses degree: replicas r with the same r // sp run each of their rows together."""
        return self.layout.sp

    @property
    def batch_groups(self) -> tuple[tuple[int, ...], ...]:
        """The ranks that take the same rows of a batch: each replica's, or each `sp` consecutive
        replicas' (a Ulysses group, every rank holding a slice of each sequence)."""
        sp = self.sp
        return tuple(tuple(r for replica in self.replica_ranks[g:g + sp] for r in replica)
                     for g in range(0, len(self.replica_ranks), sp))

    @property
    def batch_shares(self) -> tuple[float, ...]:
        """Each batch group's share of a batch: its replicas' shares together."""
        sp = self.sp
        return tuple(sum(self.shares[g:g + sp]) for g in range(0, len(self.shares), sp))

    @property
    def batch_leads(self) -> tuple[int, ...]:
        """Each batch group's first rank: it sends the group's result and reports its work."""
        return tuple(group[0] for group in self.batch_groups)

    def batch_group_of(self, rank: int) -> int:
        return self.replica_of(rank) // self.sp

    # ---- expert parallelism: `ep` consecutive whole-model replicas split every MoE layer's experts ----
    @property
    def ep(self) -> int:
        return self.layout.ep

    @property
    def expert_groups(self) -> tuple[tuple[int, ...], ...]:
        """The ranks of each EP group: `ep` consecutive replicas, each holding 1/ep of the experts."""
        ep = self.ep
        return tuple(tuple(r for replica in self.replica_ranks[g:g + ep] for r in replica)
                     for g in range(0, len(self.replica_ranks), ep))

    @property
    def expert_peers(self) -> tuple[tuple[int, ...], ...]:
        """For each place j in an EP group, the ranks at j in every group: they hold the same experts."""
        return tuple(tuple(group[j] for group in self.expert_groups) for j in range(self.ep))

    def expert_group_of(self, rank: int) -> int:
        return self.replica_of(rank) // self.ep

    def expert_place_of(self, rank: int) -> int:
        """Where `rank` sits in its EP group (which experts it holds)."""
        return self.replica_of(rank) % self.ep

    def replica_of(self, rank: int) -> int:
        for i, replica in enumerate(self.replica_ranks):
            if rank in replica:
                return i
        raise ValueError(f"rank {rank} runs no replica of {self.task}")

    def position(self, rank: int) -> tuple[int, int, int]:
        """(replica, stage, TP index) of a rank of this task."""
        replica = self.replica_of(rank)
        i = self.replica_ranks[replica].index(rank)
        tp = self.tp_of(replica)
        return replica, i // tp, i % tp

    def rank_at(self, replica: int, stage: int, tp_index: int) -> int:
        return self.replica_ranks[replica][stage * self.tp_of(replica) + tp_index]


class Topology:
    """The plan seen as ranks: which tasks each rank runs, who leads, who takes part in each group."""

    def __init__(self, plan: Plan, rank_of: dict[str, int]):
        self.plan = plan
        self.rank_of = rank_of
        self.device_of = {r: d for d, r in rank_of.items()}
        self.tasks: dict[str, TaskRanks] = {}
        for t in plan.tasks:
            missing = [d for d in t.layout.devices() if d not in rank_of]
            if missing:
                raise ExecutionError(f"task {t.task}: no worker runs device(s) {missing}")
            self.tasks[t.task] = TaskRanks.of(t.layout, rank_of)
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
