"""AReaL-Hex's two-phase scheduler for asynchronous RL (arXiv 2511.00796).

Asynchronous RL disaggregates rollout from training; with staleness bound k the step time is
min over plans of max(C_train, C_rollout + C_reward + C_sync). Phase 2 partitions the device
graph: a fraction γ of the cluster's compute goes to training, taken host by host from the
GPUs with the most FLOPs per byte of HBM bandwidth (training is compute-bound), with each region
in turn offered first (the partition follows the interconnects too), the rest serves rollout; γ
is found by binary search on which side is slower. Phase 1, for each rollout pool,
is a MILP over rollout replica configurations per GPU type (each type's own TP degree and how many
replicas of it, maximising generated sequences per second) — solved here with PuLP + CBC; the
generation layout is those replicas, each type at its own TP, with the batch balanced over them.
Every visited plan is scored by the simulator and the best is returned. An MoE model's training and
inference layouts take the expert-parallel degree `layouts.best_layout` finds fastest (AReaL trains
MoE models with Megatron's EP); the per-type rollout replicas of phase 1 are priced without EP, as
the paper's rollout configurations are TP degrees only.
"""

from __future__ import annotations

import dataclasses
import math

from hetprof.errors import InfeasibleError
from hetprof.planner.balance import Curve, balance_shares
from hetprof.planner.candidate import Candidate
from hetprof.planner.search import layouts, register_search, replica_kinds
from hetprof.planner.search.base import Ledger, Search, SearchResult
from hetprof.planner.search.cbc import cbc
from hetprof.specs.layout import TaskLayout
from hetprof.specs.vocabulary import Task

GAMMA_STEPS = 10


@dataclasses.dataclass(frozen=True)
class RolloutOption:
    """A TP degree for one GPU type's rollout replicas: the most replicas its hosts hold at that
    degree and one replica's generation rate (sequences per second) at its share of the batch."""

    gpu_type: str
    tp: int
    replicas: tuple[tuple[str, ...], ...]
    rate: float


def rollout_options(planning, devices: list[str], max_tp: int) -> list[RolloutOption]:
    """Every (GPU type, TP degree) whose replica holds the generator and its share of the batch.

    TP stays within a host; a degree is an option only where its replica fits in memory at
    the batch it would serve if that type generated alone (a small-memory type may need TP2 where a
    large one runs TP1)."""
    total = layouts.task_batch(planning)
    model = layouts.task_model(planning, Task.ACTOR_GEN)
    order = layouts.canonical_order(planning, devices)
    out = []
    for t in sorted({planning.devices[d].type for d in devices}):
        mine = [d for d in order if planning.devices[d].type == t]
        for tp in layouts.degree_limits(planning, Task.ACTOR_GEN, max_tp)[0]:
            replicas = tuple(layouts.arrange(planning, mine, tp, 1))
            if not replicas:
                continue
            batch = max(1, math.ceil(total / len(replicas)))
            s = replica_kinds.replica_time(planning, Task.ACTOR_GEN, replicas[0], tp, 1, batch, None)
            if replica_kinds.replica_overflow(planning, Task.ACTOR_GEN, replicas[0], tp, (model.layers,), batch) > 0 \
                    or not math.isfinite(s):
                continue
            out.append(RolloutOption(t, tp, replicas, batch / s))
    return out


