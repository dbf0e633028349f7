"""One task's parallel layout: the single type the planner proposes, the plan file holds and the
executor maps to ranks.

A layout is the task's data-parallel replicas on concrete devices — each replica's devices per
pipeline stage, its batch share and its layers per stage — with how a training task shards its state
over the replicas, and the degrees of the parallelisms still to come (expert, context and sequence
parallel; 1 = off). Replicas may sit on different GPU types: shares and splits are how a search
balances them to device speed; a generation task's replicas may even differ in TP (AReaL-Hex's
per-GPU-type rollout TP).

In a plan file a layout is written as its task entry's `layout` (the degrees) and `tasklets` (one
per replica and stage); `LayoutEntry` and `TaskletEntry` are that file form, and nothing else.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from hetprof.errors import SpecError
from hetprof.specs.loader import field, from_data, to_data
from hetprof.specs.vocabulary import Task, TaskKind

# Data-parallel sharding of a training task's state over its replicas: what each level shards.
SHARDING: dict[str, tuple[str, ...]] = {
    "none": (),                                   # DDP: every replica holds everything
    "zero1": ("optimizer",),
    "zero2": ("optimizer", "grads"),
    "fsdp": ("optimizer", "grads", "params"),     # ZeRO-3 / FSDP full shard
}

MAX_DEGREE = 1 << 16  # a parallel degree: loops over replicas and stages are sized by it
_DEGREE = f"a positive integer at most {MAX_DEGREE:,}"

# The degrees still to come, each 1 (off) unless set: expert parallel (experts of an MoE layer split
# over `ep` replicas), context parallel (each stage's sequences split over `cp` times its TP devices),
# sequence parallel (Ulysses: `sp` replicas share each sequence). Written to a plan only when not 1.
EXTRA_DEGREES = ("ep", "cp", "sp")
# Expert tensor parallelism of a Megatron-run MoE task (`etp`): absent (None), each routed expert is
# sliced over the TP ranks (Megatron's default, etp = tp); 1 keeps experts whole and folds the EP group
# over the TP ranks (Megatron's EP = ep × tp: MoE Parallel Folding, Liu et al., arXiv 2504.14960), as
# verl's and NeMo RL's MoE recipes run it. Generation has none: vLLM slices experts over TP.
WHOLE_EXPERTS = 1


def _degree(x: int) -> bool:
    return 0 < x <= MAX_DEGREE


@dataclasses.dataclass(frozen=True)
class TaskLayout:
    """One task's DP × TP × PP layout on concrete devices (frozen and hashable: searches memoise on it).

    `replicas[r]` lists replica r's devices stage-major (stage 0's, then stage 1's, ...): `pp`
    stages of `tp_of(r) * cp` devices each; `shares[r]` is its fraction of the batch;
    `layer_splits[r]` its layers per stage. `tp` is the largest replica's TP degree — every
    replica's, unless a generation task's replicas differ. `sharding` is how a training task shards
    its state over its replicas (SHARDING: none = DDP, zero1, zero2, fsdp); `etp` an MoE training or
    inference task's expert tensor parallelism (WHOLE_EXPERTS, or None: etp = tp). Construction checks
    nothing, so a search may propose anything and read back why it fails; `validate` says what is
    wrong, naming the field.
    """

    task: str
    tp: int
    pp: int
    replicas: tuple[tuple[str, ...], ...]
    shares: tuple[float, ...]
    layer_splits: tuple[tuple[int, ...], ...]
    sharding: str = "none"
    ep: int = 1
    cp: int = 1
    sp: int = 1
    etp: int | None = None

    def __post_init__(self) -> None:
        if self.etp is not None and self.etp == self.tp:  # one spelling of "as tp": the memo keys agree
            object.__setattr__(self, "etp", None)
        object.__setattr__(self, "replicas", tuple(tuple(r) for r in self.replicas))
        object.__setattr__(self, "shares", tuple(float(s) for s in self.shares))
        object.__setattr__(self, "layer_splits", tuple(tuple(int(x) for x in s) for s in self.layer_splits))

    # ---- derived ----------------------------------------------------------------------------
    @property
    def kind(self) -> str:
        """The task's kind (generation, inference, training), from the vocabulary."""
        return str(Task(self.task).kind)

    @property
    def role(self) -> str:
        """The model role the task runs (actor, critic, ...), from the vocabulary."""
        return str(Task(self.task).role)

    @property
    def dp(self) -> int:
        return len(self.replicas)

    @property
    def folded(self) -> bool:
        """Whether whole experts fold the EP group over the TP ranks (etp 1 at tp > 1)."""
        return self.etp == WHOLE_EXPERTS

    @property
    def expert_ranks(self) -> int:
        """Ranks each MoE layer's routed experts are spread over (Megatron's EP size): `ep`, × tp when
        folded; above 1, the layout has expert parallelism."""
        return self.ep * (self.tp if self.folded else 1)

    def devices(self) -> tuple[str, ...]:
        """Every device of the layout, replica by replica, stage-major."""
        return tuple(d for r in self.replicas for d in r)

    @property
    def world(self) -> int:
        """Ranks the layout runs on (one per device)."""
        return sum(len(r) for r in self.replicas)

    def tp_of(self, replica: int) -> int:
        """Replica `replica`'s TP degree: its devices per pipeline stage over the context-parallel degree."""
        return len(self.replicas[replica]) // (self.pp * self.cp)

    def tp_degrees(self) -> tuple[int, ...]:
        """Each replica's TP degree (all equal to `tp` unless a generation task's replicas differ)."""
        return tuple(self.tp_of(r) for r in range(self.dp))

    @property
    def tp_varies(self) -> bool:
        """Whether the replicas differ in TP (the plan file then lists each one's: `replica_tp`)."""
        return len(set(self.tp_degrees())) > 1

    def stage_devices(self, replica: int, stage: int) -> tuple[str, ...]:
        width = len(self.replicas[replica]) // self.pp
        return self.replicas[replica][stage * width:(stage + 1) * width]

    def layer_range(self, replica: int, stage: int) -> tuple[int, int]:
        """[start, end) of the layers replica `replica`'s stage `stage` holds."""
        split = self.layer_splits[replica]
        start = sum(split[:stage])
        return start, start + split[stage]

    def describe(self) -> str:
        """'DP2×TP2×PP1', 'DP3(2×TP1+1×TP2)×PP1 fsdp', '… EP2', '… EP2 ETP1' (layout_name)."""
        return layout_name(self.tp_degrees(), self.pp, self.sharding,
                           {k: getattr(self, k) for k in EXTRA_DEGREES}) + (" ETP1" if self.folded else "")

    def __str__(self) -> str:
        return self.describe()

    # ---- checks -----------------------------------------------------------------------------
    def validate(self) -> None:
        """Raise SpecError naming the first field that is wrong on its own (what needs the model's
        layers, the group's devices or the task's kind is checked by the plan that holds it)."""
        for name in ("tp", "pp", *EXTRA_DEGREES):
            if not _degree(getattr(self, name)):
                raise SpecError(None, name, _DEGREE, getattr(self, name))
        if self.sharding not in SHARDING:
            raise SpecError(None, "sharding", "one of " + ", ".join(SHARDING), self.sharding)
        if not self.replicas:
            raise SpecError(None, "replicas", "at least one replica", 0)
        per = self.pp * self.cp
        for r, devs in enumerate(self.replicas):
            if not devs or len(devs) % per or not 1 <= len(devs) // per <= self.tp:
                raise SpecError(None, f"replicas[{r}]", f"pp × cp × its TP degree devices (a TP degree of 1 to "
                                f"tp = {self.tp}, pp = {self.pp}, cp = {self.cp})", len(devs))
        if max(self.tp_degrees()) != self.tp:
            raise SpecError(None, "tp", f"the largest replica's TP degree ({max(self.tp_degrees())})", self.tp)
        if len(self.shares) != self.dp or any(not 0 <= s <= 1 for s in self.shares):
            raise SpecError(None, "shares", f"one fraction in [0, 1] per replica (dp = {self.dp})", list(self.shares))
        if not math.isclose(sum(self.shares), 1.0, abs_tol=1e-6):
            raise SpecError(None, "shares", "batch shares over replicas summing to 1", round(sum(self.shares), 6))
        if len(self.layer_splits) != self.dp:
            raise SpecError(None, "layer_splits", f"one split per replica (dp = {self.dp})", len(self.layer_splits))
        for r, split in enumerate(self.layer_splits):
            if len(split) != self.pp or any(x < 1 for x in split):
                raise SpecError(None, f"layer_splits[{r}]", f"{self.pp} positive layer counts (one per stage)",
                                list(split))
        for name in ("ep", "sp"):  # both are carved out of the data-parallel replicas
            if self.dp % getattr(self, name):
                raise SpecError(None, name, f"a divisor of dp = {self.dp}", getattr(self, name))
        if self.etp is not None and (self.etp != WHOLE_EXPERTS or self.kind == TaskKind.GENERATION):
            expect = ("absent for a generation task (vLLM slices experts over its TP ranks)"
                      if self.kind == TaskKind.GENERATION else f"1 (whole experts) or absent (= tp = {self.tp})")
            raise SpecError(None, "etp", expect, self.etp)

    # ---- the plan file's form -----------------------------------------------------------------
    def to_entries(self) -> tuple[LayoutEntry, list[TaskletEntry]]:
        """The plan file's `layout` and `tasklets` of this task (replica by replica, stage by stage)."""
        degrees = self.tp_degrees()
        extra = {k: (None if getattr(self, k) == 1 else getattr(self, k)) for k in EXTRA_DEGREES}
        entry = LayoutEntry(dp=self.dp, tp=self.tp, pp=self.pp, sharding=self.sharding,
                            replica_tp=list(degrees) if self.tp_varies else None, etp=self.etp, **extra)
        tasklets = []
        for r in range(self.dp):
            for s in range(self.pp):
                start, end = self.layer_range(r, s)
                tasklets.append(TaskletEntry(replica=r, stage=s, devices=list(self.stage_devices(r, s)),
                                             layer_start=start, layer_end=end, batch_share=self.shares[r]))
        return entry, tasklets

    @classmethod
    def from_entries(cls, task: str, entry: LayoutEntry, tasklets: Sequence[TaskletEntry]) -> TaskLayout:
        """The layout a plan file's task entry describes; SpecError names the entry's field
        (`layout.…`, `tasklets[i]…`) when the tasklets do not form dp replicas of pp stages."""
        dp, pp = entry.dp, entry.pp
        if len(tasklets) != dp * pp:
            raise SpecError(None, "tasklets", f"dp × pp = {dp * pp} tasklets", len(tasklets))
        at: dict[tuple[int, int], int] = {}
        for i, k in enumerate(tasklets):
            if not 0 <= k.replica < dp:
                raise SpecError(None, f"tasklets[{i}].replica", f"a replica index below dp = {dp}", k.replica)
            if not 0 <= k.stage < pp:
                raise SpecError(None, f"tasklets[{i}].stage", f"a stage index below pp = {pp}", k.stage)
            if (k.replica, k.stage) in at:
                raise SpecError(None, f"tasklets[{i}]", f"one tasklet per replica and stage (replica {k.replica} "
                                f"stage {k.stage} is also tasklets[{at[k.replica, k.stage]}])", None)
            at[k.replica, k.stage] = i
            tp = entry.tp_of(k.replica)
            if len(k.devices) != tp * entry.cp_degree:
                what = f"replica_tp[{k.replica}]" if entry.replica_tp else "tp"
                cp = f" × cp = {entry.cp_degree}" if entry.cp_degree != 1 else ""
                raise SpecError(None, f"tasklets[{i}].devices", f"{what} = {tp}{cp} devices", len(k.devices))
        replicas, shares, splits = [], [], []
        for r in range(dp):
            stages = [tasklets[at[r, s]] for s in range(pp)]
            bounds = [(k.layer_start, k.layer_end) for k in stages]
            if bounds[0][0] != 0 or any(a >= b for a, b in bounds) or any(
                    a[1] != b[0] for a, b in zip(bounds, bounds[1:], strict=False)):
                raise SpecError(None, "tasklets", f"stages of replica {r} holding layers contiguously from 0", bounds)
            for s, k in enumerate(stages[1:], 1):
                if k.batch_share != stages[0].batch_share:
                    raise SpecError(None, f"tasklets[{at[r, s]}].batch_share", f"replica {r}'s share on every "
                                    f"stage ({stages[0].batch_share})", k.batch_share)
            replicas.append(tuple(d for k in stages for d in k.devices))
            shares.append(stages[0].batch_share)
            splits.append(tuple(b - a for a, b in bounds))
        if not math.isclose(sum(shares), 1.0, abs_tol=1e-6):
            raise SpecError(None, "tasklets", "batch shares over replicas summing to 1", round(sum(shares), 6))
        layout = cls(task, entry.tp, pp, tuple(replicas), tuple(shares), tuple(splits), entry.sharding,
                     etp=entry.etp, **{k: getattr(entry, k) or 1 for k in EXTRA_DEGREES})
        try:
            layout.validate()
        except SpecError as exc:  # what the entry's own checks leave: the degrees' rules
            raise SpecError(None, entry_field(exc.field), exc.expected, exc.got) from None
        return layout

    def to_dict(self) -> dict:
        """{"layout": …, "tasklets": […]}: this layout as a plan file's task entry writes it."""
        entry, tasklets = self.to_entries()
        return {"layout": to_data(entry), "tasklets": to_data(tasklets)}

    @classmethod
    def from_dict(cls, task: str, data: dict, file: str | None = None) -> TaskLayout:
        """The layout of a task entry's {"layout": …, "tasklets": […]} (as to_dict writes it)."""
        entry = from_data(LayoutEntry, data.get("layout", {}), file, "layout")
        tasklets = from_data(list[TaskletEntry], data.get("tasklets", []), file, "tasklets")
        try:
            return cls.from_entries(task, entry, tasklets)
        except SpecError as exc:
            raise SpecError(file, exc.field, exc.expected, exc.got) from None


