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
from hetprof.costmodels.memory import fitting_micro_tokens
from hetprof.planner.basis import PricingBasis
from hetprof.planner.controller import controller_seconds
from hetprof.planner.imbalance import longest_sequence_factor
from hetprof.planner.layoutcomms import (
    dp_traffic,
    expert_link,
    learner_collectives,
    optimizer_steps,
    ring_seconds,
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
        self._capacity_of = lambda t: self._capacity.get(t) or basis.catalog.lookup(t).memory_bytes

    # ---- one replica (ReplicaPricer's, by device names) ---------------------------------------
    def replica(self, task: str, devices: Sequence[str], tp: int, pp: int, batch: int,
                layer_split: Sequence[int] | None = None, cp: int = 1) -> ReplicaCost:
        return self.replicas.replica(task, devices, tp, pp, batch, layer_split, cp)

    def replica_seconds(self, task: str, devices: Sequence[str], tp: int, pp: int, batch: int,
                        layer_split: Sequence[int] | None = None, cp: int = 1) -> float:
        return self.replicas.replica(task, devices, tp, pp, batch, layer_split, cp).seconds

    # ---- memory ---------------------------------------------------------------------------------
    def memory(self, task: str, device_type: str, tp: int, layers: int, batch: int, dp: int = 1,
               sharding: str = "none", sp: int | None = None, cp: int = 1, ep: int = 1) -> MemoryEstimate:
        """Peak bytes of one device of a replica; a training replica shards its state over `dp` as `sharding`
        says; `sp` Ulysses ranks (None: the workload's fixed degree) and `cp` context-parallel ranks share
        each sequence; an MoE model's routed experts are split over `ep` replicas. Padded micro-batches are
        as large as fits (`micro_tokens`)."""
        return self._memory(task, device_type, tp, layers, batch, *self._held(dp, sharding), sp, cp, ep)[1]

    def micro_tokens(self, task: str, device_type: str, tp: int, layers: int, batch: int, dp: int = 1,
                     sharding: str = "none", sp: int | None = None, cp: int = 1, ep: int = 1) -> int | None:
        """The padded micro-batch's token budget the planner gives a device of this replica: the largest
        of memory.micro_token_choices that fits it (None: the workload packs by its own budget, or the
        task generates)."""
        return self._memory(task, device_type, tp, layers, batch, *self._held(dp, sharding), sp, cp, ep)[0]

    def _held(self, dp: int, sharding: str) -> tuple[int, str]:
        dp = min(dp, self.basis.workload.training.shard_group or dp)  # HSDP: a shard group holds one copy
        return (1, "none") if sharding == "none" or dp == 1 else (dp, sharding)

    @memoised(MEMORY_MEMO)
    def _memory(self, task: str, device_type: str, tp: int, layers: int, batch: int, dp: int,
                sharding: str, sp: int | None, cp: int, ep: int = 1) -> tuple[int | None, MemoryEstimate]:
        b = self.basis
        place = Placement(device_type, tp, dp=dp, sharding=sharding, ep=ep)
        if b.token_budget is not None or b.graph.kind_of(task) == TaskKind.GENERATION:
            return None, b.cm.memory(b.work(task, batch, layers, sp=sp, cp=cp), place)
        work = b.work(task, batch, layers, sp=sp, cp=cp)
        return fitting_micro_tokens(lambda m: b.cm.memory(dataclasses.replace(work, micro_tokens=m), place),
                                    self._capacity_of(device_type), work.seq_len, work.sp * work.cp)

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
        dp, sp, cp = layout.dp, b.sp_of(layout), layout.cp
        experts = Experts(layout.ep, expert_link(b, layout), layout.etp) if layout.expert_ranks > 1 else NO_EXPERTS
        for r, (devices, batch) in enumerate(zip(layout.replicas, self.batches(layout), strict=True)):
            split = layout.layer_splits[r]
            # a generation task's replicas may differ in TP; every other task's share `tp`
            tp = max(1, layout.tp_of(r)) if kind == TaskKind.GENERATION else layout.tp
            if batch:
                cost = self.replicas.replica(task, devices, tp, pp, batch, split, cp, experts)
                replica_s.append(cost.seconds)
                finish.append(cost.finish)
                if cost.note and cost.note not in problems:
                    problems.append(f"{task}: {cost.note}")
            else:
                replica_s.append(0.0)
            fraction = layout.shares[r] / len(devices)
            for i, d in enumerate(devices):
                dev = b.devices[d]
                layers = split[i // (tp * cp)]
                est = held.get((dev.type, tp, layers, batch))
                if est is None:
                    est = held[dev.type, tp, layers, batch] = self.memory(task, dev.type, tp, layers, max(1, batch),
                                                                          dp, layout.sharding, sp, cp, layout.ep)
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
        sp = b.sp_of(layout)
        seconds = max(replica_s) if replica_s else math.inf
        if kind == TaskKind.TRAINING and not b.padded and len(b.lengths):  # padded: priced at the longest
            seconds *= longest_sequence_factor(b.lengths + b.prompt, b.workload.mini_batches, max(1, layout.dp // sp))
        grad = 0.0
        if kind == TaskKind.TRAINING and layout.dp * layout.cp > 1:
            grad = dp_traffic(b, layout, seconds)  # overlaps the passes' compute, not the Adam steps
            seconds += grad
        elif kind == TaskKind.INFERENCE and layout.dp > 1 and layout.sharding == "fsdp":
            seconds += dp_traffic(b, layout, seconds)  # the log-prob pass gathers its leader's shards
        if kind != TaskKind.GENERATION and sp > 1:
            seconds += ulysses_seconds(b, layout, sp, problems)
        if kind != TaskKind.GENERATION and layout.cp > 1:
            seconds += ring_seconds(b, layout)
        if kind == TaskKind.TRAINING:
            seconds += optimizer_steps(b, layout) + learner_collectives(b, layout)
        seconds += controller_seconds(b.catalog, b.workload, layout.task, kind,
                                      {b.devices[d].type for d in layout.devices()})
        return seconds, grad
