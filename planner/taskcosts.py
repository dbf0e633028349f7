"""Seconds and bytes of one task's layout: its replicas' times, its devices' memory, its finish curve.

This is where a whole layout is judged: its replicas priced by `replicas.ReplicaPricer`, the
collectives and optimizer steps the layout adds on top (`layoutcomms`), its devices' memory from
the cost model, and where its data lives. A training layout's data-parallel sharding (none, zero1,
zero2, fsdp) divides its state in memory and sets its collectives in time.

Answers are memoised (planner.memo) on hashable keys (a TaskLayout, a memory question): a search
scores thousands of candidates that share most of their layouts.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from hetprof.costmodels import MemoryEstimate, Placement
from hetprof.planner.basis import PricingBasis
from hetprof.planner.controller import controller_seconds
from hetprof.planner.imbalance import longest_sequence_factor
from hetprof.planner.layoutcomms import (
    dp_traffic,
    expert_link,
    learner_collectives,
    optimizer_steps,
    ulysses_seconds,
)
from hetprof.planner.memo import memoised
from hetprof.planner.passtime import finish_curve
from hetprof.planner.replicas import NO_EXPERTS, Experts, ReplicaCost, ReplicaPricer
from hetprof.specs.layout import TaskLayout
from hetprof.specs.vocabulary import TaskKind

GB = 1e9
EVAL_MEMO = 20_000      # task layouts whose evaluation is kept
MEMORY_MEMO = 200_000   # per-device memory answers kept


@dataclasses.dataclass(frozen=True)
class TaskEval:
    """A task layout, judged: seconds, per-device memory, where its data lives, problems found."""

    seconds: float
    replica_seconds: tuple[float, ...]
    curve: tuple[float, ...]                    # time (from start) by which chunk j of K is done
    memory: dict[str, MemoryEstimate]           # device id -> peak of this task on it
    host_fraction: dict[str, float]             # host -> fraction of the task's data it holds
    violations: tuple[str, ...]
    grad_sync_s: float = 0.0
    host_vector: np.ndarray | None = dataclasses.field(default=None, compare=False, repr=False)  # by LinkTable.index


class TaskCosts:
    """Per-task costs for one PricingBasis; every answer memoised."""

    def __init__(self, basis: PricingBasis) -> None:
        self.basis = basis
        self.replicas = ReplicaPricer(basis)
        self._capacity = {t: basis.catalog.lookup(t).memory_bytes for t in {d.type for d in basis.devices.values()}}

    # ---- one replica (ReplicaPricer's, by device names) ---------------------------------------
    def replica(self, task: str, devices: Sequence[str], tp: int, pp: int, batch: int,
                layer_split: Sequence[int] | None = None) -> ReplicaCost:
        return self.replicas.replica(task, devices, tp, pp, batch, layer_split)

    def replica_seconds(self, task: str, devices: Sequence[str], tp: int, pp: int, batch: int,
                        layer_split: Sequence[int] | None = None) -> float:
        return self.replicas.replica(task, devices, tp, pp, batch, layer_split).seconds

    # ---- memory ---------------------------------------------------------------------------------
    def memory(self, task: str, device_type: str, tp: int, layers: int, batch: int, dp: int = 1,
               sharding: str = "none", ep: int = 1) -> MemoryEstimate:
        """Peak bytes of one device of a replica; a training replica shards its state over `dp` as `sharding`
        says, an MoE model's routed experts over `ep` replicas."""
        dp = min(dp, self.basis.workload.training.shard_group or dp)  # HSDP: a shard group holds one copy
        if sharding == "none" or dp == 1:
            dp, sharding = 1, "none"
        if ep == 1:
            return self._memory(task, device_type, tp, layers, batch, dp, sharding)
        return self._memory(task, device_type, tp, layers, batch, dp, sharding, ep)

    @memoised(MEMORY_MEMO)
    def _memory(self, task: str, device_type: str, tp: int, layers: int, batch: int, dp: int,
                sharding: str, ep: int = 1) -> MemoryEstimate:
        return self.basis.cm.memory(self.basis.work(task, batch, layers),
                                    Placement(device_type, tp, dp=dp, sharding=sharding, ep=ep))

    # ---- a whole task layout --------------------------------------------------------------------
    def batches(self, layout: TaskLayout) -> list[int]:
        """Sequences per replica: the shares of the step's batch (0 for an idle replica)."""
        return [max(1, round(s * self.basis.sequences)) if s > 0 else 0 for s in layout.shares]

    @memoised(EVAL_MEMO)
    def evaluate(self, layout: TaskLayout) -> TaskEval:
        b = self.basis
        task, pp = layout.task, layout.pp
        kind = b.graph.kind_of(task)
        problems: list[str] = []
        replica_s: list[float] = []
        finish: list[tuple[float, ...]] = []
        memory: dict[str, MemoryEstimate] = {}
        host_fraction: dict[str, float] = {}
        over: dict[tuple, list[str]] = {}
        held: dict[tuple, MemoryEstimate] = {}     # GPUs of one type holding the same stage hold the same
        dp = layout.dp
        experts = Experts(layout.ep, expert_link(b, layout)) if layout.ep > 1 else NO_EXPERTS
        for r, (devices, batch) in enumerate(zip(layout.replicas, self.batches(layout), strict=True)):
            split = layout.layer_splits[r]
            # a generation task's replicas may differ in TP; every other task's share `tp`
            tp = max(1, layout.tp_of(r)) if kind == TaskKind.GENERATION else layout.tp
            if batch:
                cost = self.replicas.replica(task, devices, tp, pp, batch, split, experts)
                replica_s.append(cost.seconds)
                finish.append(cost.finish)
                if cost.note and cost.note not in problems:
                    problems.append(f"{task}: {cost.note}")
            else:
                replica_s.append(0.0)
            fraction = layout.shares[r] / len(devices)
            for i, d in enumerate(devices):
                dev = b.devices[d]
                layers = split[i // tp]
                est = held.get((dev.type, tp, layers, batch))
                if est is None:
                    est = held[dev.type, tp, layers, batch] = self.memory(task, dev.type, tp, layers, max(1, batch),
                                                                          dp, layout.sharding, layout.ep)
                memory[d] = est
                if est.total > self._capacity[dev.type]:
                    over.setdefault((dev.type, layers, est), []).append(d)
                host_fraction[dev.host] = host_fraction.get(dev.host, 0.0) + fraction
        problems.extend(self._over_memory(layout, over))
        seconds, grad = self._layout_seconds(layout, kind, replica_s, problems)
        curve = finish_curve(kind, seconds, finish, b.chunks)
        vector = np.zeros(len(b.links.hosts))
        for host, fraction in host_fraction.items():
            vector[b.links.index[host]] = fraction
        return TaskEval(seconds, tuple(replica_s), curve, memory, host_fraction, tuple(problems), grad, vector)

    def _over_memory(self, layout: TaskLayout, over: dict[tuple, list[str]]) -> list[str]:
        """One sentence per (GPU type, stage, estimate) that does not fit, naming what fills the GPU."""
        model = self.basis.graph.model_of(layout.task)
        return [f"{layout.task} needs {est.total / GB:.1f} GB on each of {len(devs)} {dtype_} GPU(s) "
                f"({', '.join(devs[:3])}{', ...' if len(devs) > 3 else ''}) which have "
                f"{self.basis.catalog.lookup(dtype_).memory_bytes / GB:.0f} GB: weights {est.weights / GB:.1f}, grads "
                f"{est.grads / GB:.1f}, optimizer {est.optimizer / GB:.1f}, activations "
                f"{est.activations / GB:.1f}, KV cache {est.kv_cache / GB:.1f} GB with "
                f"{layout.describe()} and {layers} of {model.layers} layers per stage"
                for (dtype_, layers, est), devs in over.items()]

    def _layout_seconds(self, layout: TaskLayout, kind: TaskKind, replica_s: list[float],
                        problems: list[str]) -> tuple[float, float]:
        """The slowest replica plus what the whole layout adds (layoutcomms, the controller), and the
        gradient sync within it. The charges are added in this order: float sums are not associative."""
        b = self.basis
        seconds = max(replica_s) if replica_s else math.inf
        if kind == TaskKind.TRAINING and not b.padded and len(b.lengths):  # padded: priced at the longest
            seconds *= longest_sequence_factor(b.lengths + b.prompt, b.workload.mini_batches,
                                               layout.dp // b.workload.training.sequence_parallel)
        grad = 0.0
        if kind == TaskKind.TRAINING and layout.dp > 1:
            grad = dp_traffic(b, layout, seconds)  # overlaps the passes' compute, not the Adam steps
            seconds += grad
        elif kind == TaskKind.INFERENCE and layout.dp > 1 and layout.sharding == "fsdp":
            seconds += dp_traffic(b, layout, seconds)  # the log-prob pass gathers its leader's shards
        if kind != TaskKind.GENERATION and b.workload.training.sequence_parallel > 1:
            seconds += ulysses_seconds(b, layout, b.workload.training.sequence_parallel, problems)
        if kind == TaskKind.TRAINING:
            seconds += optimizer_steps(b, layout) + learner_collectives(b, layout)
        seconds += controller_seconds(b.catalog, b.workload, layout.task, kind,
                                      {b.devices[d].type for d in layout.devices()})
        return seconds, grad
