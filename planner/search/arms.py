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
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from hetprof.planner.search.space import Grouping

if TYPE_CHECKING:
    from hetprof.planner.simulator import Simulator

ETA = 3     # successive halving keeps the best 1/ETA of arms per rung


@dataclasses.dataclass(frozen=True)
class Arm:
    """Levels 1-2: a grouping and, per group, the GPU count of each type (types in `types` order)."""

    grouping: Grouping
    counts: tuple[tuple[int, ...], ...]
    types: tuple[str, ...]

    @property
    def label(self) -> str:
        groups = []
        for tasks, c in zip(self.grouping, self.counts, strict=True):
            gpus = ",".join(f"{n}x{t}" for n, t in zip(c, self.types, strict=True) if n)
            groups.append(f"{'+'.join(tasks)}[{gpus}]")
        return " | ".join(groups)


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


def region_cuts(sim: Simulator, by_type: dict[str, tuple[str, ...]], types: Sequence[str]) -> list[tuple[int, ...]]:
    """Per GPU kind, the counts that hand one side a whole-region block of its locality-ordered
    GPUs: every place the region changes, seen from either end (c and total - c)."""
    out = []
    for t in types:
        pool = by_type.get(t, ())
        cuts = {i for i in range(1, len(pool)) if sim.devices[pool[i]].region != sim.devices[pool[i - 1]].region}
        out.append(tuple(sorted(cuts | {len(pool) - c for c in cuts})))
    return out


def _add(arms: dict[tuple, Arm], grouping: Grouping, counts: tuple[tuple[int, ...], ...],
         types: Sequence[str]) -> None:
    if all(sum(c) > 0 for c in counts):
        arms.setdefault((grouping, counts), Arm(grouping, counts, tuple(types)))


def _split_one_kind(grouping: Grouping, types: Sequence[str], totals: Sequence[int], t_major: int,
                    first: int) -> list[tuple[tuple[int, ...], ...]]:
    """Two groups: kind `t_major` split `first` / rest, every other kind whole to either side."""
    out = []
    for owner in itertools.product(range(2), repeat=len(types)):
        out.append(tuple(tuple(
            (first if g == 0 else totals[t] - first) if t == t_major
            else (totals[t] if owner[t] == g else 0) for t in range(len(types))) for g in range(2)))
    return out


def structured_arms(groupings: Sequence[Grouping], types: Sequence[str], totals: Sequence[int],
                    cuts: Sequence[Sequence[int]] | None = None) -> list[Arm]:
    """Arms a person would try first: whole GPU kinds per group, even splits of every kind, and
    (two groups) one kind split in quarters or at a region boundary (`cuts`, from `region_cuts`).

    A region-aligned split is the disaggregated plan a geo-distributed cluster invites, e.g.
    generation on one region's L40S and every other kind, training on another region's L40S
    (StreamRL's structure); quarters of a kind cut through hosts and regions and miss it.
    """
    arms: dict[tuple, Arm] = {}
    for grouping in groupings:
        k = len(grouping)
        if k <= len(types):
            for owner in itertools.product(range(k), repeat=len(types)):
                _add(arms, grouping, tuple(tuple(totals[t] if owner[t] == g else 0 for t in range(len(types)))
                                           for g in range(k)), types)
        _add(arms, grouping, tuple(tuple(totals[t] // k + (1 if g < totals[t] % k else 0)
                                         for t in range(len(types))) for g in range(k)), types)
        if k == 2:
            for t_major in range(len(types)):
                for q in (1, 3):            # one kind split in quarters, the others whole to either side
                    for counts in _split_one_kind(grouping, types, totals, t_major, totals[t_major] * q // 4):
                        _add(arms, grouping, counts, types)
    for grouping in groupings:
        if len(grouping) != 2 or not cuts:
            continue
        for t_major in range(len(types)):
            # the first group takes `cut` of this kind (its locality-ordered first GPUs in the seed
            # placement; the second group's seed variant takes the rest's first), others whole
            for cut in cuts[t_major]:
                for counts in _split_one_kind(grouping, types, totals, t_major, cut):
                    _add(arms, grouping, counts, types)
    return list(arms.values())


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
