"""StreamRL as its paper describes it, scored by the same simulator as everything else.

StreamRL disaggregates generation from training: two pools, each inside one datacenter (region),
weights streamed from the trainer to the generators, generation streamed to the consumers (the
simulator's streaming), and generation instances balanced by output length (skewness-aware: each
instance's share follows its speed, `layouts.best_layout`). Its resource planner chooses the
pools: here every pair of disjoint single-region pools — a region, a GPU type within it, or its
hosts ranked bandwidth-first (decode is bandwidth-bound) cut at every count from either end —
with each pool's layouts tuned, and the best pair kept. An MoE model's layouts take the expert-parallel
degree `layouts.best_layout` finds fastest, as a StreamRL user tunes their training and inference
engines' EP (the paper's models are dense and say nothing more).
"""

from __future__ import annotations

from hetprof.errors import InfeasibleError
from hetprof.planner.candidate import Candidate
from hetprof.planner.search import layouts, register_search
from hetprof.planner.search.base import Ledger, Search, SearchResult
from hetprof.planner.search.pools import Pool, hosts, region_pools
from hetprof.specs.layout import TaskLayout
from hetprof.specs.vocabulary import Task


def bandwidth_rank(planning) -> dict[str, float]:
    """Host -> rank key for generation: most HBM bandwidth per FLOP first."""
    def ratio(device_type: str) -> float:
        g = planning.catalog.lookup(device_type)
        return g.hbm_Bps / g.peak_flops("bf16")

    return {h: -ratio(planning.devices[ds[0]].type) for h, ds in hosts(planning).items()}


@register_search("streamrl")
class StreamRLBaseline(Search):
    """Generation on one single-region pool, everything else on another; the pools chosen, layouts tuned."""

    def _layouts(self, pool: Pool, tasks: list[str], cache: dict) -> dict[str, TaskLayout] | None:
        key = (pool.devices, tuple(tasks))
        if key not in cache:
            lays = {}
            for task in tasks:
                lay = layouts.best_layout(self.ctx.planning, task, pool.devices, self.ctx.max_tp, self.ctx.max_pp)
                if lay is None:
                    lays = None
                    break
                lays[task] = lay
            cache[key] = lays
        return cache[key]

    def run(self) -> SearchResult:
        planning = self.ctx.planning
        ledger = Ledger(self.ctx)
        pools = region_pools(planning, bandwidth_rank(planning))
        rest = [t for t in planning.tasks if t != Task.ACTOR_GEN]
        cache: dict = {}
        chosen, tried = "", 0
        for gen_pool in pools:
            gen = self._layouts(gen_pool, [Task.ACTOR_GEN], cache)
            if gen is None:
                continue
            for train_pool in pools:
                if ledger.exhausted:
                    break
                if set(gen_pool.devices) & set(train_pool.devices):
                    continue
                train = self._layouts(train_pool, rest, cache)
                if train is None:
                    continue
                before = ledger.best
                ledger.evaluate(Candidate(((Task.ACTOR_GEN,), tuple(rest)), (gen_pool.devices, train_pool.devices),
                                          {**gen, **train}))
                tried += 1
                if ledger.best is not before:
                    chosen = f"generation on {gen_pool.name}, training on {train_pool.name}"
        if not tried:
            raise InfeasibleError("streamrl: no two disjoint single-region pools hold generation and training "
                                  "(the cluster needs at least two hosts and room for every model)")
        return ledger.result("streamrl", pool_pairs_tried=tried, chosen=chosen)
