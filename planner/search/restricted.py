"""The ILP's restricted space: a fixed grouping, whole-host GPU counts and type-pure replicas.

An exact integer program needs a space it can describe linearly. GPUs are pooled by *kind*: a
GPU type on hosts of one size (A100 on 8-GPU hosts and A100 on 2-GPU hosts are two kinds) in one
region, so every host of a kind looks the same and the program can see which regions a group spans. A group receives, of every kind, `x` devices taken host by host (full hosts first, then part of one more), and each task
picks one TP×PP and runs as many replicas as fit on each type separately (a replica never mixes
types, so its speed is a per-type constant). Batch shares and layer splits are then balanced as
everywhere else. `exhaustive --restricted` enumerates exactly this space, which is how the tests
check the ILP.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from hetprof.planner.candidate import Candidate
from hetprof.planner.search import layouts
from hetprof.planner.search.space import Grouping, devices_by_type, gpu_types

if TYPE_CHECKING:
    from hetprof.planner.planning import PlanningContext


class RestrictedSpace:
    """Host blocks per type and the candidate each (counts, shapes) choice stands for."""

    def __init__(self, planning: PlanningContext, grouping: Grouping, max_tp: int = 8, max_pp: int = 4) -> None:
        self.planning = planning
        self.grouping = grouping
        self.max_tp, self.max_pp = max_tp, max_pp
        by_type = devices_by_type(planning)
        self.hosts: dict[str, list[tuple[str, ...]]] = {}
        for t in gpu_types(planning):
            per: dict[str, list[str]] = {}
            for d in by_type[t]:
                per.setdefault(planning.devices[d].host, []).append(d)
            for devs in per.values():
                region = planning.devices[devs[0]].region
                self.hosts.setdefault(f"{t}/{len(devs)}@{region}", []).append(tuple(devs))
        self.types = tuple(sorted(self.hosts))          # kinds: "type/GPUs per host@region"
        self.region = {k: planning.devices[self.hosts[k][0][0]].region for k in self.types}
        self.totals = {k: sum(len(h) for h in self.hosts[k]) for k in self.types}
        self._members = {k: {d for h in self.hosts[k] for d in h} for k in self.types}
        self._spans = {k: self._domain_gpus(k) for k in self.types}
        self._layouts: dict[tuple, object] = {}
        self.memo: dict = {}

    def host_size(self, t: str) -> int:
        """Devices per host of kind t (uniform by construction)."""
        return len(self.hosts[t][0])

    def hosts_needed(self, t: str, count: int) -> int:
        return math.ceil(count / self.host_size(t)) if count else 0

    def _domain_gpus(self, t: str) -> int:
        """Devices of kind t one NVLink domain holds, the fewest of any: a host's, unless the cluster
        spec joins hosts into one domain (a GB200 NVL72's trays)."""
        per: dict[str, int] = {}
        for host in self.hosts[t]:
            domain = self.planning.devices[host[0]].nvlink_domain
            per[domain] = per.get(domain, 0) + len(host)
        return min(per.values())

    def tp_span(self, t: str) -> int:
        """The most devices of kind t one TP group may take: TP stays inside an NVLink domain."""
        return self._spans[t]

    def tp_groups(self, t: str, count: int, tp: int) -> int:
        """TP groups that `count` host-block devices of type t form: taken host by host, in domain
        order, a group stays inside an NVLink domain (a host, or hosts the spec joins into one)."""
        n = self.tp_span(t)
        return (count // n) * (n // tp) + (count % n) // tp

    def members(self, kind: str) -> set[str]:
        return self._members[kind]

    def feasible_counts(self) -> list[tuple[tuple[int, ...], ...]]:
        """Every x[g][kind] whose host blocks fit the cluster, each group non-empty."""
        k = len(self.grouping)
        per_type = []
        for t in self.types:
            opts = []
            for combo in itertools.product(range(self.totals[t] + 1), repeat=k):
                if sum(self.hosts_needed(t, c) for c in combo) <= len(self.hosts[t]):
                    opts.append(combo)
            per_type.append(opts)
        out = []
        for choice in itertools.product(*per_type):
            counts = tuple(tuple(choice[ti][g] for ti in range(len(self.types))) for g in range(k))
            if all(sum(c) > 0 for c in counts):
                out.append(counts)
        return out

    def group_devices(self, counts: Sequence[Sequence[int]]) -> list[tuple[str, ...]]:
        """Concrete devices: per type, groups take host blocks in locality order, group 0 first."""
        out: list[list[str]] = [[] for _ in self.grouping]
        for ti, t in enumerate(self.types):
            free = list(self.hosts[t])
            for g in range(len(self.grouping)):
                need = counts[g][ti]
                while need > 0:
                    host = free.pop(0)
                    out[g].extend(host[:need])
                    need -= min(need, len(host))
        return [tuple(o) for o in out]

    def shapes(self, task: str) -> list[tuple[int, int]]:
        tps, stages = layouts.degree_limits(self.planning, task, self.max_tp, self.max_pp)
        return [(tp, pp) for tp in tps for pp in range(1, stages + 1)]

    def replicas(self, devices: Sequence[str], tp: int, pp: int) -> list[tuple[str, ...]]:
        """Type-pure replicas: per type, same-host TP groups chunked into pp stages."""
        out = []
        for t in self.types:
            mine = [d for d in devices if d in self._members[t]]
            out.extend(layouts.arrange(self.planning, mine, tp, pp))
        return out

    def candidate(self, counts: Sequence[Sequence[int]], shapes: dict[str, tuple[int, int]]) -> Candidate | None:
        groups = self.group_devices(counts)
        lays = {}
        for tasks, devs in zip(self.grouping, groups, strict=True):
            for task in tasks:
                tp, pp = shapes[task]
                key = (task, devs, tp, pp)
                if key not in self._layouts:
                    self._layouts[key] = layouts.balanced_layout(self.planning, task, self.replicas(devs, tp, pp), tp, pp,
                                                                    memo=self.memo)
                lay = self._layouts[key]
                if lay is None:
                    return None
                lays[task] = lay
        return Candidate(self.grouping, groups, lays)
