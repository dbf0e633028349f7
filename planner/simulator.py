"""The plan simulator: the single source of truth every search and baseline is scored by.

A candidate (task groups, their GPUs, every task's layout) becomes a predicted steady-state
iteration time, its critical-path breakdown, per-device memory peaks, $ per iteration and a
timeline. The pieces: `taskcosts` prices each task layout with the cost model over the real links,
this module checks structure and memory (colocated tasks offload between phases when they do not
fit together), prices every cross-group edge on the links between the hosts that hold the data,
and `schedule` plays several iterations on the groups (sync, or async with staleness k; streaming).

Scores are memoised per candidate and task layouts per layout, so a search that revisits or
mutates candidates pays only for what changed.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections import Counter
from collections.abc import Sequence

import numpy as np

from hetprof.costmodels import LinkSpec
from hetprof.errors import InfeasibleError
from hetprof.planner.candidate import Candidate
from hetprof.planner.engines import default_backend
from hetprof.planner.fits import check_fits
from hetprof.planner.graph import Edge, build_graph
from hetprof.planner.links import LinkTable, measured_device_link
from hetprof.planner.schedule import Event, ScheduleInput, simulate, timeline
from hetprof.planner.taskcosts import TaskCosts, TaskEval
from hetprof.specs import FOLLOWS, GENERATION_BACKENDS, SHARDING, ClusterSpec, WorkloadSpec, executable
from hetprof.specs.executable import workload_problems
from hetprof.specs.layout import TaskLayout
from hetprof.specs.vocabulary import TaskKind

OBJECTIVES = ("throughput", "cost", "throughput-under-budget")
CHUNKS = 8          # streaming granularity: a step's samples flow between groups in this many chunks
MEMO_LIMIT = 20_000   # scores (and layout evaluations) kept before the memo is emptied

__all__ = ["OBJECTIVES", "Event", "Score", "Simulator"]


@dataclasses.dataclass(frozen=True)
class Score:
    """What the simulator says about one candidate (see docs/CONTRACTS.md, "Planner internals")."""

    iteration_s: float
    feasible: bool
    violations: tuple[str, ...] = ()
    breakdown: dict[str, float] = dataclasses.field(default_factory=dict)
    bottleneck: str = ""
    task_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    memory_peak: dict[str, float] = dataclasses.field(default_factory=dict)
    memory_headroom: dict[str, float] = dataclasses.field(default_factory=dict)
    cost_per_iteration: float = math.inf
    throughput: float = 0.0
    price_per_hour: float = 0.0
    offload_s: dict[str, float] = dataclasses.field(default_factory=dict)
    transfer_s: dict[str, float] = dataclasses.field(default_factory=dict)
    schedule: ScheduleInput | None = dataclasses.field(default=None, repr=False, compare=False)

    def __hash__(self) -> int:
        return hash((self.iteration_s, self.feasible, self.violations))

    @functools.cached_property
    def timeline(self) -> tuple[Event, ...]:
        """Events of one steady-state iteration for the Gantt chart (replayed on first use)."""
        return timeline(self.schedule) if self.schedule is not None else ()


class Simulator:
    """Predicts iteration time, memory and cost of candidates for one cluster, workload and cost model."""

    def __init__(self, cluster: ClusterSpec, workload: WorkloadSpec, cost_model, seed: int = 0, db=None,
                 streaming: bool = True, chunks: int = CHUNKS, executable: bool = False,
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
        self.streaming = streaming
        self.graph = build_graph(workload)
        # The tasks a search places; a follower (FOLLOWS) runs on its leader's workers with its layout.
        self.tasks: list[str] = [t for t in self.graph.tasks if t not in FOLLOWS]
        self.catalog = cluster.catalog  # GPU types: the built-in catalog plus the spec's gpu_types
        self.devices = {d.id: d for d in cluster.devices()}
        self.links = LinkTable(cluster, db, local_link=measured_device_link(cost_model))
        lengths = workload.response_len.sample(workload.sequences_per_step, np.random.default_rng(seed))
        # planning for `hetprof run`: price the padded widths it runs (TaskCosts says how)
        self.costs = TaskCosts(cost_model, self.graph, workload, self.devices, self.links, lengths, chunks,
                               padded=executable, backend=self.backend)
        # (ClusterSpec.price_per_hour looks a host up by expanding the spec; once per host is enough.)
        host_price = {h.name: h.price_per_hour if h.price_per_hour is not None else self.catalog.lookup(h.gpus.type).price_per_hour
                      for h in cluster.expanded_hosts()}
        self.price = {d: host_price[dev.host] for d, dev in self.devices.items()}
        self.capacity = {d: self.catalog.lookup(dev.type).memory_bytes for d, dev in self.devices.items()}
        self.staleness = workload.staleness if workload.mode == "async" else 0
        self._scores: dict[Candidate, Score] = {}
        self._residency: dict[tuple, tuple] = {}
        self._edges: dict[tuple, float] = {}
        self._layout_checks: dict[tuple, list[str]] = {}
        self.evaluations = 0

    # ---- the contract's helpers -----------------------------------------------------------------
    def link(self, dev_a: str, dev_b: str) -> LinkSpec:
        """The link between two devices' hosts: measured (profile DB) over the spec."""
        return self.links.between(self._device(dev_a).host, self._device(dev_b).host)

    def replica_seconds(self, task: str, devices: Sequence[str], tp: int, pp: int, batch: int,
                        layer_split: Sequence[int] | None = None) -> float:
        """One replica's seconds for `batch` sequences of `task` on these devices (what balancers equalise)."""
        for d in devices:
            self._device(d)
        return self.costs.replica_seconds(task, tuple(devices), tp, pp, int(batch), layer_split)

    def task_eval(self, layout: TaskLayout) -> TaskEval:
        return self.costs.evaluate(layout)

    def objective_value(self, score: Score, objective: str, budget: float | None = None) -> float:
        """Lower is better. Budget is $/hour for the candidate's GPUs."""
        if objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {objective!r} (one of {', '.join(OBJECTIVES)})")
        if not score.feasible:
            return math.inf
        if objective == "cost":
            return score.cost_per_iteration
        if objective == "throughput-under-budget" and budget is not None and score.price_per_hour > budget + 1e-9:
            return math.inf
        return score.iteration_s

    def _device(self, d: str):
        try:
            return self.devices[d]
        except KeyError:
            raise InfeasibleError(f"device {d!r} is not part of cluster {self.cluster.name!r}") from None

    # ---- scoring --------------------------------------------------------------------------------
    def evaluate(self, candidate: Candidate) -> Score:
        hit = self._scores.get(candidate)
        if hit is not None:
            return hit
        self.evaluations += 1
        problems = self.structure_problems(candidate)
        score = self._infeasible(candidate, problems) if problems else self._score(candidate)
        if len(self._scores) >= MEMO_LIMIT:
            self._scores.clear()
        self._scores[candidate] = score
        return score

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
            g_peak, g_swap, g_problems = self._group_residency(tuple(layouts[t] for t in tasks), i in cand.offload)
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
                seconds = self._edge_seconds(edge, layouts[edge.src], layouts[edge.dst], evals)
                transfer_s[edge.name] = seconds
            forward.append((edge, seconds))
        weights = []
        for edge in self.graph.backward_edges():
            seconds = self._weight_sync_seconds(edge, layouts[edge.src], layouts[edge.dst])
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

    # ---- structure ------------------------------------------------------------------------------
    def structure_problems(self, cand: Candidate) -> list[str]:
        """Everything that makes a candidate malformed, as sentences (empty when well-formed)."""
        out: list[str] = []
        expected = set(self.tasks)
        grouped = [t for g in cand.groups for t in g]
        for t in sorted(set(grouped) - expected):
            out.append(f"task {t!r} is not part of this {self.workload.algorithm} workload ({', '.join(self.tasks)})")
        for t in self.tasks:
            n = grouped.count(t)
            if n != 1:
                out.append(f"task {t} is in {n} groups; every task must be in exactly one")
        if len(cand.groups) != len(cand.group_devices):
            out.append(f"{len(cand.groups)} groups but {len(cand.group_devices)} device lists")
            return out
        owner: dict[str, int] = {}
        for gi, devs in enumerate(cand.group_devices):
            if not devs:
                out.append(f"group {gi} ({', '.join(cand.groups[gi])}) has no devices")
            for d in devs:
                if d not in self.devices:
                    out.append(f"group {gi} names device {d!r}, which is not in cluster {self.cluster.name!r}")
                elif d in owner and owner[d] != gi:
                    out.append(f"device {d} is in groups {owner[d]} and {gi}; groups must not share devices")
                owner.setdefault(d, gi)
        names = dict(cand.layouts)
        for gi, tasks in enumerate(cand.groups):
            for t in tasks:
                if t not in expected:
                    continue
                lay = names.get(t)
                if lay is None:
                    out.append(f"task {t} has no layout")
                    continue
                key = (lay, cand.group_devices[gi], gi)
                found = self._layout_checks.get(key)
                if found is None:
                    if len(self._layout_checks) >= MEMO_LIMIT:
                        self._layout_checks.clear()
                    found = self._layout_checks[key] = self._layout_problems(lay, set(cand.group_devices[gi]), gi)
                out.extend(found)
        return out

    def _layout_problems(self, lay: TaskLayout, group: set[str], gi: int) -> list[str]:
        out: list[str] = []
        t = lay.task
        layers = self.graph.model_of(t).layers
        if lay.tp < 1 or lay.pp < 1:
            return [f"{t}: tp and pp must be >= 1 (got tp={lay.tp}, pp={lay.pp})"]
        if lay.dp < 1:
            return [f"{t}: a layout needs at least one replica"]
        if lay.pp > layers:
            out.append(f"{t}: pp={lay.pp} exceeds the model's {layers} layers")
        seen: set[str] = set()
        own_tp = self.graph.kind_of(t) == TaskKind.GENERATION  # only rollout replicas may differ in TP
        for r, devs in enumerate(lay.replicas):
            tp = len(devs) // lay.pp if own_tp else lay.tp  # at most the layout's largest degree, tp
            if not 1 <= tp <= lay.tp or len(devs) != tp * lay.pp:
                out.append(f"{t}: replica {r} has {len(devs)} devices, tp*pp = {lay.tp * lay.pp} expected")
            for d in devs:
                if d not in group:
                    out.append(f"{t}: replica {r} uses {d}, which is not a device of its group {gi}")
                if d in seen:
                    out.append(f"{t}: device {d} appears twice in the layout")
                seen.add(d)
        if len(lay.shares) != lay.dp or any(s < 0 or not math.isfinite(s) for s in lay.shares):
            out.append(f"{t}: {len(lay.shares)} batch shares for {lay.dp} replicas (need one non-negative share each)")
        elif not math.isclose(sum(lay.shares), 1.0, abs_tol=1e-6):
            out.append(f"{t}: batch shares sum to {sum(lay.shares):.6f}, not 1")
        if len(lay.layer_splits) != lay.dp:
            out.append(f"{t}: {len(lay.layer_splits)} layer splits for {lay.dp} replicas")
        else:
            for r, split in enumerate(lay.layer_splits):
                if len(split) != lay.pp or any(x < 1 for x in split) or sum(split) != layers:
                    out.append(f"{t}: replica {r}'s layer split {list(split)} is not {lay.pp} positive stages "
                               f"summing to {layers} layers")
        if lay.sharding not in SHARDING:
            out.append(f"{t}: unknown sharding {lay.sharding!r} (one of {', '.join(SHARDING)})")
        elif lay.sharding != "none" and self.graph.kind_of(t) != TaskKind.TRAINING:
            out.append(f"{t}: {lay.sharding} sharding on a {self.graph.kind_of(t)} task (only training shards its state)")
        if self.executable:
            out.extend(f"{p} (`hetprof run` would refuse it; plan with --any-layout to allow it)"
                       for tp in sorted(set(lay.tp_degrees()))
                       for p in executable.layout_problems(t, self.graph.kind_of(t), self.graph.model_of(t), tp,
                                                           lay.pp, lay.layer_splits, lay.describe(), lay.sharding))
        return out

    # ---- memory of colocated tasks --------------------------------------------------------------
    def _group_residency(self, layouts: tuple[TaskLayout, ...], offload: bool = False) -> tuple:
        """Per device: peak bytes, and whether the group's tasks must offload between phases.

        Tasks that share a device keep their weights/optimizer state resident when everything fits
        (only one task's activations or KV cache live at a time); otherwise — or when the group
        offloads by configuration, as verl's hybrid engine does every step whatever fits — each task
        reloads its state before it runs and offloads it after, over the host link.
        A follower (the log-prob pass) reads its leader's weights: it adds only its working set.
        """
        key = (layouts, offload)
        hit = self._residency.get(key)
        if hit is not None:
            return hit
        if len(self._residency) >= MEMO_LIMIT:
            self._residency.clear()
        per_device: dict[str, list[tuple[str, object]]] = {}
        for lay in layouts:
            for d, est in self.costs.evaluate(lay).memory.items():
                per_device.setdefault(d, []).append((lay.task, est))
        peaks: dict[str, float] = {}
        swap: dict[str, float] = {}
        problems: list[str] = []
        for d, items in per_device.items():
            cap = self.capacity[d]
            here = {t for t, _ in items}
            own = [(t, e) for t, e in items if FOLLOWS.get(t) not in here]
            resident = sum(e.offloadable for _, e in own) + max(e.total - e.offloadable for _, e in items)
            if len(items) == 1 or (resident <= cap and not offload):
                peaks[d] = resident if len(items) > 1 else items[0][1].total
                continue
            peaks[d] = max(e.total for _, e in items)
            dtype_ = self.devices[d].type
            held = dict(items)
            for task, e in items:  # a follower reloads the weights its leader holds (shards, if sharded)
                moved = held[FOLLOWS[task]].weights if FOLLOWS.get(task) in held else e.offloadable
                swap[task] = max(swap.get(task, 0.0), self.cost_model.host_transfer_time(moved, dtype_))
        out = (peaks, {t: (s, s) for t, s in swap.items()}, problems)
        self._residency[key] = out
        return out

    # ---- transfers ------------------------------------------------------------------------------
    def _edge_seconds(self, edge: Edge, src: TaskLayout, dst: TaskLayout, evals: dict[str, TaskEval]) -> float:
        """Forward data of one step between two groups, over the links between the hosts holding it.

        Sample r of the producer goes to the consumer replica that processes it, so host pair (a, b)
        moves payload × f_a × f_b; each host's interface carries its flows in turn, so the busiest
        sender or receiver decides (LinkTable.transfer_profile). The profile is linear in the
        payload, so it is computed once per pair of layouts and shared by every edge between them.
        """
        key = (src, dst)
        profile = self._edges.get(key)
        if profile is None:
            if len(self._edges) >= MEMO_LIMIT:
                self._edges.clear()
            profile = self._edges[key] = self.links.transfer_profile(evals[src.task].host_vector,
                                                                     evals[dst.task].host_vector)
        latency, per_byte = profile
        total = edge.payload_bytes(self.workload.sequences_per_step, self.costs.prompt + self.costs.response)
        return latency + total * per_byte if total > 0 else 0.0

    def _weight_sync_seconds(self, edge: Edge, train: TaskLayout, gen: TaskLayout) -> float:
        """Trainer -> consumer weights over the slowest link of the sync set: broadcast, shards in parallel
        from the trainer's tp*pp ranks in one region (across regions the weights cross once); resharded
        in place when the consumer sits on the trainer's GPUs (CostModel.reshard_time)."""
        key = ("weights", edge, train, gen)
        hit = self._edges.get(key)
        if hit is not None:
            return hit
        if len(self._edges) >= MEMO_LIMIT:
            self._edges.clear()
        hosts = {self.devices[d].host for d in train.devices()} | {self.devices[d].host for d in gen.devices()}
        link = self.links.slowest(hosts) or self.links.between(*hosts, *hosts)  # one host: its own link
        shards = 1 if self.links.spans_regions(hosts) else train.tp * train.pp
        model = self.graph.models[edge.model]
        if set(gen.devices()) <= set(train.devices()):  # colocated: reshard in place on every GPU
            pieces = shards * (train.dp if train.sharding == "fsdp" else 1)
            # across hosts, every generator GPU of a host gathers through that host's network cards at once;
            # the smallest-TP generator gathers the largest shard, so it finishes last
            per_host = Counter(self.devices[d].host for d in gen.devices())
            flows = max(per_host.values()) if len(hosts) > 1 else 1
            seconds = self.cost_model.reshard_time(model, link, min(gen.tp_degrees()), pieces, self.workload.precision,
                                                   flows)
        else:  # across hosts of a region each stream takes its GPU's share of the cards; a WAN link is its own limit
            lan = len(hosts) > 1 and not self.links.spans_regions(hosts)
            cards = max(self._host_gpus[h] for h in hosts) if lan else 1
            seconds = self.cost_model.weight_sync_time(model, link, receivers=gen.dp, dtype=self.workload.precision,
                                                       shards=shards, flows=cards)
        if self.graph.kind_of(edge.dst) == TaskKind.GENERATION:  # the engine then takes them in (its slowest kind)
            seconds += max(self.cost_model.engine_reload_time(self.backend, self.devices[d].type, self.workload.precision,
                                                              model.weight_bytes(self.workload.precision))
                           for d in gen.devices())
        self._edges[key] = seconds
        return seconds

    @functools.cached_property
    def _host_gpus(self) -> Counter:
        """GPUs per host: they share its network cards."""
        return Counter(dev.host for dev in self.devices.values())

    # ---- up-front feasibility -------------------------------------------------------------------
    def check_fits(self, max_tp: int = 8, max_pp: int = 4) -> None:
        """Raise InfeasibleError if some task fits on no GPU type of the cluster (planner/fits.py)."""
        check_fits(self, max_tp, max_pp)
