"""What a search proposes: task groups, their GPUs and every task's parallel layout
(hetprof.specs.TaskLayout, the one layout type the plan file holds and the executor maps to ranks).

Candidates are frozen and hashable so the simulator can memoise scores on them: a search
revisits the same candidates (and the same per-task layouts inside different candidates) many
thousands of times. They are plain structure with no scoring logic; the simulator judges them,
including structural mistakes, so a search can propose anything and read back why it failed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from hetprof.errors import SpecError
from hetprof.specs import FOLLOWS, Plan, TaskLayout


def even_layout(task: str, devices: Sequence[str], tp: int, pp: int, layers: int,
                shares: Sequence[float] | None = None, cp: int = 1, sp: int = 1,
                pipeline_outermost: bool = False) -> TaskLayout:
    """Replicas of consecutive tp*cp*pp devices (a stage: cp TP groups), equal batch shares (unless
    given), even layer splits; `sp` of them share each sequence (Ulysses). `pipeline_outermost` deals
    the devices in Megatron's rank order instead (tp-cp-ep-dp-pp: every replica's stage s on the s-th
    consecutive block of dp*tp*cp devices, so a stage's replicas are neighbours).

    The heterogeneity-unaware default (what verl does); balanced layouts come from the searches.
    """
    per = tp * pp * cp
    if per < 1 or len(devices) < per or len(devices) % per:
        raise ValueError(f"{task}: {len(devices)} devices do not form replicas of tp*pp*cp = {per}")
    if pp > layers:
        raise ValueError(f"{task}: pp = {pp} exceeds the model's {layers} layers")
    replicas = tuple(tuple(devices[i:i + per]) for i in range(0, len(devices), per))
    dp = len(replicas)
    split = even_split(layers, pp)
    layout = TaskLayout(task, tp, pp, replicas, tuple(shares) if shares is not None else (1.0 / dp,) * dp,
                        (split,) * dp, cp=cp, sp=sp)
    return megatron_order(layout) if pipeline_outermost else layout


def megatron_order(layout: TaskLayout) -> TaskLayout:
    """`layout` with its devices (taken replica by replica) dealt in Megatron's rank order instead
    (tp-cp-ep-dp-pp: the pipeline outermost, so stage s of every replica sits on the s-th block of
    dp × tp × cp consecutive devices and a stage's replicas are neighbours: its data- and
    expert-parallel groups stay on as few hosts as they can). The replicas must have one TP degree."""
    width = layout.tp * layout.cp
    if layout.tp_varies:
        raise ValueError(f"{layout.task}: Megatron's rank order needs one TP degree, got {layout.tp_degrees()}")
    blocks = [layout.replicas[r][s * width:(s + 1) * width] for r in range(layout.dp) for s in range(layout.pp)]
    return dataclasses.replace(layout, replicas=tuple(
        tuple(d for s in range(layout.pp) for d in blocks[s * layout.dp + r]) for r in range(layout.dp)))


def even_split(layers: int, parts: int) -> tuple[int, ...]:
    """`layers` split into `parts` contiguous stages differing by at most one layer."""
    base, extra = divmod(layers, parts)
    return tuple(base + (1 if i < extra else 0) for i in range(parts))


@dataclasses.dataclass(frozen=True)
class Candidate:
    """Task groups (which tasks time-share GPUs), each group's devices and each task's layout.

    `layouts` may be given as a mapping; it is stored as a sorted tuple of (task, layout) items so
    the candidate hashes and compares by value. `offload` holds the indices of groups whose tasks
    offload their state to host memory between phases by configuration (a hybrid engine's
    sleep/wake), even when everything would fit; other groups offload only when it does not.
    """

    groups: tuple[tuple[str, ...], ...]
    group_devices: tuple[tuple[str, ...], ...]
    layouts: tuple[tuple[str, TaskLayout], ...]
    offload: frozenset[int]

    def __init__(self, groups: Iterable[Iterable[str]], group_devices: Iterable[Iterable[str]],
                 layouts: Mapping[str, TaskLayout] | Iterable[tuple[str, TaskLayout]],
                 offload: Iterable[int] = ()) -> None:
        items = layouts.items() if isinstance(layouts, Mapping) else layouts
        object.__setattr__(self, "groups", tuple(tuple(g) for g in groups))
        object.__setattr__(self, "group_devices", tuple(tuple(d) for d in group_devices))
        object.__setattr__(self, "layouts", tuple(sorted(items, key=lambda kv: kv[0])))
        object.__setattr__(self, "offload", frozenset(offload))

    def layout(self, task: str) -> TaskLayout:
        for name, lay in self.layouts:
            if name == task:
                return lay
        raise KeyError(task)

    def layout_map(self) -> dict[str, TaskLayout]:
        return dict(self.layouts)

    def group_of(self, task: str) -> int:
        for i, tasks in enumerate(self.groups):
            if task in tasks:
                return i
        raise KeyError(task)

    def devices(self) -> tuple[str, ...]:
        return tuple(d for g in self.group_devices for d in g)

    def tasks(self) -> tuple[str, ...]:
        return tuple(t for g in self.groups for t in g)

    @classmethod
    def of_plan(cls, plan: Plan) -> Candidate:
        """The candidate a plan file describes (to re-score it, e.g. with another cost model or cluster).

        Its layouts are the plan's own; followers (the log-prob pass) are left out: the simulator
        places them beside their leaders.
        """
        plan.validate()
        led = [t for t in plan.tasks if t.task not in FOLLOWS]
        for ti, t in enumerate(plan.tasks):
            if t.task in [u.task for u in plan.tasks[:ti]]:
                raise SpecError(None, f"tasks[{ti}].task", "each task placed once", t.task)
        index = {g.name: i for i, g in enumerate(plan.groups)}
        groups = [tuple(t.task for t in led if index[t.group] == i) for i in range(len(plan.groups))]
        return cls(groups, [tuple(g.devices) for g in plan.groups], {t.task: t.layout for t in led},
                   [i for i, g in enumerate(plan.groups) if g.offload])

    def replace_layout(self, layout: TaskLayout) -> Candidate:
        return Candidate(self.groups, self.group_devices, {**self.layout_map(), layout.task: layout}, self.offload)
