"""What a search proposes: task groups, their GPUs and every task's parallel layout.

Candidates are frozen and hashable so the simulator can memoise scores on them: a search
revisits the same candidates (and the same per-task layouts inside different candidates) many
thousands of times. They are plain structure with no scoring logic; the simulator judges them,
including structural mistakes, so a search can propose anything and read back why it failed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from hetprof.specs.plan import layout_name


@dataclasses.dataclass(frozen=True)
class TaskLayout:
    """One task's DP × TP × PP layout on concrete devices.

    `replicas[r]` lists replica r's tp*pp device ids stage-major (stage 0's tp devices, then
    stage 1's, ...); `shares[r]` is its fraction of the batch; `layer_splits[r]` its layers per
    stage. Replicas may sit on different GPU types: shares and splits are how a search balances
    them to device speed. `sharding` is how a training task shards its state over its replicas
    (none = DDP, zero1, zero2, fsdp; hetprof.specs.plan.SHARDING). A generation task's replicas may
    differ in TP (AReaL-Hex's per-GPU-type rollout TP): replica r then holds replica_tp(r)*pp
    devices and `tp` is the largest degree; every other task's replicas all have `tp`.
    """

    task: str
    tp: int
    pp: int
    replicas: tuple[tuple[str, ...], ...]
    shares: tuple[float, ...]
    layer_splits: tuple[tuple[int, ...], ...]
    sharding: str = "none"

    def __post_init__(self) -> None:
        object.__setattr__(self, "replicas", tuple(tuple(r) for r in self.replicas))
        object.__setattr__(self, "shares", tuple(float(s) for s in self.shares))
        object.__setattr__(self, "layer_splits", tuple(tuple(int(x) for x in s) for s in self.layer_splits))

    @property
    def dp(self) -> int:
        return len(self.replicas)

    def devices(self) -> tuple[str, ...]:
        return tuple(d for r in self.replicas for d in r)

    def replica_tp(self, replica: int) -> int:
        """Replica `replica`'s TP degree: its devices per pipeline stage."""
        return len(self.replicas[replica]) // self.pp

    def tp_degrees(self) -> tuple[int, ...]:
        """Each replica's TP degree (all equal to `tp` unless a generation task's replicas differ)."""
        return tuple(len(r) // self.pp for r in self.replicas)

    def stage_devices(self, replica: int, stage: int) -> tuple[str, ...]:
        tp = self.replica_tp(replica)
        return self.replicas[replica][stage * tp:(stage + 1) * tp]

    def describe(self) -> str:
        return layout_name(self.tp_degrees(), self.pp, self.sharding)

    @classmethod
    def even(cls, task: str, devices: Sequence[str], tp: int, pp: int, layers: int,
             shares: Sequence[float] | None = None) -> TaskLayout:
        """Replicas of consecutive tp*pp devices, equal batch shares (unless given), even layer splits.

        The heterogeneity-unaware default (what verl does); balanced layouts come from the searches.
        """
        per = tp * pp
        if per < 1 or len(devices) < per or len(devices) % per:
            raise ValueError(f"{task}: {len(devices)} devices do not form replicas of tp*pp = {per}")
        if pp > layers:
            raise ValueError(f"{task}: pp = {pp} exceeds the model's {layers} layers")
        replicas = tuple(tuple(devices[i:i + per]) for i in range(0, len(devices), per))
        dp = len(replicas)
        split = even_split(layers, pp)
        return cls(task, tp, pp, replicas, tuple(shares) if shares is not None else (1.0 / dp,) * dp,
                   (split,) * dp)


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

    def replace_layout(self, layout: TaskLayout) -> Candidate:
        return Candidate(self.groups, self.group_devices, {**self.layout_map(), layout.task: layout}, self.offload)
