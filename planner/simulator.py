"""The plan simulator: the single source of truth every search and baseline is scored by.

A candidate (task groups, their GPUs, every task's layout) becomes a predicted steady-state
iteration time, its critical-path breakdown, per-device memory peaks, $ per iteration and a
timeline. The pieces: `structure` checks the candidate is well-formed, `taskcosts` prices each task
layout with the cost model over the real links, `residency` finds what colocated tasks hold and
offload, `transfers` prices every cross-group edge on the links between the hosts that hold the
data, and `schedule` plays several iterations on the groups (sync, or async with staleness k;
streaming). Searches see the simulator only through its `planning` context (planner.planning).

Scores are memoised per candidate and task layouts per layout (planner.memo), so a search that
revisits or mutates candidates pays only for what changed.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence

import numpy as np

from hetprof.costmodels import LinkSpec
from hetprof.errors import InfeasibleError
from hetprof.planner.basis import PricingBasis
from hetprof.planner.candidate import Candidate
from hetprof.planner.engines import default_backend
from hetprof.planner.fits import check_fits
from hetprof.planner.graph import build_graph
from hetprof.planner.links import LinkTable, measured_device_link
from hetprof.planner.memo import memoised
from hetprof.planner.planning import PlanningContext
from hetprof.planner.residency import GroupMemory
from hetprof.planner.schedule import Event, ScheduleInput, simulate
from hetprof.planner.score import OBJECTIVES, Score, objective_value
from hetprof.planner.structure import StructureCheck
from hetprof.planner.taskcosts import TaskCosts, TaskEval
from hetprof.planner.transfers import Transfers
from hetprof.specs import FOLLOWS, GENERATION_BACKENDS, ClusterSpec, WorkloadSpec
from hetprof.specs.executable import priced_streaming, workload_problems
from hetprof.specs.layout import TaskLayout
from hetprof.specs.precision import require_fp8

CHUNKS = 8          # streaming granularity: a step's samples flow between groups in this many chunks
SCORE_MEMO = 20_000   # candidates whose score is kept

__all__ = ["OBJECTIVES", "Event", "Score", "Simulator"]


class Simulator:
    """Predicts iteration time, memory and cost of candidates for one cluster, workload and cost model."""

    def __init__(self, cluster: ClusterSpec, workload: WorkloadSpec, cost_model, seed: int = 0, db=None,
                 streaming: bool | None = None, chunks: int = CHUNKS, executable: bool = False,
                 backend: str | None = None) -> None:
        self.cluster = cluster
        self.backend = backend or default_backend(cluster)
        if self.backend not in GENERATION_BACKENDS:
            raise InfeasibleError(f"generation backend {self.backend!r} is not one of {', '.join(GENERATION_BACKENDS)}")
        # Plan only layouts `hetprof run` carries out (hetprof/specs/executable.py); off, any layout
        # the model allows (what-if studies of other runtimes, the published systems' search spaces).
        self.executable = executable
        for problem in workload_problems(workload) if executable else ():
            raise InfeasibleError(f"{problem}; plan it with --any-layout (a what-if) or leave it out")
        self.workload = workload
        self.cost_model = cost_model
        self.seed = seed
        # streaming by default only where the run streams (hetprof/specs/executable.py); given, as told
        self.streaming = priced_streaming(executable) if streaming is None else streaming
        self.graph = build_graph(workload)
        # The tasks a search places; a follower (FOLLOWS) runs on its leader's workers with its layout.
        self.tasks: list[str] = [t for t in self.graph.tasks if t not in FOLLOWS]
        self.catalog = cluster.catalog  # GPU types: the built-in catalog plus the spec's gpu_types
        self.devices = {d.id: d for d in cluster.devices()}
        require_fp8(workload.precision, {t: self.catalog.lookup(t).fp8_tflops for t in {d.type for d in self.devices.values()}})
        self.links = LinkTable(cluster, db, local_link=measured_device_link(cost_model))
        lengths = workload.response_len.sample(workload.sequences_per_step, np.random.default_rng(seed))
        # planning for `hetprof run`: price the padded widths it runs (PricingBasis says how)
        self.costs = TaskCosts(PricingBasis(cost_model, self.graph, workload, self.devices, self.links, lengths,
                                            chunks, runs_padded=executable, backend=self.backend))
        # (ClusterSpec.price_per_hour looks a host up by expanding the spec; once per host is enough.)
        host_price = {h.name: h.price_per_hour if h.price_per_hour is not None else self.catalog.lookup(h.gpus.type).price_per_hour
                      for h in cluster.expanded_hosts()}
        self.price = {d: host_price[dev.host] for d, dev in self.devices.items()}
        self.capacity = {d: self.catalog.lookup(dev.type).memory_bytes for d, dev in self.devices.items()}
        self.staleness = workload.staleness if workload.mode == "async" else 0
        self.structure = StructureCheck(self.graph, self.tasks, self.devices, cluster.name, workload.algorithm,
                                        executable, packed=workload.training.max_tokens_per_microbatch is not None,
                                        backend=self.backend)
        self.group_memory = GroupMemory(self.costs, self.devices, self.capacity, cost_model)
        self.transfers = Transfers(self.costs, self.graph, workload, self.devices, self.links, cost_model,
                                   self.backend)
        self.evaluations = 0   # candidates scored (memo hits not counted)

    @functools.cached_property
    def planning(self) -> PlanningContext:
        """What a search may read and call of this problem (planner.planning)."""
        return PlanningContext(cluster=self.cluster, workload=self.workload, tasks=tuple(self.tasks), seed=self.seed,
                               executable=self.executable, devices=self.devices, catalog=self.catalog,
                               links=self.links, cost_model=self.cost_model, _graph=self.graph, _costs=self.costs,
                               _score=self.evaluate, _rebuild=lambda cluster: self.on_cluster(cluster).planning)

    def on_cluster(self, cluster: ClusterSpec) -> Simulator:
        """A simulator of the same problem on another cluster (the same lengths seed and settings, and
        the same kind of simulator: a sub-cluster search keeps a targeted simulator's restriction)."""
        return type(self)(cluster, self.workload, self.cost_model, seed=self.seed, streaming=self.streaming,
                         executable=self.executable, backend=self.backend)

    # ---- the contract's helpers -----------------------------------------------------------------
    def link(self, dev_a: str, dev_b: str) -> LinkSpec:
        """The link between two devices' hosts: measured (profile DB) over the spec."""
        return self.links.between(self._device(dev_a).host, self._device(dev_b).host)

    def replica_seconds(self, task: str, devices: Sequence[str], tp: int, pp: int, batch: int,
                        layer_split: Sequence[int] | None = None, cp: int = 1) -> float:
        """One replica's seconds for `batch` sequences of `task` on these devices (what balancers equalise)."""
        return self.planning.replica_seconds(task, devices, tp, pp, batch, layer_split, cp)

    def task_eval(self, layout: TaskLayout) -> TaskEval:
        return self.costs.evaluate(layout)

    def objective_value(self, score: Score, objective: str, budget: float | None = None) -> float:
        """Lower is better. Budget is $/hour for the candidate's GPUs."""
        return objective_value(score, objective, budget)

    def structure_problems(self, cand: Candidate) -> list[str]:
        """Everything that makes a candidate malformed, as sentences (empty when well-formed)."""
        return self.structure.problems(cand)

    def _device(self, d: str):
        try:
            return self.devices[d]
        except KeyError:
            raise InfeasibleError(f"device {d!r} is not part of cluster {self.cluster.name!r}") from None

    # ---- scoring --------------------------------------------------------------------------------
    @memoised(SCORE_MEMO)
    def evaluate(self, candidate: Candidate) -> Score:
        self.evaluations += 1
        problems = self.structure.problems(candidate)
        return self._infeasible(candidate, problems) if problems else self._score(candidate)

    def _infeasible(self, candidate: Candidate, problems: list[str], **kw) -> Score:
        price = sum(self.price.get(d, 0.0) for d in sorted(set(candidate.devices())))
        return Score(math.inf, False, tuple(problems), price_per_hour=price, **kw)

    def with_followers(self, cand: Candidate) -> tuple[dict[str, TaskLayout], tuple[tuple[str, ...], ...]]:
        """Every task's layout and the groups, followers added beside their leaders (in workflow order)."""
        layouts = cand.layout_map()
        groups = [list(g) for g in cand.groups]
        for follower, leader in FOLLOWS.items():
            if follower in self.graph.tasks and leader in layouts:
                layouts[follower] = dataclasses.replace(layouts[leader], task=follower)  # its leader's shards
                groups[cand.group_of(leader)].append(follower)
        order = self.graph.tasks
        return layouts, tuple(tuple(sorted(g, key=order.index)) for g in groups)

    def _score(self, cand: Candidate) -> Score:
        layouts, cand_groups = self.with_followers(cand)
        tasks_all = list(self.graph.tasks)
        evals = {t: self.costs.evaluate(layouts[t]) for t in tasks_all}
        group_of = {t: i for i, g in enumerate(cand_groups) for t in g}
        problems = [p for t in tasks_all for p in evals[t].violations]
        peaks: dict[str, float] = {}
        swap: dict[str, tuple[float, float]] = {}
        for i, tasks in enumerate(cand_groups):
            g_peak, g_swap, g_problems = self.group_memory.residency(tuple(layouts[t] for t in tasks),
                                                                     i in cand.offload)
            peaks.update(g_peak)
            swap.update(g_swap)
            problems.extend(g_problems)
        task_seconds = {t: evals[t].seconds for t in tasks_all}
        for d in cand.devices():
            peaks.setdefault(d, 0.0)
        headroom: dict[str, float] = {}
        for d, peak in peaks.items():
            t = self.devices[d].type
            headroom[t] = min(headroom.get(t, math.inf), self.capacity[d] - peak)
        if problems or not all(math.isfinite(s) for s in task_seconds.values()):
            endless = [t for t, v in task_seconds.items() if not math.isfinite(v)]
            problems = problems or [f"the cost model gives {', '.join(endless)} no finite time on these GPUs"]
            return self._infeasible(cand, problems, task_seconds=task_seconds,
                                    memory_peak=peaks, memory_headroom=headroom)
        forward, transfer_s = [], {}
        for edge in self.graph.edges:
            if edge.backward:
                continue
            seconds = 0.0
            if group_of[edge.src] != group_of[edge.dst]:
                seconds = self.transfers.edge_seconds(edge, layouts[edge.src], layouts[edge.dst])
                transfer_s[edge.name] = seconds
            forward.append((edge, seconds))
        weights = []
        for edge in self.graph.backward_edges():
            seconds = self.transfers.weight_sync_seconds(edge, layouts[edge.src], layouts[edge.dst])
            transfer_s[edge.name] = seconds
            weights.append((edge, seconds))
        schedule = ScheduleInput(
            tasks=tuple(tasks_all), group_of=group_of, curve={t: evals[t].curve for t in tasks_all},
            swap=swap, forward=tuple(forward), weights=tuple(weights), staleness=self.staleness,
            streaming=self.streaming, iterations=self.staleness + 4,
            group_devices=dict(enumerate(cand.group_devices)),
            task_devices={t: layouts[t].devices() for t in tasks_all})
        result = simulate(schedule)
        it = result.iteration_s
        price = sum(self.price[d] for d in sorted(set(cand.devices())))
        bottleneck = max(result.breakdown.items(), key=lambda kv: kv[1])[0] if result.breakdown else ""
        return Score(
            iteration_s=it, feasible=True, violations=(), breakdown=result.breakdown, bottleneck=bottleneck,
            task_seconds=task_seconds, memory_peak=peaks, memory_headroom=headroom,
            cost_per_iteration=price * it / 3600.0, throughput=self.workload.sequences_per_step / it if it > 0 else 0.0,
            price_per_hour=price, offload_s={t: a + b for t, (a, b) in swap.items() if a + b > 0},
            transfer_s=transfer_s, schedule=schedule)

    # ---- up-front feasibility -------------------------------------------------------------------
    def check_fits(self, max_tp: int = 8, max_pp: int = 4) -> None:
        """Raise InfeasibleError if some task fits on no GPU type of the cluster (planner/fits.py)."""
        check_fits(self.planning, max_tp, max_pp)
