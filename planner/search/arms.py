"""HetRL's levels 1-2 as *arms*: a task grouping and, per group, how many GPUs of each kind.

Arms are cheap to name and expensive to judge (an arm is only as good as the best placement
inside it), so the search names them here and leaves judging them to successive halving. Small
problems enumerate every arm; larger ones start from the arms a person would try first
(`structured_arms`), and an evaluation budget too small for all of them keeps a seeded sample.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from hetprof.planner.search.space import Grouping, devices_by_type
from hetprof.specs.vocabulary import Task

if TYPE_CHECKING:
    from hetprof.planner.planning import PlanningContext

ETA = 3     # successive halving keeps the best 1/ETA of arms per rung
PART_SHARES = (0.5, 0.75)   # parts of a sub-pool that colocated arms also try (cheaper, often as fast)


@dataclasses.dataclass(frozen=True)
class Arm:
    """Levels 1-2: a grouping and, per group, the GPU count of each type (types in `types` order).

    `region`, when set, is where the arm's starting placements take GPUs first: a sub-pool arm
    (one region's GPUs) names its region so its counts are filled from there, not from wherever
    the locality order starts.
    """

    grouping: Grouping
    counts: tuple[tuple[int, ...], ...]
    types: tuple[str, ...]
    region: str | None = None
    regions: tuple[str | None, ...] = ()    # per group, where its GPUs come from (a pair of pools)

    @property
    def label(self) -> str:
        groups = []
        for g, (tasks, c) in enumerate(zip(self.grouping, self.counts, strict=True)):
            gpus = ",".join(f"{n}x{t}" for n, t in zip(c, self.types, strict=True) if n)
            where = f"@{self.regions[g]}" if self.regions and self.regions[g] else ""
            groups.append(f"{'+'.join(tasks)}[{gpus}]{where}")
        return " | ".join(groups) + (f" @{self.region}" if self.region else "")


def compositions(n: int, parts: int) -> list[tuple[int, ...]]:
    """Every way to write n as an ordered sum of `parts` non-negative integers."""
    out = []
    for bars in itertools.combinations(range(n + parts - 1), parts - 1):
        prev, parts_ = -1, []
        for b in (*bars, n + parts - 1):
            parts_.append(b - prev - 1)
            prev = b
        out.append(tuple(parts_))
    return out


def arm_count(groupings: Sequence[Grouping], totals: Sequence[int]) -> int:
    return sum(math.prod(math.comb(n + len(g), len(g)) for n in totals) for g in groupings)


def enumerate_arms(groupings: Sequence[Grouping], types: Sequence[str], totals: Sequence[int]) -> list[Arm]:
    """All arms: per grouping, every split of every GPU kind over its groups and the idle pool."""
    arms = []
    for grouping in groupings:
        k = len(grouping)
        per_type = [compositions(n, k + 1) for n in totals]
        for combo in itertools.product(*per_type):
            counts = tuple(tuple(combo[t][g] for t in range(len(types))) for g in range(k))
            if all(sum(c) > 0 for c in counts):
                arms.append(Arm(grouping, counts, tuple(types)))
    return arms


def region_cuts(planning: PlanningContext, by_type: dict[str, tuple[str, ...]], types: Sequence[str]) -> list[tuple[int, ...]]:
    """Per GPU kind, the counts that hand one side a whole-region block of its locality-ordered
    GPUs: every place the region changes, seen from either end (c and total - c)."""
    out = []
    for t in types:
        pool = by_type.get(t, ())
        cuts = {i for i in range(1, len(pool)) if planning.devices[pool[i]].region != planning.devices[pool[i - 1]].region}
        out.append(tuple(sorted(cuts | {len(pool) - c for c in cuts})))
    return out


def _add(arms: dict[tuple, Arm], grouping: Grouping, counts: tuple[tuple[int, ...], ...],
         types: Sequence[str], region: str | None = None, regions: tuple[str | None, ...] = ()) -> None:
    if all(sum(c) > 0 for c in counts):
        arms.setdefault((grouping, counts, region, regions), Arm(grouping, counts, tuple(types), region, regions))


def _whole_kinds(grouping: Grouping, totals: Sequence[int]) -> list[tuple[tuple[int, ...], ...]]:
    """Every GPU kind given whole to one group."""
    k, n = len(grouping), len(totals)
    if k > n:
        return []
    return [tuple(tuple(totals[t] if owner[t] == g else 0 for t in range(n)) for g in range(k))
            for owner in itertools.product(range(k), repeat=n)]


def _even(grouping: Grouping, totals: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    k = len(grouping)
    return tuple(tuple(totals[t] // k + (1 if g < totals[t] % k else 0) for t in range(len(totals)))
                 for g in range(k))


def _split_one_kind(grouping: Grouping, types: Sequence[str], totals: Sequence[int], t_major: int,
                    first: int) -> list[tuple[tuple[int, ...], ...]]:
    """Two groups: kind `t_major` split `first` / rest, every other kind whole to either side."""
    out = []
    for owner in itertools.product(range(2), repeat=len(types)):
        out.append(tuple(tuple(
            (first if g == 0 else totals[t] - first) if t == t_major
            else (totals[t] if owner[t] == g else 0) for t in range(len(types))) for g in range(2)))
    return out


def type_region_counts(planning: PlanningContext) -> Counter[tuple[str, str]]:
    """The cluster's GPUs counted per (type, region)."""
    return Counter((d.type, d.region) for d in planning.devices.values())


def sub_pools(planning: PlanningContext, types: Sequence[str]) -> list[tuple[tuple[int, ...], str | None]]:
    """The sub-pools a user would try by hand: each region, each GPU type, each type within a
    region — as GPU counts per type, with the region the GPUs must come from (None: any)."""
    count = type_region_counts(planning)
    regions = sorted({r for _, r in count})
    pools: list[tuple[tuple[int, ...], str | None]] = []
    if len(regions) > 1:
        pools += [(tuple(count.get((t, r), 0) for t in types), r) for r in regions]
    if len(types) > 1:
        pools += [(tuple(sum(count.get((u, r), 0) for r in regions) if u == t else 0 for u in types), None)
                  for t in types]
    if len(regions) > 1 and len(types) > 1:
        pools += [(tuple(count.get((u, r), 0) if u == t else 0 for u in types), r)
                  for r in regions for t in types
                  if count.get((t, r)) and sum(1 for (_, rr) in count if rr == r) > 1]
    # a region matters only where the pool's types also have GPUs elsewhere; one pool, one arm
    total = {t: sum(n for (u, _), n in count.items() if u == t) for t in types}
    out: dict[tuple, None] = {}
    for counts, region in pools:
        whole = all(n in (0, total[t]) for t, n in zip(types, counts, strict=True))
        out.setdefault((counts, None if whole else region), None)
    return list(out)


def one_region_pools(planning: PlanningContext, types: Sequence[str]) -> list[tuple[tuple[int, ...], str]]:
    """Each region's GPUs, and each GPU type's within a region that has several, as counts per type
    with their region, most bf16 FLOPs first (training is compute-bound: the pool that would train
    fastest is offered first); none on a one-region cluster."""
    pools = region_pools(planning, types)
    if not pools:
        return []
    count = type_region_counts(planning)
    regions = [r for _, r in pools]
    pools += [(tuple(count.get((u, r), 0) if u == t else 0 for u in types), r) for r in regions for t in types
              if count.get((t, r)) and sum(1 for (_, rr) in count if rr == r) > 1]
    flops = [planning.catalog.lookup(t).peak_flops("bf16") for t in types]
    return sorted(pools, key=lambda p: (-sum(n * f for n, f in zip(p[0], flops, strict=True)), p[1], p[0]))


def pool_pairs(planning: PlanningContext, types: Sequence[str]) -> list[tuple[tuple[tuple[int, ...], str], ...]]:
    """Ordered pairs of disjoint one-region pools (a region, or a GPU type within it): generation
    on the first, everything else on the second, the rest idle — the disaggregated plan of a
    geo-distributed cluster, where each stage stays inside one datacenter and only weights and
    rollouts cross the WAN. Largest pairs first, then by the link between their regions (the
    weights cross it every step)."""
    host_of: dict[str, str] = {}
    for d in planning.devices.values():
        host_of.setdefault(d.region, d.host)
    pools = one_region_pools(planning, types)

    def disjoint(a: tuple[tuple[int, ...], str], b: tuple[tuple[int, ...], str]) -> bool:
        return a[1] != b[1] or not any(x and y for x, y in zip(a[0], b[0], strict=True))

    def rank(pair: tuple) -> tuple:
        (ca, ra), (cb, rb) = pair
        link = planning.links.between(host_of[ra], host_of[rb])
        return -sum(ca) - sum(cb), -link.beta_Bps, ra, rb, ca, cb

    return sorted(((a, b) for a in pools for b in pools if a is not b and disjoint(a, b)), key=rank)


def region_pools(planning: PlanningContext, types: Sequence[str]) -> list[tuple[tuple[int, ...], str]]:
    """Each region's whole GPU pool as counts per type, regions in name order; none on one region."""
    count = type_region_counts(planning)
    regions = sorted({r for _, r in count})
    if len(regions) < 2:
        return []
    return [(tuple(count.get((t, r), 0) for t in types), r) for r in regions]


def region_pair_arms(grouping: Grouping, pools: Sequence[tuple[tuple[int, ...], str]],
                     types: Sequence[str]) -> list[Arm]:
    """A two-group grouping with each group on a different region's whole pool, every ordered pair
    (`pools` from `region_pools`): the disaggregated plan of a geo-distributed cluster for groupings
    other than generation alone, where each group's traffic stays in its datacenter."""
    if len(grouping) != 2:
        return []
    return [Arm(grouping, (ca, cb), tuple(types), None, (ra, rb))
            for ca, ra in pools for cb, rb in pools if ra != rb and sum(ca) and sum(cb)]


def host_splits(planning: PlanningContext, types: Sequence[str]) -> list[tuple[tuple[tuple[int, ...], str], ...]]:
    """On a one-region cluster, the disaggregated plans a pair of pools names elsewhere: generation
    alone on whole hosts of one GPU type (a block at every host boundary of its locality order), the
    rest of the cluster on everything else — pair-shaped, as `pool_pairs` gives them. Blocks with the
    most HBM bandwidth first (decoding is memory-bound). None where the cluster spans regions."""
    regions = {d.region for d in planning.devices.values()}
    if len(regions) != 1:
        return []
    (region,) = regions
    by_type = devices_by_type(planning)  # locality order: one region, so host then index
    totals = [len(by_type.get(t, ())) for t in types]
    out = []
    for i, t in enumerate(types):
        pool, bandwidth = by_type.get(t, []), planning.catalog.lookup(t).hbm_Bps
        for c in range(1, len(pool)):
            if planning.devices[pool[c]].host != planning.devices[pool[c - 1]].host:
                gen = tuple(c if j == i else 0 for j in range(len(types)))
                rest = tuple(n - g for n, g in zip(totals, gen, strict=True))
                out.append((-c * bandwidth, (gen, region), (rest, region)))
    return [(gen, rest) for _, gen, rest in sorted(out)]


def _interleave(lists: Sequence[Sequence[Arm]]) -> list[Arm]:
    """Round-robin over the lists, first occurrences only: every prefix mixes every kind of arm."""
    out: dict[Arm, None] = {}
    for i in range(max((len(x) for x in lists), default=0)):
        for x in lists:
            if i < len(x):
                out.setdefault(x[i], None)
    return list(out)


def structured_arms(groupings: Sequence[Grouping], types: Sequence[str], totals: Sequence[int],
                    cuts: Sequence[Sequence[int]] | None = None,
                    pools: Sequence[tuple[tuple[int, ...], str | None]] = (), parts: bool = False,
                    pairs: Sequence[tuple[tuple[tuple[int, ...], str], ...]] = (),
                    trainers: Sequence[tuple[tuple[int, ...], str]] = ()) -> list[Arm]:
    """Arms a person would try first: whole GPU kinds per group, even splits of every kind, (two
    groups) one kind split in quarters or at a region boundary (`cuts`, from `region_cuts`), and
    every task on one sub-pool (`pools`, from `sub_pools`) or generation apart from the rest on it,
    and (`parts`, for objectives that price GPUs) every task on half or three quarters of one,
    and generation alone on the first pool of a pair, the rest on the second (`pairs`, from `pool_pairs`
    or, on one region, `host_splits`),
    and (`trainers`, from `one_region_pools`, tried in that order) the group holding the actor's training on one
    region's pool with the other group on every GPU outside it: training's gradient traffic stays
    in one datacenter while generation uses the whole rest of the cluster.

    A region-aligned split is the disaggregated plan a geo-distributed cluster invites, e.g.
    generation on one region's L40S and every other kind, training on another region's L40S
    (StreamRL's structure); quarters of a kind cut through hosts and regions and miss it. A
    sub-pool leaves the rest of the cluster idle: the cheap plan a cost objective looks for, and
    the fast one when the links between regions are slow. The kinds are interleaved, so any
    prefix of the list (what a small budget affords) holds some of each.
    """
    whole: dict[tuple, Arm] = {}
    even: dict[tuple, Arm] = {}
    quarters: dict[tuple, Arm] = {}
    regional: dict[tuple, Arm] = {}
    pooled: dict[tuple, Arm] = {}
    paired: dict[tuple, Arm] = {}
    trained: dict[tuple, Arm] = {}
    for pool, region in trainers:
        for grouping in groupings:
            if len(grouping) == 2 and Task.ACTOR_TRAIN in grouping[1]:
                rest = tuple(n - m for n, m in zip(totals, pool, strict=True))
                _add(trained, grouping, (rest, pool), types, None, (None, region))
    for grouping in groupings:
        if len(grouping) == 2 and grouping[0] == (Task.ACTOR_GEN,):
            for (gen, gen_region), (rest, rest_region) in pairs:
                _add(paired, grouping, (gen, rest), types, None, (gen_region, rest_region))
        for counts in _whole_kinds(grouping, totals):
            _add(whole, grouping, counts, types)
        _add(even, grouping, _even(grouping, totals), types)
        if len(grouping) == 2:
            for t_major in range(len(types)):
                for q in (1, 3):            # one kind split in quarters, the others whole to either side
                    for counts in _split_one_kind(grouping, types, totals, t_major, totals[t_major] * q // 4):
                        _add(quarters, grouping, counts, types)
                # the first group takes `cut` of this kind (its locality-ordered first GPUs in the
                # seed placement; the second group's seed variant takes the rest's first), others whole
                for cut in (cuts[t_major] if cuts else ()):
                    for counts in _split_one_kind(grouping, types, totals, t_major, cut):
                        _add(regional, grouping, counts, types)
        if len(grouping) <= 2:
            for pool, region in pools:
                for counts in (*_whole_kinds(grouping, pool), _even(grouping, pool)):
                    _add(pooled, grouping, counts, types, region)
                if parts and len(grouping) == 1:    # every task on part of the pool: cheaper, often as fast
                    for share in PART_SHARES:
                        _add(pooled, grouping, (tuple(int(n * share) for n in pool),), types, region)
    one_region = _interleave([list(paired.values()), list(trained.values())])  # one share of the prefix between them
    return _interleave([list(whole.values()), list(regional.values()), list(pooled.values()), one_region,
                        list(even.values()), list(quarters.values())])


def affordable_arms(arms: list[Arm], first: list[Arm], evals: int, seed: int) -> list[Arm]:
    """As many arms as halving can afford with `evals` (two looks each per rung, every rung
    costing about the same): the arms of `first` (structured) first, then a seeded sample of the rest."""
    room = len(arms)
    while room > 1 and 2 * room * (math.ceil(math.log(room, ETA)) + 1) > evals:
        room -= 1
    if len(arms) <= room:
        return arms
    known = set(arms)
    chosen = [a for a in first if a in known][:room]
    taken = set(chosen)
    rest = [a for a in arms if a not in taken]
    rng = np.random.default_rng([seed, 1])
    picks = rng.choice(len(rest), size=room - len(chosen), replace=False) if room > len(chosen) else []
    return chosen + [rest[int(i)] for i in sorted(picks)]