def entry_field(name: str) -> str:
    """Where a TaskLayout field stands in a plan file's task entry: a degree in `layout`, the rest
    (replicas' devices, shares, layer splits) in `tasklets`."""
    return f"layout.{name}" if name in LayoutEntry.FIELDS else "tasklets"


def layout_name(degrees: Sequence[int], pp: int, sharding: str = "none", extra: dict[str, int] | None = None) -> str:
    """'DP2×TP2×PP1'; replicas of different TP are counted per degree: 'DP3(2×TP1+1×TP2)×PP1';
    sharding and any extra degree other than 1 follow: 'DP4×TP1×PP1 fsdp', 'DP4×TP1×PP1 EP2'."""
    shard = "" if sharding == "none" else f" {sharding}"
    more = "".join(f" {k.upper()}{v}" for k, v in (extra or {}).items() if v != 1)
    counts = {tp: list(degrees).count(tp) for tp in dict.fromkeys(degrees)}
    if len(counts) == 1:
        return f"DP{len(degrees)}×TP{degrees[0]}×PP{pp}{shard}{more}"
    mix = "+".join(f"{n}×TP{tp}" for tp, n in counts.items())
    return f"DP{len(degrees)}({mix})×PP{pp}{shard}{more}"


# ---- the plan file's form of a layout ----------------------------------------------------------

