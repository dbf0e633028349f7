"""The run's process groups by name, like a named device mesh: `groups.tensor(task, replica, stage)`.

Every rank builds them from the same Topology in the same order (torch.distributed requires that
every rank take part in every new_group call, in one order), then asks for a group by what it is —
the TP ranks of a stage, the ranks of a pipeline, the data-parallel peers holding the same shard —
rather than by rank lists; a group of one rank is not created and reads as None.
"""

from __future__ import annotations

import torch.distributed as dist

from hetprof.executor.parallel.topology import Topology
from hetprof.specs.vocabulary import SyncEdge, Task, TaskKind


class ProcessGroups:
    """Named process groups of one run (see the module docstring); build them with `build`."""

    def __init__(self, groups: dict[str, dist.ProcessGroup | None]) -> None:
        self._groups = groups

    # ---- names: one per kind of group -------------------------------------------------------
    @staticmethod
    def tensor_name(task: str, replica: int, stage: int) -> str:
        return f"{task}/tp{replica}.{stage}"

    @staticmethod
    def pipeline_name(task: str, replica: int, tp_index: int) -> str:
        return f"{task}/pp{replica}.{tp_index}"

    @staticmethod
    def data_name(task: str, stage: int, tp_index: int) -> str:
        return f"{task}/dp{stage}.{tp_index}"

    @staticmethod
    def replica_name(task: str, replica: int) -> str:
        return f"{task}/replica{replica}"

    @staticmethod
    def tied_name(task: str, replica: int, tp_index: int) -> str:
        return f"{task}/tie{replica}.{tp_index}"

    @staticmethod
    def sequence_name(task: str, batch_group: int) -> str:
        return f"{task}/sp{batch_group}"

    @staticmethod
    def experts_name(task: str, expert_group: int) -> str:
        return f"{task}/ep{expert_group}"

    @staticmethod
    def expert_peers_name(task: str, place: int) -> str:
        return f"{task}/edp{place}"

    # ---- look-ups ---------------------------------------------------------------------------
    def tensor(self, task: str, replica: int, stage: int) -> dist.ProcessGroup | None:
        """The TP ranks of one stage of one replica (shards of the same layers)."""
        return self._groups.get(self.tensor_name(task, replica, stage))

    def pipeline(self, task: str, replica: int, tp_index: int) -> dist.ProcessGroup | None:
        """One rank per stage of a replica, at the same TP index: a pipeline."""
        return self._groups.get(self.pipeline_name(task, replica, tp_index))

    def data(self, task: str, stage: int, tp_index: int) -> dist.ProcessGroup | None:
        """The ranks holding the same shard in every replica: they average gradients."""
        return self._groups.get(self.data_name(task, stage, tp_index))

    def replica(self, task: str, replica: int) -> dist.ProcessGroup | None:
        """Every rank of one replica (the gradient norm of a sharded model sums over it)."""
        return self._groups.get(self.replica_name(task, replica))

    def tied(self, task: str, replica: int, tp_index: int) -> dist.ProcessGroup | None:
        """First and last stage of a pipeline: their copies of a tied embedding add gradients."""
        return self._groups.get(self.tied_name(task, replica, tp_index))

    def sequence(self, task: str, batch_group: int) -> dist.ProcessGroup | None:
        """The ranks of one Ulysses group (`sp` replicas sharing each sequence: TaskRanks.batch_groups)."""
        return self._groups.get(self.sequence_name(task, batch_group))

    def experts(self, task: str, expert_group: int) -> dist.ProcessGroup | None:
        """The ranks of one EP group (`ep` replicas splitting every MoE layer's experts)."""
        return self._groups.get(self.experts_name(task, expert_group))

    def expert_peers(self, task: str, place: int) -> dist.ProcessGroup | None:
        """The ranks holding the same experts, one per EP group (they average those experts' gradients)."""
        return self._groups.get(self.expert_peers_name(task, place))

    def replicas(self, task: str) -> dist.ProcessGroup | None:
        """The leads of a task's data-parallel replicas (DDP's group for a single-device replica)."""
        return self._groups.get(task)

    def sync(self, edge: str) -> dist.ProcessGroup | None:
        """The trainer's lead and every receiving copy of a weight-sync edge."""
        return self._groups.get(str(edge))

    @property
    def messages(self) -> dist.ProcessGroup | None:
        """Loop messages (None: the default group); a gloo group when the default one is NCCL."""
        return self._groups.get("messages")

    @property
    def reports(self) -> dist.ProcessGroup | None:
        """Per-iteration reports to the leader's record thread."""
        return self._groups.get("reports")

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def build(cls, topo: Topology, backend: str | None = None) -> ProcessGroups:
        """Create one group per task's replicas and per sync edge, the TP, pipeline, data-parallel
        and replica groups of model-parallel tasks, the Ulysses groups of sequence-parallel tasks,
        the EP groups (and a trained task's groups of replicas holding the same experts) of
        expert-parallel tasks, and the message and report groups.

        Every rank calls this with the same topology, so the new_group calls line up.
        """
        groups: dict[str, dist.ProcessGroup | None] = {}
        for t in [*topo.training_tasks(), *topo.inference_tasks()]:
            groups[t.task] = dist.new_group(sorted(t.ranks), backend=backend)
        groups[Task.ACTOR_GEN] = dist.new_group(sorted(topo.generators), backend=backend)
        for t in topo.tasks.values():
            if t.tp > 1 or t.pp > 1:
                _add_model_parallel(groups, topo, t.task, backend)
            if t.sp > 1:
                for g, ranks in enumerate(t.batch_groups):
                    groups[cls.sequence_name(t.task, g)] = dist.new_group(list(ranks), backend=backend)
            if t.ep > 1:
                for g, ranks in enumerate(t.expert_groups):
                    groups[cls.experts_name(t.task, g)] = dist.new_group(list(ranks), backend=backend)
                if t.kind == TaskKind.TRAINING and len(t.expert_groups) > 1:
                    for j, ranks in enumerate(t.expert_peers):
                        groups[cls.expert_peers_name(t.task, j)] = dist.new_group(list(ranks), backend=backend)
        groups[SyncEdge.WEIGHT_SYNC] = dist.new_group(topo.sync_members(SyncEdge.WEIGHT_SYNC), backend=backend)
        everyone = sorted(topo.device_of)
        # Tensor-dict messages match by tag, which gloo honours and NCCL does not (a rank that both
        # generates ahead and serves inference would see its messages cross), so on GPUs they travel
        # over a gloo group through host memory; they are small next to the weights.
        groups["messages"] = dist.new_group(everyone, backend="gloo") if dist.get_backend() == "nccl" else None
        # Reports go to the leader's record thread on a group of their own, so that thread's
        # receives never interleave with the loop's messages.
        groups["reports"] = dist.new_group(everyone, backend="gloo")
        if topo.sync_members(SyncEdge.CRITIC_SYNC):
            groups[SyncEdge.CRITIC_SYNC] = dist.new_group(topo.sync_members(SyncEdge.CRITIC_SYNC), backend=backend)
        return cls(groups)