def rollout_milp(planning, devices: list[str], max_tp: int) -> dict[str, tuple[RolloutOption, int]] | None:
    """Phase 1: per GPU type, the rollout TP degree and replica count maximising generation throughput.

    Variables: n[o] replicas of option o (a type at a TP degree), z[o] whether type o.gpu_type
    runs at degree o.tp. Maximise Σ rate·n subject to one degree per type (Σ_o∈type z ≤ 1),
    n[o] ≤ the replicas its hosts hold · z[o], and no more replicas than sequences in the batch
    (each replica serves at least one). Returns {type: (its option, replicas)} for the types used.
    """
    import pulp

    options = rollout_options(planning, devices, max_tp)
    if not options:
        return None
    prob = pulp.LpProblem("arealhex_rollout", pulp.LpMaximize)
    z = [prob.add_variable(f"z_{i}", cat="Binary") for i in range(len(options))]
    n = [prob.add_variable(f"n_{i}", 0, len(o.replicas), cat="Integer") for i, o in enumerate(options)]
    prob += pulp.lpSum(o.rate * n[i] for i, o in enumerate(options))
    for t in {o.gpu_type for o in options}:
        prob += pulp.lpSum(z[i] for i, o in enumerate(options) if o.gpu_type == t) <= 1
    for i, o in enumerate(options):
        prob += n[i] <= len(o.replicas) * z[i]
    prob += pulp.lpSum(n) <= layouts.task_batch(planning)
    prob.solve(cbc(msg=False, timeLimit=10))
    if pulp.LpStatus[prob.status] != "Optimal":
        return None
    chosen = {o.gpu_type: (o, int(round(n[i].value() or 0))) for i, o in enumerate(options)
              if (z[i].value() or 0) > 0.5 and (n[i].value() or 0) > 0.5}
    return chosen or None


def rollout_layout(planning, chosen: dict[str, tuple[RolloutOption, int]]) -> TaskLayout | None:
    """The generation layout phase 1 solved for: each type's replicas at its own TP degree, the
    batch split by min-max balancing of their generation times (None if it cannot hold the batch)."""
    total = layouts.task_batch(planning)
    layers = layouts.task_model(planning, Task.ACTOR_GEN).layers
    replicas, timers = [], []
    for t in sorted(chosen):
        option, count = chosen[t]
        curve = Curve(_ReplicaTimer(planning, option.replicas[0], option.tp, layers), total)
        replicas.extend(option.replicas[:count])
        timers.extend([curve] * count)
    counts = balance_shares(timers, total)
    if counts is None:
        return None
    keep = [i for i, c in enumerate(counts) if c > 0]
    return TaskLayout(Task.ACTOR_GEN, max(len(replicas[i]) for i in keep), 1, tuple(replicas[i] for i in keep),
                      tuple(counts[i] / total for i in keep), tuple((layers,) for _ in keep))


class _ReplicaTimer:
    """One rollout replica kind's seconds at a batch (infinite where the batch overflows its memory)."""

    def __init__(self, planning, replica: tuple[str, ...], tp: int, layers: int) -> None:
        self.planning, self.replica, self.tp, self.layers = planning, replica, tp, layers

    def fits(self, batch: int) -> bool:
        return replica_kinds.replica_overflow(self.planning, Task.ACTOR_GEN, self.replica, self.tp, (self.layers,), batch) <= 0

    def __call__(self, batch: int) -> float:
        if batch <= 0:
            return 0.0
        if not self.fits(batch):
            return math.inf
        return replica_kinds.replica_time(self.planning, Task.ACTOR_GEN, self.replica, self.tp, 1, batch, (self.layers,))