@dataclasses.dataclass
class LayoutEntry:
    """A plan file task entry's `layout`: the degrees (the devices are in its `tasklets`)."""

    FIELDS = ("dp", "tp", "pp", "sharding", "replica_tp", *EXTRA_DEGREES, "etp")

    dp: int = field(1, help="data-parallel replicas", check=_degree, expect=_DEGREE)
    tp: int = field(1, help="tensor-parallel degree", check=_degree, expect=_DEGREE)
    pp: int = field(1, help="pipeline stages", check=_degree, expect=_DEGREE)
    sharding: str = field("none", help="data-parallel sharding of training state: none (DDP), zero1, zero2, "
                          "fsdp (ZeRO-3)", check=lambda s: s in SHARDING, expect="one of " + ", ".join(SHARDING))
    replica_tp: list[int] | None = field(None, help="a generation task's TP degree per replica when its replicas "
                                         "differ (then tp is the largest); absent: every replica has tp",
                                         check=lambda v: all(_degree(x) for x in v), expect=f"a list of {_DEGREE}s")
    ep: int | None = field(None, help="expert-parallel degree (absent: 1)", check=_degree, expect=_DEGREE)
    cp: int | None = field(None, help="context-parallel degree: a stage holds tp × cp devices (absent: 1)",
                           check=_degree, expect=_DEGREE)
    sp: int | None = field(None, help="sequence-parallel (Ulysses) degree (absent: 1)", check=_degree, expect=_DEGREE)
    etp: int | None = field(None, help="expert tensor-parallel degree of an MoE training or inference task: 1 keeps "
                            "routed experts whole and folds the EP group over the TP ranks (Megatron's EP = ep × tp); "
                            "absent: tp, each expert sliced over them", check=_degree, expect=_DEGREE)

    @property
    def cp_degree(self) -> int:
        return self.cp or 1

    def tp_of(self, replica: int) -> int:
        """Replica `replica`'s TP degree: its own where the replicas differ, else the common `tp`."""
        return self.replica_tp[replica] if self.replica_tp else self.tp

    def validate(self) -> None:
        if self.replica_tp is None:
            return
        if len(self.replica_tp) != self.dp:
            raise SpecError(None, "replica_tp", f"one TP degree per replica (dp = {self.dp})", len(self.replica_tp))
        if max(self.replica_tp) != self.tp:
            raise SpecError(None, "tp", f"the largest of replica_tp ({max(self.replica_tp)})", self.tp)


@dataclasses.dataclass
class TaskletEntry:
    """One (replica, stage) of a task in a plan file: its devices holding layers [layer_start, layer_end)."""

    replica: int = field(help="data-parallel replica index")
    stage: int = field(help="pipeline stage index")
    devices: list[str] = field(help="device ids 'host:index', one per TP rank (times cp)")
    layer_start: int = field(0, help="first layer held (inclusive)")
    layer_end: int = field(0, help="last layer held (exclusive)")
    batch_share: float = field(1.0, help="fraction of the task's batch this replica processes",
                               check=lambda x: 0 <= x <= 1, expect="a fraction in [0, 1]")
