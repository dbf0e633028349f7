"""The placements today's systems would choose, scored by the same simulator as everything else.

`verl` (HybridFlow): every model colocated on every GPU, one parallel layout for all of them, the
batch split evenly across data-parallel ranks and layers evenly across stages — it assumes a
homogeneous cluster, so it does not know one GPU from another. The user is given the benefit of
the doubt: of the uniform layouts the cluster allows, the best-scoring one is reported.

`streamrl`: generation disaggregated from everything else (two pools, weights streamed back),
with the split size enumerated as StreamRL's resource planner does. The pool sizes move in whole
hosts, from either end of a ranking that puts bandwidth-rich GPUs (decode is bandwidth-bound)
first, and each pool's layout is its best balanced one (StreamRL balances its generation
instances by output length).
"""

from __future__ import annotations

from hetprof.errors import InfeasibleError
from hetprof.planner import layouts
from hetprof.planner.candidate import Candidate
from hetprof.planner.search import register_search
from hetprof.planner.search.base import Ledger, Search, SearchResult


@register_search("verl")
class VerlBaseline(Search):
    """All tasks on all GPUs with one uniform, heterogeneity-unaware layout."""

    def run(self) -> SearchResult:
        sim = self.ctx.sim
        ledger = Ledger(self.ctx, max_evals=None)
        order = layouts.canonical_order(sim, sim.devices)
        tasks = list(sim.tasks)
        common = None
        for task in tasks:
            shapes = {(s.tp, s.pp) for s in layouts.feasible_shapes(sim, task, order, self.ctx.max_tp, self.ctx.max_pp)}
            common = shapes if common is None else common & shapes
        tried = 0
        for tp, pp in sorted(common or ()):
            lays = {}
            for task in tasks:
                lay = layouts.build_layout(sim, task, order, tp, pp, balanced=False)
                if lay is None:
                    break
                lays[task] = lay
            else:
                tried += 1
                ledger.evaluate(Candidate((tuple(tasks),), (order,), lays))
        if not tried:
            raise InfeasibleError("verl: no uniform TP×PP fits every task on every GPU of this cluster")
        return ledger.result("verl", uniform_layouts_tried=tried)


def bandwidth_first(sim) -> list[str]:
    """Hosts ranked for generation: most HBM bandwidth per FLOP first, then locality."""
    hosts: dict[str, str] = {}
    for d in layouts.canonical_order(sim, sim.devices):
        hosts.setdefault(sim.devices[d].host, sim.devices[d].type)

    def ratio(t: str) -> float:
        g = sim.catalog.lookup(t)
        return g.hbm_Bps / g.peak_flops("bf16")

    return sorted(hosts, key=lambda h: (-ratio(hosts[h]), list(hosts).index(h)))


@register_search("streamrl")
class StreamRLBaseline(Search):
    """Generation on one pool, everything else on the other; the split size enumerated."""

    def run(self) -> SearchResult:
        sim = self.ctx.sim
        ledger = Ledger(self.ctx, max_evals=None)
        ranked = bandwidth_first(sim)
        by_host: dict[str, list[str]] = {}
        for d in layouts.canonical_order(sim, sim.devices):
            by_host.setdefault(sim.devices[d].host, []).append(d)
        rest = [t for t in sim.tasks if t != "actor_gen"]
        splits = 0
        for hosts in (ranked, list(reversed(ranked))):
            for k in range(1, len(hosts)):
                gen = [d for h in hosts[:k] for d in by_host[h]]
                train = [d for h in hosts[k:] for d in by_host[h]]
                lays = {}
                lay = layouts.best_layout(sim, "actor_gen", gen, self.ctx.max_tp, self.ctx.max_pp)
                if lay is None:
                    continue
                lays["actor_gen"] = lay
                for task in rest:
                    lay = layouts.best_layout(sim, task, train, self.ctx.max_tp, self.ctx.max_pp)
                    if lay is None:
                        break
                    lays[task] = lay
                else:
                    splits += 1
                    ledger.evaluate(Candidate((("actor_gen",), tuple(rest)), (tuple(gen), tuple(train)), lays))
        if not splits:
            raise InfeasibleError("streamrl: no split of the hosts into a generation and a training pool fits "
                                  "(the cluster needs at least two hosts and room for every model)")
        return ledger.result("streamrl", splits_tried=splits)
