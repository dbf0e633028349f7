"""The search space every search walks, and the one place that turns choices into Candidates.

HetRL's five levels map onto three choices here: a *grouping* (level 1: which tasks time-share
GPUs), per group an *ordered device list* (levels 2-3 and 5: how many GPUs of each kind, which
ones, and — through the order — which tasklet sits where), and per task a *shape* TP×PP (level 4).
Layer splits, batch shares, a training layout's data-parallel sharding, the sequence-split degrees
(Ulysses sp, context-parallel cp) and an MoE task's expert-parallel degree are not searched here:
`search.layouts` balances the first two to device speed and picks the sharding, the split degrees and
the EP degree per shape (EP moves no device, only which replicas share experts).
The old-log-prob pass is never placed: it follows actor_train (hetprof.specs.plan.FOLLOWS).
Keeping the assembly here guarantees `exhaustive`, `hetrl` and the ILP explore the same space, so
the tests can compare their optima honestly.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Collection, Iterator, Sequence
from typing import TYPE_CHECKING

from hetprof.errors import SpecError
from hetprof.planner.candidate import Candidate
from hetprof.planner.memo import memoised
from hetprof.planner.search import layouts
from hetprof.specs.layout import TaskLayout
from hetprof.specs.loader import check_plain

if TYPE_CHECKING:
    from hetprof.planner.planning import PlanningContext

Grouping = tuple[tuple[str, ...], ...]
Orders = tuple[tuple[str, ...], ...]
ShapeChoice = tuple[int, int]  # (tp, pp)


def set_partitions(items: Sequence[str]) -> Iterator[Grouping]:
    """Every way to split `items` into non-empty groups (Bell-number many; 203 for six tasks)."""
    items = list(items)
    if not items:
        yield ()
        return
    first, rest = items[0], items[1:]
    for part in set_partitions(rest):
        yield ((first,), *part)
        for i in range(len(part)):
            yield (*part[:i], (first, *part[i]), *part[i + 1:])


def canonical_grouping(grouping: Sequence[Sequence[str]], task_order: Sequence[str]) -> Grouping:
    """Groups with tasks in workflow order, groups ordered by their first task."""
    rank = {t: i for i, t in enumerate(task_order)}
    groups = [tuple(sorted(g, key=rank.__getitem__)) for g in grouping]
    return tuple(sorted(groups, key=lambda g: rank[g[0]]))


def all_groupings(planning: PlanningContext) -> list[Grouping]:
    tasks = list(planning.tasks)
    return sorted({canonical_grouping(p, tasks) for p in set_partitions(tasks)},
                  key=lambda g: (len(g), grouping_label(g)))


def grouping_label(grouping: Grouping) -> str:
    return " | ".join("+".join(g) for g in grouping)


def gpu_types(planning: PlanningContext) -> tuple[str, ...]:
    return tuple(sorted({d.type for d in planning.devices.values()}))


def devices_by_type(planning: PlanningContext) -> dict[str, tuple[str, ...]]:
    """Each type's devices in locality order (region, host, index)."""
    out: dict[str, list[str]] = {}
    for d in layouts.canonical_order(planning, planning.devices):
        out.setdefault(planning.devices[d].type, []).append(d)
    return {t: tuple(v) for t, v in out.items()}


def counts_of(planning: PlanningContext, devices: Sequence[str], types: Sequence[str]) -> tuple[int, ...]:
    return tuple(sum(1 for d in devices if planning.devices[d].type == t) for t in types)


class Assembler:
    """Builds candidates from (grouping, orders, shapes), memoising every balanced layout.

    The same task on the same ordered devices with the same shape recurs across thousands of
    candidates; balancing it calls the simulator dozens of times, so it is done once.
    """

    def __init__(self, planning: PlanningContext, max_tp: int = 8, max_pp: int = 4) -> None:
        self.planning = planning
        self.max_tp = max_tp
        self.max_pp = max_pp
        self.memo: dict = {}

    @memoised(1 << 16)
    def layout(self, task: str, order: tuple[str, ...], tp: int, pp: int) -> TaskLayout | None:
        return layouts.build_layout(self.planning, task, order, tp, pp, memo=self.memo)

    def own_seconds(self, task: str, order: tuple[str, ...], shape: ShapeChoice) -> float:
        """The task's own seconds on its balanced layout at `shape` (inf if none fits)."""
        lay = self.layout(task, order, *shape)
        return math.inf if lay is None else layouts.layout_cost(self.planning, lay)

    @memoised(1 << 16)
    def shapes(self, task: str, per_host: tuple[int, ...]) -> tuple[ShapeChoice, ...]:
        limits = layouts.degree_limits(self.planning, task, self.max_tp, self.max_pp)
        return tuple((s.tp, s.pp) for s in layouts.shapes_for_hosts(per_host, *limits))

    def shapes_for(self, task: str, devices: Sequence[str]) -> tuple[ShapeChoice, ...]:
        """Feasible (tp, pp) for a task on a device set (depends only on devices per NVLink domain:
        per host, unless the spec joins hosts into one domain)."""
        per_host: dict[str, int] = {}
        for d in devices:
            domain = self.planning.devices[d].nvlink_domain
            per_host[domain] = per_host.get(domain, 0) + 1
        return self.shapes(task, tuple(sorted(per_host.values())))

    @memoised(1 << 14)
    def best_shape(self, task: str, order: tuple[str, ...]) -> ShapeChoice | None:
        return layouts.best_of(self.planning, self.shapes_for(task, order),
                               lambda tp, pp: self.layout(task, order, tp, pp))[1]

    def assemble(self, grouping: Grouping, orders: Orders, shapes: dict[str, ShapeChoice]) -> Candidate | None:
        """The candidate, or None when some task has no layout on its group's devices."""
        lays = {}
        for tasks, order in zip(grouping, orders, strict=False):
            if not order:
                return None
            for task in tasks:
                tp, pp = shapes[task]
                lay = self.layout(task, tuple(order), tp, pp)
                if lay is None:
                    return None
                lays[task] = lay
        return Candidate(grouping, tuple(tuple(sorted(o, key=_device_sort(self.planning))) for o in orders[:len(grouping)]),
                         lays)

    def default_shapes(self, grouping: Grouping, orders: Orders) -> dict[str, ShapeChoice] | None:
        """Each task's fastest shape on its group's devices by the balanced replica time."""
        out = {}
        for tasks, order in zip(grouping, orders, strict=False):
            for task in tasks:
                best = self.best_shape(task, tuple(order))
                if best is None:
                    return None
                out[task] = best
        return out


