"""An exact MILP (PuLP + CBC) over the restricted problem, warm-started from the heuristic.

The grouping is fixed (the heuristic's, or `options["grouping"]`). The program chooses, per group,
how many GPUs of each type it gets (one-hot over counts: integer counts per type, not a binary per
GPU, so identical GPUs create no symmetry), per task one TP×PP, and per task and type how many
type-pure replicas run. A replica of type t and shape c processes r[k,t,c] sequences per second
and holds at most m[k,t,c] sequences in memory — constants measured once with the simulator's
`replica_seconds`. A task's time B/rate is convex in its rate, so it is bounded below by tangent
cuts; the objective is min-max: per workflow stage the busiest group (sync: stages add up), or
the busiest group overall (async: generation overlaps training). Region indicators per group
price what the cluster's links add: gradient all-reduce of a training task whose group spans two
regions, and the weight sync between the training and generation groups' regions.

The MILP is a model of the simulator, not the simulator, so the best `shortlist` MILP solutions
(each later one excluded by a no-good cut) are built and scored by the simulator, and the best
by that score wins. `extra` reports CBC's status, objective, bound and gap, and the time limit.

Options: `time_limit_s` (CBC's limit per solve), `shortlist`, `total_s` (a hard cap on the whole
search: later solves get only what is left, so a caller embedding the ILP — hetrl seeds arms with
it — can rely on its clock), and `max_nodes` (a branch-and-bound node limit: unlike a time limit
it gives the same answer under any machine load), `constants` (a dict to share the measured
replica rates between solves of one problem). After `run()`, `solutions` holds every simulated
shortlist candidate with its objective value.
"""

from __future__ import annotations

import math
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from hetprof.errors import InfeasibleError
from hetprof.planner import layouts
from hetprof.planner.search import get_search, register_search
from hetprof.planner.search.base import Ledger, Search, SearchContext, SearchResult
from hetprof.planner.search.cbc import cbc
from hetprof.planner.search.restricted import RestrictedSpace
from hetprof.specs.plan import TASKS

if TYPE_CHECKING:
    from hetprof.planner.candidate import Candidate

TANGENTS = 48
SHORTLIST = 12
STAGE = {"generation": 0, "inference": 1, "training": 2}


