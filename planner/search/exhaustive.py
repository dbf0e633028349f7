"""Exhaustive search for small clusters: the ground truth the heuristic searches are tested against.

It walks the same space as `hetrl` (see `space`): every grouping, every split of every host's GPUs
over the groups and the idle pool, every TP×PP per task, and — when some task pipelines — every
distinct order of hosts inside a group (GPUs of one host are interchangeable, so only the host
sequence matters). With `ExhaustiveConfig(restricted=True)` it walks the ILP's restricted space
instead (fixed grouping, host-block counts, type-pure replicas). Either way it refuses, with a
clear error, a space too large to finish.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator, Sequence

from hetprof.errors import InfeasibleError
from hetprof.planner.search import register_search
from hetprof.planner.search.arms import compositions
from hetprof.planner.search.base import Ledger, Search, SearchConfig, SearchResult, knob
from hetprof.planner.search.restricted import RestrictedSpace
from hetprof.planner.search.space import Assembler, Grouping, all_groupings

MAX_CANDIDATES = 200_000


@dataclasses.dataclass(frozen=True)
class ExhaustiveConfig(SearchConfig):
    restricted: bool = knob(False, "walk the ILP's restricted space (needs `grouping`) instead of the full one")
    grouping: Grouping | None = knob(None, "the task grouping of the restricted space")
    max_candidates: int = knob(MAX_CANDIDATES, "refuse a space with more candidates than this", 1)
    no_deadline: bool = knob(True, "ignore the time budget (ground truth must finish)")


def _host_orders(planning, devices: Sequence[str]) -> Iterator[tuple[str, ...]]:
    """Distinct device orders up to swapping GPUs of one host (multiset permutations of hosts)."""
    by_host: dict[str, list[str]] = {}
    for d in devices:
        by_host.setdefault(planning.devices[d].host, []).append(d)
    labels = sorted(h for h, ds in by_host.items() for _ in ds)
    seen = set()
    for perm in itertools.permutations(labels):
        if perm in seen:
            continue
        seen.add(perm)
        taken = {h: 0 for h in by_host}
        order = []
        for h in perm:
            order.append(by_host[h][taken[h]])
            taken[h] += 1
        yield tuple(order)


@register_search("exhaustive")
class ExhaustiveSearch(Search):
    """Every candidate of the space, each scored by the simulator; the best is the optimum."""

    config_type = ExhaustiveConfig
    config: ExhaustiveConfig

    def run(self) -> SearchResult:
        ledger = Ledger(self.ctx, max_evals=None)
        ledger.end = math.inf if self.config.no_deadline else ledger.end
        limit = self.config.max_candidates
        if self.config.restricted:
            n = self._restricted(ledger, limit)
        else:
            n = self._full(ledger, limit)
        return ledger.result("exhaustive", candidates=n, restricted=self.config.restricted)

    def _check(self, n: int, limit: int) -> None:
        if n > limit:
            raise InfeasibleError(f"exhaustive search would score more than {limit} candidates on this cluster; "
                                  "it is meant for small clusters (use --search hetrl)")

    def _full(self, ledger: Ledger, limit: int) -> int:
        planning = self.ctx.planning
        asm = Assembler(planning, self.ctx.max_tp, self.ctx.max_pp)
        hosts: dict[str, list[str]] = {}
        for d in sorted(planning.devices, key=lambda d: (planning.devices[d].host, planning.devices[d].index)):
            hosts.setdefault(planning.devices[d].host, []).append(d)
        seen: set = set()
        count = 0
        for grouping in all_groupings(planning):
            k = len(grouping)
            splits = [compositions(len(ds), k + 1) for ds in hosts.values()]
            for split in itertools.product(*splits):
                groups: list[list[str]] = [[] for _ in range(k)]
                for ds, parts in zip(hosts.values(), split, strict=True):
                    pos = 0
                    for g in range(k):
                        groups[g].extend(ds[pos:pos + parts[g]])
                        pos += parts[g]
                if not all(groups):
                    continue
                count = self._group_choices(grouping, [tuple(g) for g in groups], asm, ledger, seen, count, limit)
        return count

    def _group_choices(self, grouping: Grouping, groups: list[tuple[str, ...]], asm: Assembler, ledger: Ledger,
                       seen: set, count: int, limit: int) -> int:
        planning = self.ctx.planning
        tasks = [t for g in grouping for t in g]
        owner = {t: gi for gi, g in enumerate(grouping) for t in g}
        shape_lists = [asm.shapes_for(t, groups[owner[t]]) for t in tasks]
        for shapes in itertools.product(*shape_lists):
            chosen = dict(zip(tasks, shapes, strict=True))
            pipelined = [any(chosen[t][1] > 1 for t in g) for g in grouping]
            order_lists = [list(_host_orders(planning, devs)) if pipelined[gi] else [devs]
                           for gi, devs in enumerate(groups)]
            for orders in itertools.product(*order_lists):
                cand = asm.assemble(grouping, orders, chosen)
                if cand is None:
                    continue
                key = _canonical(cand)
                if key in seen:
                    continue
                seen.add(key)
                count += 1
                self._check(count, limit)
                ledger.evaluate(cand)
        return count

    def _restricted(self, ledger: Ledger, limit: int) -> int:
        grouping = self.config.grouping
        if grouping is None:
            raise InfeasibleError("exhaustive over the restricted space needs ExhaustiveConfig.grouping")
        space = RestrictedSpace(self.ctx.planning, tuple(tuple(g) for g in grouping), self.ctx.max_tp, self.ctx.max_pp)
        tasks = [t for g in space.grouping for t in g]
        count = 0
        for counts in space.feasible_counts():
            for shapes in itertools.product(*[space.shapes(t) for t in tasks]):
                cand = space.candidate(counts, dict(zip(tasks, shapes, strict=True)))
                if cand is None:
                    continue
                count += 1
                self._check(count, limit)
                ledger.evaluate(cand)
        return count


def _canonical(cand) -> tuple:
    """Candidates equal up to the order of replicas score the same; keep one of them."""
    lays = tuple((t, lay.tp, lay.pp, tuple(sorted(zip(lay.replicas, lay.shares, lay.layer_splits, strict=True))))
                 for t, lay in cand.layouts)
    return cand.groups, tuple(tuple(sorted(g)) for g in cand.group_devices), lays
