"""AReaL-Hex's two-phase scheduler for asynchronous RL (arXiv 2511.00796).

Asynchronous RL disaggregates rollout from training; with staleness bound k the step time is
min over plans of max(C_train, C_rollout + C_reward + C_sync). Phase 2 partitions the device
graph: a fraction γ of the cluster's compute goes to training, taken host by host from the
GPUs with the most FLOPs per byte of HBM bandwidth (training is compute-bound), with each region
in turn offered first (the partition follows the interconnects too), the rest serves rollout; γ
is found by binary search on which side is slower. Phase 1, for each rollout pool,
is a MILP over rollout replica configurations per GPU type (how many TP-t replicas of each type,
maximising generated sequences per second) — solved here with PuLP + CBC. Every visited plan is
scored by the simulator and the best is returned.
"""

from __future__ import annotations

import math

from hetprof.errors import InfeasibleError
from hetprof.planner.candidate import Candidate
from hetprof.planner.search import layouts, register_search
from hetprof.planner.search.base import Ledger, Search, SearchResult
from hetprof.planner.search.cbc import cbc
from hetprof.specs.vocabulary import Task

GAMMA_STEPS = 10


def rollout_milp(sim, devices: list[str], max_tp: int) -> tuple[int, dict[str, int]] | None:
    """Phase 1: the rollout TP degree and replicas per type that maximise generation throughput."""
    import pulp

    types = sorted({sim.devices[d].type for d in devices})
    total = layouts.task_batch(sim)
    model = layouts.task_model(sim, Task.ACTOR_GEN)
    per_host: dict[str, dict[str, int]] = {}
    for d in devices:
        dev = sim.devices[d]
        per_host.setdefault(dev.type, {}).setdefault(dev.host, 0)
        per_host[dev.type][dev.host] += 1
    options = {}
    for tp in layouts.degree_limits(sim, Task.ACTOR_GEN, max_tp)[0]:
        for t in types:
            groups = sum(n // tp for n in per_host[t].values())
            if not groups:
                continue
            mine = [d for d in layouts.canonical_order(sim, devices) if sim.devices[d].type == t]
            rep = layouts.arrange(sim, mine, tp, 1)[0]
            batch = max(1, math.ceil(total / max(1, groups)))
            s = layouts.replica_time(sim, Task.ACTOR_GEN, rep, tp, 1, batch, None)
            if layouts.replica_overflow(sim, Task.ACTOR_GEN, rep, tp, (model.layers,), batch) > 0 or not math.isfinite(s):
                continue
            options[tp, t] = (batch / s, groups)
    if not options:
        return None
    prob = pulp.LpProblem("arealhex_rollout", pulp.LpMaximize)
    tps = sorted({tp for tp, _ in options})
    z = {tp: prob.add_variable(f"z_{tp}", cat="Binary") for tp in tps}
    n = {key: prob.add_variable(f"n_{key[0]}_{types.index(key[1])}", 0, groups, cat="Integer")
         for key, (_, groups) in options.items()}
    prob += pulp.lpSum(rate * n[key] for key, (rate, _) in options.items())
    prob += pulp.lpSum(z.values()) == 1
    for key, (_, groups) in options.items():
        prob += n[key] <= groups * z[key[0]]
    prob.solve(cbc(msg=False, timeLimit=10))
    if pulp.LpStatus[prob.status] != "Optimal":
        return None
    tp = next(t for t in tps if (z[t].value() or 0) > 0.5)
    return tp, {t: int(round(n[tp, t].value() or 0)) for t in types if (tp, t) in n}


@register_search("arealhex")
class ArealHexSearch(Search):
    """γ binary search over the train/rollout partition; a rollout MILP per partition."""

    def run(self) -> SearchResult:
        sim = self.ctx.sim
        ledger = Ledger(self.ctx)           # an evaluation budget binds it like every search
        train_tasks = tuple(t for t in sim.tasks if t not in (Task.ACTOR_GEN, Task.REWARD_INFER))
        roll_tasks = tuple(t for t in sim.tasks if t in (Task.ACTOR_GEN, Task.REWARD_INFER))
        visited: list[dict] = []
        # The compute-first ranking is AReaL-Hex's; phase 2 partitions interconnects too, so each
        # region in turn lends the training side its hosts first (a partition that keeps training's
        # all-reduce inside one region). The reverse ranking is tried only where none holds a plan
        # (compute-dense GPUs too small for the training state).
        regions = sorted({d.region for d in sim.devices.values()})
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
        sim = self.ctx.sim
        flops = {h: sum(sim.catalog.lookup(sim.devices[d].type).peak_flops("bf16") for d in ds) for h, ds in hosts}
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
                            "value": value})
            if c_train > c_roll:
                lo = gamma
            else:
                hi = gamma

    def _training_first_hosts(self, first_region: str | None = None) -> list[tuple[str, list[str]]]:
        """Hosts ranked for training: most FLOPs per byte of HBM bandwidth first, then (given)
        `first_region`'s hosts, then locality."""
        sim = self.ctx.sim
        by_host: dict[str, list[str]] = {}
        for d in layouts.canonical_order(sim, sim.devices):
            by_host.setdefault(sim.devices[d].host, []).append(d)

        def ratio(h: str) -> float:
            g = sim.catalog.lookup(sim.devices[by_host[h][0]].type)
            return g.peak_flops("bf16") / g.hbm_Bps

        def elsewhere(h: str) -> bool:
            return first_region is not None and sim.devices[by_host[h][0]].region != first_region

        order = sorted(by_host, key=lambda h: (-ratio(h), elsewhere(h), list(by_host).index(h)))
        return [(h, by_host[h]) for h in order]

    def _partition(self, hosts, flops, whole, gamma, train_tasks, roll_tasks):
        sim, ctx = self.ctx.sim, self.ctx
        train, acc = [], 0.0
        for h, ds in hosts:
            if acc >= gamma * whole and train:
                break
            train.extend(ds)
            acc += flops[h]
        if len(train) == len(sim.devices):
            train = train[:-len(hosts[-1][1])]
        roll = [d for d in sim.devices if d not in set(train)]
        if not train:
            return None, "train"
        if not roll:
            return None, "rollout"
        lays = {}
        for task in train_tasks:
            lay = layouts.best_layout(sim, task, train, ctx.max_tp, ctx.max_pp)
            if lay is None:
                return None, "train"
            lays[task] = lay
        phase1 = rollout_milp(sim, roll, ctx.max_tp)
        if phase1 is None:
            return None, "rollout"
        tp, _replicas = phase1
        gen = layouts.build_layout(sim, Task.ACTOR_GEN, layouts.canonical_order(sim, roll), tp, 1)
        if gen is None:
            return None, "rollout"
        lays[Task.ACTOR_GEN] = gen
        for task in roll_tasks:
            if task != Task.ACTOR_GEN:
                lay = layouts.best_layout(sim, task, roll, ctx.max_tp, ctx.max_pp)
                if lay is None:
                    return None, "rollout"
                lays[task] = lay
        return Candidate((roll_tasks, train_tasks), (tuple(roll), tuple(train)), lays), ""
