"""Device pools a user of a published system would hand it: whole hosts of the cluster, all of
them, one region's, one GPU type's, or one type's within one region.

The baselines choose among these the way their careful users do (trying each and keeping the
best), so a baseline is never held to the whole cluster when part of it would serve it better.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from hetprof.planner.search import layouts

if TYPE_CHECKING:
    from hetprof.planner.planning import PlanningContext


@dataclasses.dataclass(frozen=True)
class Pool:
    """A named set of whole hosts' devices, in locality order."""

    name: str
    devices: tuple[str, ...]

    def regions(self, planning: PlanningContext) -> set[str]:
        return {planning.devices[d].region for d in self.devices}


def hosts(planning: PlanningContext) -> dict[str, tuple[str, ...]]:
    """Each host's devices, hosts in locality order (region, host)."""
    out: dict[str, list[str]] = {}
    for d in layouts.canonical_order(planning, planning.devices):
        out.setdefault(planning.devices[d].host, []).append(d)
    return {h: tuple(ds) for h, ds in out.items()}


def _pool(planning: PlanningContext, name: str, members: list[tuple[str, ...]]) -> Pool:
    return Pool(name, layouts.canonical_order(planning, [d for ds in members for d in ds]))


def host_pools(planning: PlanningContext) -> list[Pool]:
    """All GPUs, each region, each GPU type, each type within a region (one pool per device set)."""
    by_host = hosts(planning)
    first = {h: planning.devices[ds[0]] for h, ds in by_host.items()}
    regions = sorted({d.region for d in first.values()})
    types = sorted({d.type for d in first.values()})
    named = [("all GPUs", list(by_host.values()))]
    named += [(f"region {r}", [ds for h, ds in by_host.items() if first[h].region == r]) for r in regions]
    named += [(f"type {t}", [ds for h, ds in by_host.items() if first[h].type == t]) for t in types]
    named += [(f"{t} in {r}", [ds for h, ds in by_host.items() if first[h].type == t and first[h].region == r])
              for r in regions for t in types]
    out: dict[tuple[str, ...], Pool] = {}
    for name, members in named:
        if members:
            pool = _pool(planning, name, members)
            out.setdefault(pool.devices, pool)
    return list(out.values())


def region_pools(planning: PlanningContext, rank: dict[str, float]) -> list[Pool]:
    """Pools inside one region: the region, each type in it, and its hosts ranked by `rank` (host ->
    key, lower first) cut at every host count, from either end."""
    by_host = hosts(planning)
    out: dict[tuple[str, ...], Pool] = {}
    for pool in host_pools(planning):
        if len(pool.regions(planning)) == 1 and pool.name != "all GPUs":
            out.setdefault(pool.devices, pool)
    for region in sorted({planning.devices[ds[0]].region for ds in by_host.values()}):
        mine = sorted((h for h, ds in by_host.items() if planning.devices[ds[0]].region == region),
                      key=lambda h: (rank.get(h, 0.0), list(by_host).index(h)))
        for k in range(1, len(mine)):
            for name, part in ((f"first {k} of {region}", mine[:k]), (f"last {len(mine) - k} of {region}", mine[k:])):
                pool = _pool(planning, name, [by_host[h] for h in part])
                out.setdefault(pool.devices, pool)
    return list(out.values())