def _add_model_parallel(groups: dict[str, dist.ProcessGroup | None], topo: Topology, task: str,
                        backend: str | None) -> None:
    """The TP, pipeline, tied-embedding, replica and data-parallel groups of one TP/PP task."""
    t = topo.tasks[task]

    def add(name: str, ranks: list[int]) -> None:
        if len(ranks) > 1:
            groups[name] = dist.new_group(ranks, backend=backend)

    training = t.kind == TaskKind.TRAINING
    replicas = range(len(t.ranks))
    for r in replicas:  # a generation task's replicas may differ in TP: each gets groups of its own degree
        for s in range(t.pp):
            add(ProcessGroups.tensor_name(task, r, s), [t.rank_at(r, s, j) for j in range(t.tp_of(r))])
        for j in range(t.tp_of(r)):
            add(ProcessGroups.pipeline_name(task, r, j), list(topo.pipeline_ranks(task, r, j)))
            if t.pp > 1 and training:
                add(ProcessGroups.tied_name(task, r, j), [t.rank_at(r, 0, j), t.rank_at(r, t.pp - 1, j)])
        if training:
            add(ProcessGroups.replica_name(task, r), list(t.replica_ranks[r]))
    if training:
        for s in range(t.pp):
            for j in range(t.tp):
                add(ProcessGroups.data_name(task, s, j), [t.rank_at(r, s, j) for r in replicas])