def _device_sort(planning: PlanningContext):
    devs = planning.devices
    return lambda d: (devs[d].region, devs[d].host, devs[d].index)


# ---- plain-data encoding (for Optuna user attributes and search traces; never pickles) ----------

def encode_candidate(candidate: Candidate) -> str:
    data = {"groups": [list(g) for g in candidate.groups],
            "group_devices": [list(g) for g in candidate.group_devices],
            "layouts": {t: {"tp": lay.tp, "pp": lay.pp, "replicas": [list(r) for r in lay.replicas],
                            "shares": list(lay.shares), "layer_splits": [list(s) for s in lay.layer_splits],
                            "sharding": lay.sharding, **_extra_degrees(lay)}
                        for t, lay in candidate.layouts},
            "offload": sorted(candidate.offload)}
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


# A stored candidate is read back from a study other processes (or people) share: it is someone
# else's data. Bounded before parsing; typed and checked against this cluster after.
MAX_CANDIDATE_CHARS = 1 << 20  # a 4,096-device candidate encodes to ~200 kB


def decode_candidate(text: object, devices: Collection[str] | None = None) -> Candidate:
    """The candidate `encode_candidate` wrote; ValueError for anything else a shared study may hold —
    oversized, deeply nested or non-finite data, wrong types, or (with `devices`) a device this
    cluster does not have, which a search must never be handed."""
    if not isinstance(text, str) or len(text) > MAX_CANDIDATE_CHARS:
        raise ValueError(f"a stored candidate is JSON text of at most {MAX_CANDIDATE_CHARS:,} characters")
    try:
        data = json.loads(text)
        check_plain(data, None)
    except RecursionError:
        raise ValueError("a stored candidate nested deeper than JSON data can be read") from None
    except SpecError as exc:
        raise ValueError(f"a stored candidate: {exc}") from None
    try:
        lays = {_text(t): _stored_layout(_text(t), v) for t, v in _mapping(data["layouts"]).items()}
        cand = Candidate([_texts(g) for g in _list(data["groups"])], [_texts(g) for g in _list(data["group_devices"])],
                         lays, [int(i) for i in _list(data.get("offload", []))])
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"a stored candidate of the wrong shape ({type(exc).__name__}: {exc})") from None
    unknown = sorted(set(cand.devices()) - set(devices)) if devices is not None else []
    if unknown:
        raise ValueError(f"a stored candidate names devices this cluster does not have: {', '.join(unknown[:3])}")
    return cand


def _extra_degrees(lay: TaskLayout) -> dict[str, int]:
    """A layout's sequence-split and expert degrees (Ulysses sp, context-parallel cp, expert-parallel
    ep) other than 1, and whole experts (etp 1) where set, as encoded."""
    out = {k: getattr(lay, k) for k in ("sp", "cp", "ep") if getattr(lay, k) != 1}
    return out | ({"etp": lay.etp} if lay.etp is not None else {})


def _stored_layout(task: str, v: object) -> TaskLayout:
    v = _mapping(v)
    return TaskLayout(task=task, tp=_count(v["tp"]), pp=_count(v["pp"]), replicas=[_texts(r) for r in _list(v["replicas"])],
                      shares=[float(s) for s in _list(v["shares"])],
                      layer_splits=[[_count(x) for x in _list(s)] for s in _list(v["layer_splits"])],
                      sharding=_text(v.get("sharding", "none")), sp=_count(v.get("sp", 1)), cp=_count(v.get("cp", 1)),
                      ep=_count(v.get("ep", 1)), etp=_count(v["etp"]) if "etp" in v else None)


def _mapping(v: object) -> dict:
    if not isinstance(v, dict):
        raise TypeError(f"expected an object, got {type(v).__name__}")
    return v


def _list(v: object) -> list:
    if not isinstance(v, list):
        raise TypeError(f"expected a list, got {type(v).__name__}")
    return v


def _text(v: object) -> str:
    if not isinstance(v, str):
        raise TypeError(f"expected text, got {type(v).__name__}")
    return v


def _texts(v: object) -> tuple[str, ...]:
    return tuple(_text(x) for x in _list(v))


def _count(v: object) -> int:
    if type(v) is not int or v < 1:
        raise TypeError(f"expected a positive integer, got {v!r}")
    return v


def problem_key(planning: PlanningContext, objective: str, budget: float | None) -> str:
    """A short hash naming one planning problem (cluster, workload, objective) for study names."""
    payload = json.dumps({"cluster": planning.cluster.to_dict(), "workload": planning.workload.to_dict(),
                          "objective": objective, "budget": budget}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]
