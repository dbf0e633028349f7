"""A rank's part in the run's weight-sync edges: the trainer's lead sends, every receiving copy loads.

Edges (hetprof.specs.vocabulary.SYNC_EDGES): actor_train → actor_gen, and with PPO critic_train →
critic_infer. A sharded trainer's replicas all take part in gathering its full weights first; its
lead then broadcasts them (weightsync.py) and, when it also holds a receiving copy, loads them there.
"""

from __future__ import annotations

import time

import torch

from hetprof.executor.options import RunOptions
from hetprof.executor.parallel.process_groups import ProcessGroups
from hetprof.executor.parallel.topology import Topology
from hetprof.executor.parallel.weightsync import WeightSync, state_digest
from hetprof.executor.records.iteration_report import IterationReport, SyncStats
from hetprof.executor.runners.rank_models import RankModels
from hetprof.specs.vocabulary import SYNC_EDGES, Role, Task


class SyncEdges:
    """The sync edges one rank takes part in, and the actor weight version its generator holds."""

    def __init__(self, options: RunOptions, topo: Topology, groups: ProcessGroups, rank: int,
                 device: torch.device, models: RankModels) -> None:
        self.opts = options
        self.topo = topo
        self.rank = rank
        self.models = models
        self.tasks = topo.tasks_on(rank)
        self.version = 0  # generator: weight version held; leader: optimizer iterations applied
        self.edges: dict[str, WeightSync | None] = {}
        for edge, (role, _, _) in SYNC_EDGES.items():
            members = topo.sync_members(edge)
            if rank not in members:
                self.edges[edge] = None
                continue
            src = topo.sync_source(edge)
            model = models.model_for_sync(role, sender=rank == src)
            self.edges[edge] = WeightSync(
                groups.sync(edge), src, model.named_parameters(), options.bucket_mb, device=device,
                wire_dtype=models.wire_dtype, timeout_s=options.timeout_s,
                members="; ".join(topo.describe(r) for r in members if r != src))

    def sync(self, version: int, report: IterationReport | None) -> None:
        """Run every edge in order; with a report, time each and (--verify-sync) digest the copies."""
        for edge, (role, trainer, _) in SYNC_EDGES.items():
            full = self.models.full_weights(role) if trainer in self.tasks else None  # FSDP: all gather
            sync = self.edges[edge]
            if sync is None:
                continue
            t0 = time.perf_counter()
            if self.rank == sync.src:
                stats = self._send(sync, role, full, version)
            else:
                stats, got = sync.receive(self.models.apply_weights(role), target=self.models.sync_target(role))
                if role == Role.ACTOR:
                    self.version = got
            checks = self.models.weights_arrived(role)
            if report is None:
                continue
            report.timed(edge, t0)
            report.sync[edge] = SyncStats(bytes=stats.bytes, seconds=stats.seconds)
            report.backend_checks.update(checks)
            if self.opts.verify_sync:
                report.digests[edge] = self._digests(sync, role, full)
        if Task.ACTOR_GEN in self.tasks and report is not None:
            report.gen_version = self.version

    def _send(self, sync: WeightSync, role: Role, full: dict[str, torch.Tensor] | None, version: int):
        named = dict(full.items() if full is not None else self.models.model_for_sync(role, True).named_parameters())
        stats = sync.send(named.items(), version)
        if self.models.holds_receiver(role):  # the trainer's own generator (or critic_infer) copy
            self.models.apply_weights(role)({n: t.detach().to(sync.wire_dtype or t.dtype) for n, t in named.items()})
        if role == Role.ACTOR and Task.ACTOR_GEN in self.tasks:
            self.version = version
        return stats

    def _digests(self, sync: WeightSync, role: Role, full: dict[str, torch.Tensor] | None) -> list[str]:
        """The sender's digest (of the full weights a sharded trainer gathered) and this rank's copy's."""
        models = []
        if self.rank == sync.src:
            models.append(full.items() if full is not None
                          else self.models.model_for_sync(role, sender=True).named_parameters())
        if self.models.holds_receiver(role):
            models.append(self.models.model_for_sync(role, sender=False).named_parameters())
        return [state_digest(m, sync.wire_dtype) for m in models]