def _replica_rate(space: RestrictedSpace, task: str, t: str, tp: int, pp: int, total: int) -> tuple[float, int]:
    """(sequences/s, most sequences that fit) of one type-t replica of shape tp×pp; (0, 0) if none fits."""
    sim = space.sim
    reps = space.replicas([d for h in space.hosts[t] for d in h], tp, pp)  # t is a kind: type/GPUs per host
    if not reps:
        return 0.0, 0
    rep = reps[0]
    split = layouts.balance_layers(sim, task, rep, tp, pp, max(1, total // max(1, len(reps))))

    def seconds(b: int) -> float:
        if b <= 0:
            return 0.0
        if layouts.replica_overflow(sim, task, rep, tp, split, b) > 0:
            return math.inf
        return layouts.replica_time(sim, task, rep, tp, pp, b, split)

    most = layouts.largest_batch_within(seconds, math.inf, total)
    if most == 0:
        return 0.0, 0
    ref = max(1, min(most, math.ceil(total / max(1, len(reps)))))
    s = seconds(ref)
    return (ref / s if s > 0 and math.isfinite(s) else 0.0), most


@register_search("ilp")
class ILPSearch(Search):
    """MILP over counts per GPU type per group and replicas per type per layout; CBC with a time limit."""

    solutions: list[tuple[float, Candidate]]

    def run(self) -> SearchResult:
        import pulp

        ctx, sim = self.ctx, self.ctx.sim
        self.solutions = []
        warm = ctx.warm_start
        grouping = ctx.options.get("grouping")
        heuristic_s = 0.0
        if grouping is None:
            if warm is None:
                sub = SearchContext(sim=sim, objective=ctx.objective, budget=ctx.budget, seed=ctx.seed,
                                    time_budget_s=max(1.0, ctx.time_budget_s / 3), max_tp=ctx.max_tp,
                                    max_pp=ctx.max_pp, max_evals=ctx.options.get("heuristic_evals", 300),
                                    options={"milp_arms": False})   # no ILP inside the ILP's heuristic
                first = get_search("hetrl")(sub).run()
                warm, heuristic_s = first.candidate, first.seconds
            grouping = warm.groups
        grouping = tuple(tuple(g) for g in grouping)
        space = RestrictedSpace(sim, grouping, ctx.max_tp, ctx.max_pp)
        ledger = Ledger(ctx, max_evals=None)
        total = layouts.task_batch(sim)
        tasks = [k for g in grouping for k in g]
        owner = {k: gi for gi, g in enumerate(grouping) for k in g}
        types = space.types

        # ---- constants from the simulator ----
        rate, cap, shapes = {}, {}, {}
        # replica rates depend on task, kind and shape only: a caller solving several groupings
        # of one problem (hetrl's MILP arms) passes one dict for all of them
        constants = ctx.options.get("constants")
        constants = {} if constants is None else constants
        for k in tasks:
            shapes[k] = []
            for tp, pp in space.shapes(k):
                usable = False
                for t in types:
                    if tp > space.host_size(t):
                        continue
                    key = (k, t, tp, pp, total)
                    if key not in constants:
                        constants[key] = _replica_rate(space, k, t, tp, pp, total)
                    r, m = constants[key]
                    if r > 0:
                        rate[k, t, (tp, pp)], cap[k, t, (tp, pp)] = r, m
                        usable = True
                if usable:
                    shapes[k].append((tp, pp))
            if not shapes[k]:
                raise InfeasibleError(f"ilp: {k} fits on no type-pure replica of this cluster "
                                      f"(TP ≤ {ctx.max_tp}, PP ≤ {ctx.max_pp})")

        prob = pulp.LpProblem("hetrl_restricted", pulp.LpMinimize)
        u = {(g, t, v): prob.add_variable(f"u_{g}_{ti}_{v}", cat="Binary")
             for g in range(len(grouping)) for ti, t in enumerate(types) for v in range(space.totals[t] + 1)}
        z = {(k, c): prob.add_variable(f"z_{k}_{c[0]}x{c[1]}", cat="Binary") for k in tasks for c in shapes[k]}
        w = {}
        for (k, t, c), _r in rate.items():
            most = space.tp_groups(t, space.totals[t], c[0]) // c[1]
            w[k, t, c] = prob.add_variable(f"w_{k}_{types.index(t)}_{c[0]}x{c[1]}", 0, most, cat="Integer")
        T = {k: prob.add_variable(f"T_{k}", 0) for k in tasks}

        for g in range(len(grouping)):
            for t in types:
                prob += pulp.lpSum(u[g, t, v] for v in range(space.totals[t] + 1)) == 1
            prob += pulp.lpSum(v * u[g, t, v] for t in types for v in range(1, space.totals[t] + 1)) >= 1
        for t in types:
            prob += pulp.lpSum(space.hosts_needed(t, v) * u[g, t, v] for g in range(len(grouping))
                               for v in range(space.totals[t] + 1)) <= len(space.hosts[t])
        for k in tasks:
            prob += pulp.lpSum(z[k, c] for c in shapes[k]) == 1
            g = owner[k]
            for (kk, t, c), var in w.items():
                if kk != k:
                    continue
                prob += var <= var.upBound * z[k, c]
                prob += c[1] * var <= pulp.lpSum(space.tp_groups(t, v, c[0]) * u[g, t, v]
                                                 for v in range(space.totals[t] + 1))
            mine = [(key, var) for key, var in w.items() if key[0] == k]
            flow = pulp.lpSum(rate[key] * var for key, var in mine)
            prob += pulp.lpSum(cap[key] * var for key, var in mine) >= total
            hi = sum(rate[key] * var.upBound for key, var in mine)
            lo = min(rate[key] for key, _ in mine)
            for j in range(TANGENTS):
                rho = lo * (hi / lo) ** (j / (TANGENTS - 1)) if hi > lo else lo
                prob += T[k] >= 2 * total / rho - total * flow / (rho * rho)

        # ---- where groups sit: regions a group spans, and what crossing them costs ----
        regions = sorted(set(space.region.values()))
        rho = {(g, r): prob.add_variable(f"rho_{g}_{ri}", cat="Binary")
               for g in range(len(grouping)) for ri, r in enumerate(regions)}
        for g in range(len(grouping)):
            for t in types:
                for v in range(1, space.totals[t] + 1):
                    prob += u[g, t, v] <= rho[g, space.region[t]]
        link = _region_links(space, regions)
        cm = sim.cost_model
        for k in tasks:
            if TASKS[k][0] != "training":
                continue
            grads = layouts.task_model(sim, k).weight_bytes(sim.workload.precision)
            g = owner[k]
            for i, r1 in enumerate(regions):
                for r2 in regions[i + 1:]:
                    # data parallelism across two regions all-reduces gradients over their link
                    cross = cm.collective_time("all_reduce", grads, 2, link[r1, r2])
                    prob += T[k] >= cross * (rho[g, r1] + rho[g, r2] - 1)
        sync = prob.add_variable("S", 0)
        for src, dst in (("actor_train", "actor_gen"), ("critic_train", "critic_infer")):
            if src in owner and dst in owner and owner[src] != owner[dst]:
                model = layouts.task_model(sim, src)
                for r1 in regions:
                    for r2 in regions:
                        cost = cm.weight_sync_time(model, link[r1, r2], 1, sim.workload.precision)
                        prob += sync >= cost * (rho[owner[src], r1] + rho[owner[dst], r2] - 1)

        asynchronous = sim.workload.mode == "async"
        if asynchronous:
            Z = prob.add_variable("Z", 0)
            for g in grouping:
                extra = sync if "actor_gen" in g else 0
                prob += Z >= pulp.lpSum(T[k] for k in g) + extra
            prob += Z
        else:
            Zs = {s: prob.add_variable(f"Z_{s}", 0) for s in set(STAGE.values())}
            for g in grouping:
                for s in Zs:
                    members = [k for k in g if STAGE[TASKS[k][0]] == s]
                    if members:
                        prob += Zs[s] >= pulp.lpSum(T[k] for k in members)
            prob += pulp.lpSum(Zs.values()) + sync

        warmed = self._warm_start(warm, space, u, z, w, shapes) if warm is not None else False
        limit = float(ctx.options.get("time_limit_s", max(1.0, ctx.time_budget_s - heuristic_s)))
        total_s = ctx.options.get("total_s")
        max_nodes = ctx.options.get("max_nodes")
        solves = []
        best_first = None
        for i in range(int(ctx.options.get("shortlist", SHORTLIST))):
            this_limit = limit
            if total_s is not None:
                this_limit = min(limit, float(total_s) - ledger.elapsed)
                if this_limit < 0.2 and i > 0:
                    break
                this_limit = max(0.2, this_limit)
            with tempfile.TemporaryDirectory() as tmp:
                log = Path(tmp) / "cbc.log"
                solver = cbc(msg=False, timeLimit=this_limit, warmStart=warmed and i == 0, logPath=str(log),
                             threads=1, maxNodes=int(max_nodes) if max_nodes is not None else None)
                status = prob.solve(solver)
                text = log.read_text() if log.exists() else ""
            info = _cbc_summary(text)
            info["status"] = pulp.LpStatus[status]
            info["model_objective"] = pulp.value(prob.objective)
            if status != pulp.LpStatusOptimal or prob.sol_status not in (pulp.LpSolutionOptimal,
                                                                          pulp.LpSolutionIntegerFeasible):
                solves.append(info)
                break
            try:
                counts = tuple(tuple(next(v for v in range(space.totals[t] + 1) if (u[g, t, v].value() or 0) > 0.5)
                                     for t in types) for g in range(len(grouping)))
                chosen = {k: next(c for c in shapes[k] if (z[k, c].value() or 0) > 0.5) for k in tasks}
            except StopIteration:
                solves.append(info)
                break
            cand = space.candidate(counts, chosen)
            value = ledger.evaluate(cand)[0] if cand is not None else math.inf
            if cand is not None:
                self.solutions.append((value, cand))
            info.update(counts={f"group{g}": dict(zip(types, c, strict=True)) for g, c in enumerate(counts)},
                        shapes={k: f"TP{c[0]}×PP{c[1]}" for k, c in chosen.items()}, simulated=value)
            solves.append(info)
            if best_first is None:
                best_first = info
            ones = [u[key] for key in u if (u[key].value() or 0) > 0.5] + [z[key] for key in z if (z[key].value() or 0) > 0.5]
            prob += pulp.lpSum(ones) <= len(ones) - 1
            if ledger.elapsed > (limit if total_s is None else float(total_s)):
                break
        if best_first is None:
            raise InfeasibleError("ilp: CBC found no solution of the restricted problem within "
                                  f"{limit:.0f} s (status {solves[-1]['status'] if solves else 'none'})")
        return ledger.result("ilp", grouping=[list(g) for g in grouping], gap=best_first.get("gap"),
                             optimal=best_first.get("optimal", False), status=best_first["status"],
                             bound=best_first.get("bound"), model_objective=best_first.get("model_objective"),
                             time_limit_s=limit, warm_started=warmed, shortlist=solves, heuristic_s=heuristic_s)

    @staticmethod
    def _warm_start(warm, space: RestrictedSpace, u, z, w, shapes) -> bool:
        """Give CBC the heuristic's counts and shapes as its first incumbent, when they fit the model."""
        if tuple(tuple(g) for g in warm.groups) != space.grouping:
            return False
        types = space.types
        for g, devs in enumerate(warm.group_devices):
            for t in types:
                n = sum(1 for d in devs if d in space.members(t))
                for v in range(space.totals[t] + 1):
                    u[g, t, v].setInitialValue(1 if v == n else 0)
        for k, lay in warm.layouts:
            c = (lay.tp, lay.pp)
            if c not in shapes.get(k, []):
                return False
            for cc in shapes[k]:
                z[k, cc].setInitialValue(1 if cc == c else 0)
            for (kk, t, cc), var in w.items():
                if kk == k:
                    n = sum(1 for r in lay.replicas if cc == c and all(d in space.members(t) for d in r))
                    var.setInitialValue(min(n, var.upBound))
        return True


def _region_links(space: RestrictedSpace, regions: list[str]) -> dict:
    """The slowest link between two regions' hosts (a region with itself: its slowest inner link)."""
    sim = space.sim
    hosts = {r: {sim.devices[h[0]].host for k in space.types if space.region[k] == r for h in space.hosts[k]}
             for r in regions}
    return {(a, b): sim.links.slowest_between(hosts[a], hosts[b]) for a in regions for b in regions}


def _cbc_summary(log: str) -> dict:
    """Status, objective, bound and gap from CBC's log (PuLP does not expose the bound)."""
    out: dict = {"optimal": "Optimal solution found" in log}
    for key, pattern in (("objective", r"Objective value:\s*([-0-9.eE+]+)"),
                         ("bound", r"Lower bound:\s*([-0-9.eE+]+)"),
                         ("gap", r"Gap:\s*([-0-9.eE+]+)")):
        m = re.search(pattern, log)
        if m:
            out[key] = float(m.group(1))
    if out["optimal"] and "gap" not in out:
        out["gap"] = 0.0
    return out
