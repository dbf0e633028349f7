"""What each training framework can express of a plan: one statement read by the exporter and the planner.

`hetprof export --to T` refuses a plan that framework T cannot run as written, and `hetprof plan
--target T` plans only within the same limits, so an exported plan is never refused and a refusal
names the same feature the planner steered around. A rule looks at an `Arrangement` (pools of
devices, the tasks on each and their layouts) and says, in sentences, what breaks it; the limits
come from the frameworks' own sources (verl 0.9: `ResourcePoolManager`, ppo_trainer.yaml, the
fully-async recipe; AReaL 1.0: `areal.api.alloc_mode`).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Iterable, Mapping

from hetprof.specs.layout import TaskLayout
from hetprof.specs.plan import TASKS
from hetprof.specs.vocabulary import Task

SHARE_TOLERANCE = 1e-6  # batch shares this close count as equal (they are written as floats)


@dataclasses.dataclass(frozen=True)
class Pool:
    """A set of devices and the tasks that time-share it (a plan's group)."""

    name: str
    tasks: tuple[str, ...]
    devices: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Arrangement:
    """What the rules read: the pools, each task's layout and kind, and each device's GPU type and host."""

    pools: tuple[Pool, ...]
    layouts: Mapping[str, TaskLayout]
    kinds: Mapping[str, str]
    gpu_type: Mapping[str, str]
    host: Mapping[str, str]
    mode: str = "sync"  # the workload's: sync, or async with staleness
    backend: str = "vllm"  # the generation engine the plan was priced for
    sequences: int = 0  # sequences per step: an even split of them differs by one sequence where it does not divide
    experts: frozenset[str] = frozenset()  # the tasks whose model has routed experts (an MoE model)

    def pool_of(self, task: str) -> Pool:
        return next(p for p in self.pools if task in p.tasks)


@dataclasses.dataclass(frozen=True)
class Rule:
    """One limit of a framework: `feature` names what it cannot express, `check` lists where a plan needs it."""

    name: str
    feature: str
    check: Callable[[Arrangement], list[str]]


def even_split(layers: int, pp: int) -> tuple[int, ...] | None:
    """Megatron's split of `layers` over `pp` stages (None: it needs layers divisible by pp)."""
    return None if layers % pp else (layers // pp,) * pp


# ---- the checks -------------------------------------------------------------------------------

def _uneven_shares(arr: Arrangement) -> list[str]:
    # the frameworks split a batch as evenly as whole sequences allow: shares may differ by one sequence
    slack = SHARE_TOLERANCE + (1 / arr.sequences if arr.sequences else 0.0)
    return [f"{t} shares {min(lay.shares):.4g}–{max(lay.shares):.4g}" for t, lay in arr.layouts.items()
            if max(lay.shares) - min(lay.shares) > slack]


def _replica_tp(arr: Arrangement) -> list[str]:
    return [f"{t} {lay.describe()}" for t, lay in arr.layouts.items() if lay.tp_varies]


def _uneven_layers(arr: Arrangement) -> list[str]:
    out = []
    for t, lay in arr.layouts.items():
        if lay.pp > 1 and any(split != even_split(sum(split), lay.pp) for split in lay.layer_splits):
            out.append(f"{t} layer splits {sorted(set(lay.layer_splits))}")
    return out


def _uneven_nodes(arr: Arrangement) -> list[str]:
    out = []
    for p in arr.pools:
        per = Counter(arr.host[d] for d in p.devices)
        if len(set(per.values())) > 1:
            out.append(f"pool {p.name} has {dict(per)} GPUs per node")
    return out


def _part_of_pool(arr: Arrangement) -> list[str]:
    # A role's worker group spans its whole pool: verl derives rollout replicas and the trainer's DP
    # from the pool's GPUs, AReaL from its allocation's d×p×t.
    out = []
    for p in arr.pools:
        for t in p.tasks:
            used = len(set(arr.layouts[t].devices()))
            if used != len(p.devices):
                out.append(f"{t} on {used} of pool {p.name}'s {len(p.devices)} GPUs")
    return out


def _sharded_model_parallel(arr: Arrangement) -> list[str]:
    # Megatron's distributed optimizer shards optimizer state only (zero1); FSDP runs TP1 PP1 replicas.
    return [f"{t} {lay.describe()}" for t, lay in arr.layouts.items()
            if lay.sharding in ("zero2", "fsdp") and (lay.tp > 1 or lay.pp > 1)]


def _experts_on_fsdp(arr: Arrangement) -> list[str]:
    # Both frameworks' FSDP engines run no expert parallelism; their Megatron engine shards zero1 only.
    return [f"{t} {lay.describe()}" for t, lay in arr.layouts.items()
            if t in arr.experts and lay.ep > 1 and lay.sharding in ("zero2", "fsdp")]


def _sliced_experts(arr: Arrangement) -> list[str]:
    # AReaL's allocation names a Megatron trainer by its common dimensions (dXpYtZeE), which keep
    # experts whole (ParallelStrategy.expert_tensor_parallel_size 1); only its unnamed attn|ffn form slices them.
    return [f"{t} {lay.describe()} (experts sliced over TP{lay.tp})" for t in (Task.ACTOR_TRAIN, Task.CRITIC_TRAIN)
            if t in arr.experts and (lay := arr.layouts.get(t)) is not None and lay.tp > 1 and not lay.folded]


def _sequence_parallel_megatron(arr: Arrangement) -> list[str]:
    # Ulysses SP is an FSDP option; Megatron has its own context parallelism instead.
    return [f"{t} {lay.describe()}" for t, lay in arr.layouts.items() if lay.sp > 1 and (lay.tp > 1 or lay.pp > 1)]


_TRAINER_SIDE = (Task.ACTOR_TRAIN, Task.ACTOR_LOGPROB, Task.REF_INFER, Task.CRITIC_INFER, Task.CRITIC_TRAIN)


def _verl_role_pools(arr: Arrangement) -> list[str]:
    # verl's config maps actor, reference and critic to one global pool; only the rollout (standalone
    # or fully-async) and a reward model (reward.reward_model.enable_resource_pool) get pools of their own.
    pools = {arr.pool_of(t).name for t in _TRAINER_SIDE if t in arr.kinds}
    return [f"trainer-side tasks spread over pools {sorted(pools)}"] if len(pools) > 1 else []


def _verl_rollout_pool(arr: Arrangement) -> list[str]:
    gen, train = arr.pool_of(Task.ACTOR_GEN), arr.pool_of(Task.ACTOR_TRAIN)
    if gen.name == train.name:
        return []
    out = [f"rollout shares pool {gen.name} with {[t for t in gen.tasks if t != Task.ACTOR_GEN]}"] \
        if len(gen.tasks) > 1 else []
    if arr.mode != "async":
        out.append(f"rollout on pool {gen.name}, apart from the actor, in a synchronous workload")
    return out


def _areal_decoupled(arr: Arrangement) -> list[str]:
    gen = arr.pool_of(Task.ACTOR_GEN)
    return [f"rollout shares pool {gen.name} with {[t for t in gen.tasks if t != Task.ACTOR_GEN]}"] \
        if len(gen.tasks) > 1 else []


def _areal_followers(arr: Arrangement) -> list[str]:
    # AReaL runs the reference and reward passes on the actor's allocation (one `fsdp[a]`/`megatron[a]` term).
    train = arr.layouts[Task.ACTOR_TRAIN]
    out = []
    for t in (Task.REF_INFER, Task.REWARD_INFER):
        lay = arr.layouts.get(t)
        if lay is not None and (arr.pool_of(t).name != arr.pool_of(Task.ACTOR_TRAIN).name
                                or lay.replicas != train.replicas or (lay.tp, lay.pp) != (train.tp, train.pp)):
            out.append(f"{t} {lay.describe()} on pool {arr.pool_of(t).name}")
    return out


ENGINES = ("vllm",)  # hetprof's generation backends both frameworks run (they also run SGLang, which hetprof does not price)


def _engine(arr: Arrangement) -> list[str]:
    return [] if arr.backend in ENGINES else [f"backend {arr.backend}"]


COMMON = (
    Rule("engine", f"generation engines other than {', '.join(ENGINES)}", _engine),
    Rule("even-shares", "per-replica batch shares", _uneven_shares),
    Rule("one-tp-per-role", "per-replica TP degrees", _replica_tp),
    Rule("even-layers", "uneven pipeline layer splits", _uneven_layers),
    Rule("whole-nodes", "pools with unequal GPUs per node (a pool is nnodes × n_gpus_per_node)", _uneven_nodes),
    Rule("whole-pool", "tasks on part of their pool", _part_of_pool),
    Rule("sharding", "zero2/fsdp-sharded TP or PP layouts (Megatron shards optimizer state only)",
         _sharded_model_parallel),
    Rule("ulysses", "Ulysses-sequence-parallel TP or PP layouts", _sequence_parallel_megatron),
    Rule("fsdp-experts", "expert-parallel layouts with zero2/fsdp sharding (FSDP engines split no experts)",
         _experts_on_fsdp),
)

RULES: dict[str, tuple[Rule, ...]] = {
    "verl": COMMON + (
        Rule("trainer-pool", "separate pools for actor, reference and critic", _verl_role_pools),
        Rule("rollout-pool", "rollout pools apart from the actor, unless fully async and alone", _verl_rollout_pool),
    ),
    "areal": COMMON + (
        Rule("decoupled", "rollouts sharing their GPUs with other tasks", _areal_decoupled),
        Rule("actor-allocation", "reference or reward passes off the actor's allocation", _areal_followers),
        Rule("whole-experts", "MoE trainers with experts sliced over TP (a named allocation keeps them whole: "
             "etp 1)", _sliced_experts),
    ),
}


def problems(target: str, arr: Arrangement) -> list[tuple[Rule, list[str]]]:
    """Each rule of `target` the arrangement breaks, with where (empty: the target can run it)."""
    out = []
    for rule in RULES[target]:
        where = rule.check(arr)
        if where:
            out.append((rule, where))
    return out


def refusal(target: str, rule: Rule, where: list[str]) -> str:
    """The one line a refusal prints."""
    return f"{target}: {rule.feature} are not expressible ({'; '.join(where)}); re-plan with --target {target}"


def arrangement(groups, layouts: Mapping[str, TaskLayout], devices, mode: str, backend: str,
                sequences: int = 0, experts: Iterable[str] = ()) -> Arrangement:
    """The arrangement of `groups` (name, tasks, devices triples) on `devices` (the cluster's Device list);
    `experts` the tasks whose model is an MoE model."""
    return Arrangement(pools=tuple(Pool(n, tuple(ts), tuple(ds)) for n, ts, ds in groups), layouts=dict(layouts),
                       kinds={t: TASKS[t][0] for t in layouts}, gpu_type={d.id: d.type for d in devices},
                       host={d.id: d.host for d in devices}, mode=mode, backend=backend,
                       sequences=sequences, experts=frozenset(experts))


def plan_arrangement(plan) -> Arrangement:
    """The arrangement a Plan describes."""
    w = plan.workload_spec()
    roles = w.roles()
    return arrangement([(g.name, g.tasks, g.devices) for g in plan.groups], {t.task: t.layout for t in plan.tasks},
                       plan.cluster_spec().devices(), w.mode, plan.backend, w.sequences_per_step,
                       [t.task for t in plan.tasks if roles[t.role].moe is not None])
