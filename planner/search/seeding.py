"""An arm's starting placements: each group's GPUs of every kind as contiguous, locality-ordered blocks.

Evolution (`evolution`) starts every arm from these and screening scores an arm by its first one,
so a starting placement that splits a group across regions for no reason hides a good arm.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from hetprof.planner.search.arms import Arm


def initial_orders(arm: Arm, by_type: dict[str, tuple[str, ...]], variant: int, rng: np.random.Generator,
                   region_of: Callable[[str], str] | None = None) -> tuple[tuple[str, ...], ...]:
    """Hand each group its count of every type as contiguous, locality-ordered blocks.

    Variant 0 fills groups in order (idle GPUs last), variant 1 in reverse, later variants in a
    random group order: contiguous blocks keep a group on as few hosts and regions as possible.
    An arm with a `region` takes that region's GPUs (`region_of`) first. A group takes each later
    kind's GPUs first from the regions its earlier kinds put it in (`_cohesive`): locality order is
    per kind, and cut blindly it can hand a group a second kind from a region it is not in.
    """
    k = len(arm.grouping)
    slots = list(range(k + 1))
    if variant == 1:
        slots = list(reversed(range(k))) + [k]
    elif variant >= 2:
        slots = [int(x) for x in rng.permutation(k + 1)]
    orders: list[list[str]] = [[] for _ in range(k + 1)]
    held: list[set[str]] = [set() for _ in range(k)]
    for ti, t in enumerate(arm.types):
        pool = list(by_type.get(t, ()))
        if arm.region is not None and region_of is not None:
            pool.sort(key=lambda d: region_of(d) != arm.region)
        want = [arm.counts[g][ti] for g in range(k)]
        want.append(len(pool) - sum(want))
        if arm.regions and region_of is not None:
            pool = _by_group_region(pool, want, arm.regions, region_of)
            slots = list(range(k + 1))
        elif region_of is not None:
            pool = _cohesive(pool, want, slots, held, region_of)
            pos = 0
            for g in slots:
                if g < k:
                    held[g].update(region_of(d) for d in pool[pos:pos + want[g]])
                pos += want[g]
        pos = 0
        for g in slots:
            orders[g].extend(pool[pos:pos + want[g]])
            pos += want[g]
    return tuple(tuple(o) for o in orders)


def _cohesive(pool: list[str], want: list[int], slots: Sequence[int], held: Sequence[set[str]],
              region_of: Callable[[str], str]) -> list[str]:
    """The pool reordered so that, cut in `slots` order, each group's block is taken first from the
    regions it already `held` (its earlier kinds), the rest in locality order; the idle slot (the
    last of `want`) takes what is left."""
    idle = len(want) - 1
    left = list(pool)
    picked: dict[int, list[str]] = {g: [] for g in slots}
    for g in slots:
        if g != idle and held[g]:
            picked[g] = [d for d in left if region_of(d) in held[g]][:want[g]]
            taken = set(picked[g])
            left = [d for d in left if d not in taken]
    for g in slots:
        need = want[g] - len(picked[g])
        picked[g] += left[:need]
        left = left[need:]
    return [d for g in slots for d in picked[g]]


def _by_group_region(pool: list[str], want: list[int], regions: Sequence[str | None],
                     region_of: Callable[[str], str]) -> list[str]:
    """The pool reordered so that, cut in group order, each group's block comes from its own
    region first (a pair-of-pools arm); groups with a region choose before groups without, and
    the idle GPUs are what is left, in locality order."""
    left = list(pool)
    picked: dict[int, list[str]] = {}
    for g in sorted(range(len(want) - 1), key=lambda g: regions[g] is None):
        mine = [d for d in left if regions[g] is not None and region_of(d) == regions[g]][:want[g]]
        mine += [d for d in left if d not in mine][:want[g] - len(mine)]
        picked[g] = mine
        left = [d for d in left if d not in mine]
    return [d for g in range(len(want) - 1) for d in picked[g]] + left
