"""Is a candidate well-formed? Every task in exactly one group, groups on disjoint devices of the
cluster, and each task's layout consistent (degrees, replicas, shares, layer splits, sharding, and —
when planning for `hetprof run` — only what it carries out). Problems come back as sentences.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from hetprof.planner.candidate import Candidate
from hetprof.planner.graph import RLGraph
from hetprof.planner.memo import memoised
from hetprof.specs import SHARDING, Device, executable
from hetprof.specs.layout import TaskLayout
from hetprof.specs.vocabulary import TaskKind

LAYOUT_MEMO = 20_000   # (layout, group) checks kept


class StructureCheck:
    """The structure rules of one (cluster, workload); each layout's check memoised."""

    def __init__(self, graph: RLGraph, tasks: Sequence[str], devices: Mapping[str, Device], cluster_name: str,
                 algorithm: str, executable: bool, packed: bool = False, backend: str = "vllm") -> None:
        self.graph, self.tasks, self.devices = graph, list(tasks), devices
        self.cluster_name, self.algorithm, self.executable = cluster_name, algorithm, executable
        self.packed = packed  # the workload packs its passes (max_tokens_per_microbatch): Ulysses can run
        self.backend = backend  # the generation engine: the hf backend's TP is the executor's own

    def problems(self, cand: Candidate) -> list[str]:
        """Everything that makes a candidate malformed, as sentences (empty when well-formed)."""
        out: list[str] = []
        expected = set(self.tasks)
        grouped = [t for g in cand.groups for t in g]
        for t in sorted(set(grouped) - expected):
            out.append(f"task {t!r} is not part of this {self.algorithm} workload ({', '.join(self.tasks)})")
        for t in self.tasks:
            n = grouped.count(t)
            if n != 1:
                out.append(f"task {t} is in {n} groups; every task must be in exactly one")
        if len(cand.groups) != len(cand.group_devices):
            out.append(f"{len(cand.groups)} groups but {len(cand.group_devices)} device lists")
            return out
        owner: dict[str, int] = {}
        for gi, devs in enumerate(cand.group_devices):
            if not devs:
                out.append(f"group {gi} ({', '.join(cand.groups[gi])}) has no devices")
            for d in devs:
                if d not in self.devices:
                    out.append(f"group {gi} names device {d!r}, which is not in cluster {self.cluster_name!r}")
                elif d in owner and owner[d] != gi:
                    out.append(f"device {d} is in groups {owner[d]} and {gi}; groups must not share devices")
                owner.setdefault(d, gi)
        names = dict(cand.layouts)
        for gi, tasks in enumerate(cand.groups):
            for t in tasks:
                if t not in expected:
                    continue
                lay = names.get(t)
                if lay is None:
                    out.append(f"task {t} has no layout")
                    continue
                out.extend(self.layout_problems(lay, cand.group_devices[gi], gi))
        return out

    @memoised(LAYOUT_MEMO)
    def layout_problems(self, lay: TaskLayout, group_devices: tuple[str, ...], gi: int) -> list[str]:
        """What is wrong with one task's layout in group `gi` (on `group_devices`)."""
        group = set(group_devices)
        out: list[str] = []
        t = lay.task
        layers = self.graph.model_of(t).layers
        if lay.tp < 1 or lay.pp < 1:
            return [f"{t}: tp and pp must be >= 1 (got tp={lay.tp}, pp={lay.pp})"]
        if lay.dp < 1:
            return [f"{t}: a layout needs at least one replica"]
        if lay.pp > layers:
            out.append(f"{t}: pp={lay.pp} exceeds the model's {layers} layers")
        seen: set[str] = set()
        own_tp = self.graph.kind_of(t) == TaskKind.GENERATION  # only rollout replicas may differ in TP
        per = lay.pp * lay.cp  # a stage holds cp TP groups (context parallelism)
        for r, devs in enumerate(lay.replicas):
            tp = len(devs) // per if own_tp else lay.tp  # at most the layout's largest degree, tp
            if not 1 <= tp <= lay.tp or len(devs) != tp * per:
                cp = "*cp" if lay.cp > 1 else ""
                out.append(f"{t}: replica {r} has {len(devs)} devices, tp*pp{cp} = {lay.tp * per} expected")
            for d in devs:
                if d not in group:
                    out.append(f"{t}: replica {r} uses {d}, which is not a device of its group {gi}")
                if d in seen:
                    out.append(f"{t}: device {d} appears twice in the layout")
                seen.add(d)
        if len(lay.shares) != lay.dp or any(s < 0 or not math.isfinite(s) for s in lay.shares):
            out.append(f"{t}: {len(lay.shares)} batch shares for {lay.dp} replicas (need one non-negative share each)")
        elif not math.isclose(sum(lay.shares), 1.0, abs_tol=1e-6):
            out.append(f"{t}: batch shares sum to {sum(lay.shares):.6f}, not 1")
        if len(lay.layer_splits) != lay.dp:
            out.append(f"{t}: {len(lay.layer_splits)} layer splits for {lay.dp} replicas")
        else:
            for r, split in enumerate(lay.layer_splits):
                if len(split) != lay.pp or any(x < 1 for x in split) or sum(split) != layers:
                    out.append(f"{t}: replica {r}'s layer split {list(split)} is not {lay.pp} positive stages "
                               f"summing to {layers} layers")
        if lay.sharding not in SHARDING:
            out.append(f"{t}: unknown sharding {lay.sharding!r} (one of {', '.join(SHARDING)})")
        elif lay.sharding != "none" and self.graph.kind_of(t) != TaskKind.TRAINING:
            out.append(f"{t}: {lay.sharding} sharding on a {self.graph.kind_of(t)} task (only training shards its state)")
        if self.executable:
            out.extend(f"{p} (`hetprof run` would refuse it; plan with --any-layout to allow it)"
                       for tp in sorted(set(lay.tp_degrees()))
                       for p in executable.layout_problems(t, self.graph.kind_of(t), self.graph.model_of(t), tp,
                                                           lay.pp, lay.layer_splits, lay.describe(), lay.sharding,
                                                           sp=lay.sp, cp=lay.cp, ep=lay.ep, packed=self.packed,
                                                           backend=self.backend))
        return out
