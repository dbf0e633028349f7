"""A rank's part in the run's weight-sync edges: the trainer's lead sends, every receiving copy loads.

Edges (hetprof.specs.vocabulary.SYNC_EDGES): actor_train → actor_gen, and with PPO critic_train →
critic_infer. A sharded trainer's replicas all take part in gathering its full weights first; its
lead then broadcasts them (weightsync.py) and, when it also holds a receiving copy, loads them there.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from hetprof.errors import ExecutionError
from hetprof.executor.models.modeling import unwrap
from hetprof.executor.options import RunOptions
from hetprof.executor.parallel.process_groups import ProcessGroups
from hetprof.executor.parallel.topology import Topology
from hetprof.executor.parallel.weightsync import WeightSync, state_digest
from hetprof.executor.records.iteration_report import IterationReport, SyncStats
from hetprof.specs.vocabulary import SYNC_EDGES, Role, Task

if TYPE_CHECKING:
    from hetprof.executor.runners.base import RunnerBase


class SyncEdges:
    """The sync edges one rank takes part in, and the actor weight version its generator holds."""

    def __init__(self, options: RunOptions, topo: Topology, groups: ProcessGroups, rank: int,
                 device: torch.device, runners: dict[str, RunnerBase], wire_dtype: torch.dtype | None) -> None:
        self.opts = options
        self.topo = topo
        self.rank = rank
        self.runners = runners
        self.tasks = topo.tasks_on(rank)
        self.version = 0  # generator: weight version held; leader: optimizer iterations applied
        self.edges: dict[str, WeightSync | None] = {}
        for edge, (_, trainer, receiver) in SYNC_EDGES.items():
            members = topo.sync_members(edge)
            if rank not in members:
                self.edges[edge] = None
                continue
            src = topo.sync_source(edge)
            model = self._runner(trainer if rank == src else receiver).sync_model()
            self.edges[edge] = WeightSync(
                groups.sync(edge), src, model.named_parameters(), options.bucket_mb, device=device,
                wire_dtype=wire_dtype, timeout_s=options.timeout_s,
                members="; ".join(topo.describe(r) for r in members if r != src))

    def sync(self, version: int, report: IterationReport | None) -> None:
        """Run every edge in order; with a report, time each and (--verify-sync) digest the copies."""
        for edge, (role, trainer, receiver) in SYNC_EDGES.items():
            full = self.runners[trainer].full_weights() if trainer in self.runners else None  # FSDP: all gather
            sync = self.edges[edge]
            if sync is None:
                continue
            t0 = time.perf_counter()
            if self.rank == sync.src:
                stats = self._send(sync, edge, full, version)
            else:
                copy = self.runners[receiver]
                stats, got = sync.receive(copy.apply_weights(), target=copy.sync_target())
                if role == Role.ACTOR:
                    self.version = got
            checks = self.runners[receiver].weights_arrived() if receiver in self.runners else {}
            if report is None:
                continue
            report.timed(edge, t0)
            report.sync[edge] = SyncStats(bytes=stats.bytes, seconds=stats.seconds)
            report.backend_checks.update(checks)
            if self.opts.verify_sync:
                report.digests[edge] = self._digests(sync, edge, full)
        if Task.ACTOR_GEN in self.tasks and report is not None:
            report.gen_version = self.version

    def _runner(self, task: str) -> RunnerBase:
        if task not in self.runners:
            raise ExecutionError(f"weight sync: this rank holds no {task} model")
        return self.runners[task]

    def _holds_receiver(self, edge: str) -> bool:
        """Whether this rank holds a copy a sync must overwrite (a separate module from the trainer's)."""
        _, trainer, receiver = SYNC_EDGES[edge]
        if receiver not in self.runners:
            return False
        return trainer not in self.runners or (unwrap(self.runners[trainer].module)
                                               is not unwrap(self.runners[receiver].module))

    def _send(self, sync: WeightSync, edge: str, full: dict[str, torch.Tensor] | None, version: int):
        role, trainer, receiver = SYNC_EDGES[edge]
        named = dict(full.items() if full is not None else self._runner(trainer).sync_model().named_parameters())
        stats = sync.send(named.items(), version)
        if self._holds_receiver(edge):  # the trainer's own generator (or critic_infer) copy
            self.runners[receiver].apply_weights()(
                {n: t.detach().to(sync.wire_dtype or t.dtype) for n, t in named.items()})
        if role == Role.ACTOR and Task.ACTOR_GEN in self.tasks:
            self.version = version
        return stats

    def _digests(self, sync: WeightSync, edge: str, full: dict[str, torch.Tensor] | None) -> list[str]:
        """The sender's digest (of the full weights a sharded trainer gathered) and this rank's copy's."""
        _, trainer, receiver = SYNC_EDGES[edge]
        models = []
        if self.rank == sync.src:
            models.append(full.items() if full is not None else self._runner(trainer).sync_model().named_parameters())
        if self._holds_receiver(edge):
            models.append(self.runners[receiver].sync_model().named_parameters())
        return [state_digest(m, sync.wire_dtype) for m in models]