@register_search("arealhex")
class ArealHexSearch(Search):
    """γ binary search over the train/rollout partition; a rollout MILP per partition."""

    def run(self) -> SearchResult:
        planning = self.ctx.planning
        ledger = Ledger(self.ctx)           # an evaluation budget binds it like every search
        train_tasks = tuple(t for t in planning.tasks if t not in (Task.ACTOR_GEN, Task.REWARD_INFER))
        roll_tasks = tuple(t for t in planning.tasks if t in (Task.ACTOR_GEN, Task.REWARD_INFER))
        visited: list[dict] = []
        # The compute-first ranking is AReaL-Hex's; phase 2 partitions interconnects too, so each
        # region in turn lends the training side its hosts first (a partition that keeps training's
        # all-reduce inside one region). The reverse ranking is tried only where none holds a plan
        # (compute-dense GPUs too small for the training state).
        regions = sorted({d.region for d in planning.devices.values()})
        firsts: list[str | None] = [None, *regions] if len(regions) > 1 else [None]
        for reverse in (False, True):
            if reverse and ledger.best is not None and ledger.best_value < float("inf"):
                break
            for first in firsts:
                hosts = self._training_first_hosts(first)
                self._gamma_search(hosts[::-1] if reverse else hosts, ledger, train_tasks, roll_tasks, visited)
        if ledger.best is None:
            raise InfeasibleError("arealhex: no train/rollout partition of this cluster holds both sides' models")
        return ledger.result("arealhex", gamma_trace=visited)

    def _gamma_search(self, hosts, ledger: Ledger, train_tasks, roll_tasks, visited: list[dict]) -> None:
        """Binary search on γ, the training side's share of the cluster's FLOPs: grow the slower side."""
        planning = self.ctx.planning
        flops = {h: sum(planning.catalog.lookup(planning.devices[d].type).peak_flops("bf16") for d in ds) for h, ds in hosts}
        whole = sum(flops.values())
        lo, hi = 0.0, 1.0
        for _ in range(GAMMA_STEPS):
            if ledger.exhausted:
                return
            gamma = (lo + hi) / 2
            cand, failed = self._partition(hosts, flops, whole, gamma, train_tasks, roll_tasks)
            if cand is None:
                # a side could not hold its models: give that side more of the cluster
                lo, hi = (gamma, hi) if failed == "train" else (lo, gamma)
                continue
            value, score = ledger.evaluate(cand)
            sec = score.task_seconds
            c_train = sum(sec.get(t, 0.0) for t in train_tasks)
            c_roll = sum(sec.get(t, 0.0) for t in roll_tasks) + sum(
                v for k, v in score.transfer_s.items() if k.startswith(f"weights:{Task.ACTOR_TRAIN}"))
            visited.append({"gamma": round(gamma, 4), "c_train": c_train, "c_rollout_reward_sync": c_roll,
                            "value": value, "rollout": cand.layout(Task.ACTOR_GEN).describe()})
            if c_train > c_roll:
                lo = gamma
            else:
                hi = gamma

    def _training_first_hosts(self, first_region: str | None = None) -> list[tuple[str, list[str]]]:
        """Hosts ranked for training: most FLOPs per byte of HBM bandwidth first, then (given)
        `first_region`'s hosts, then locality."""
        planning = self.ctx.planning
        by_host: dict[str, list[str]] = {}
        for d in layouts.canonical_order(planning, planning.devices):
            by_host.setdefault(planning.devices[d].host, []).append(d)

        def ratio(h: str) -> float:
            g = planning.catalog.lookup(planning.devices[by_host[h][0]].type)
            return g.peak_flops("bf16") / g.hbm_Bps

        def elsewhere(h: str) -> bool:
            return first_region is not None and planning.devices[by_host[h][0]].region != first_region

        order = sorted(by_host, key=lambda h: (-ratio(h), elsewhere(h), list(by_host).index(h)))
        return [(h, by_host[h]) for h in order]

    def _partition(self, hosts, flops, whole, gamma, train_tasks, roll_tasks):
        planning, ctx = self.ctx.planning, self.ctx
        train, acc = [], 0.0
        for h, ds in hosts:
            if acc >= gamma * whole and train:
                break
            train.extend(ds)
            acc += flops[h]
        if len(train) == len(planning.devices):
            train = train[:-len(hosts[-1][1])]
        roll = [d for d in planning.devices if d not in set(train)]
        if not train:
            return None, "train"
        if not roll:
            return None, "rollout"
        lays = {}
        for task in train_tasks:
            lay = layouts.best_layout(planning, task, train, ctx.max_tp, ctx.max_pp)
            if lay is None:
                return None, "train"
            lays[task] = lay
        phase1 = rollout_milp(planning, roll, ctx.max_tp)
        gen = rollout_layout(planning, phase1) if phase1 is not None else None
        if gen is None:
            return None, "rollout"
        lays[Task.ACTOR_GEN] = gen
        for task in roll_tasks:
            if task != Task.ACTOR_GEN:
                lay = layouts.best_layout(planning, task, roll, ctx.max_tp, ctx.max_pp)
                if lay is None:
                    return None, "rollout"
                lays[task] = lay
        return Candidate((roll_tasks, train_tasks), (tuple(roll), tuple(train)), lays), ""
