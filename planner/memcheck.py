"""An independent memory check of a plan file: does every device hold what the plan puts on it?

It reads only the plan (its cluster, workload and layouts) and the cost models' memory formulas
(`hetprof.costmodels.memory`), never the simulator, so a bug in the simulator's bookkeeping cannot
hide itself. The rule it applies is the one a colocated RL worker lives by: tasks sharing a device
may all stay resident if their states plus the largest working set fit; otherwise they offload
between phases and each must fit alone. Generation must have room for at least one sequence's KV.
A training task's state is sharded as its layout says; the log-prob pass (a follower) reads its
trainer's weights, so beside it on a device it adds only its working set.
"""

from __future__ import annotations

from hetprof.costmodels import memory as mem
from hetprof.specs import FOLLOWS, TASKS, Plan
from hetprof.specs.vocabulary import TaskKind

GB = 1e9


def device_demands(plan: Plan) -> tuple[dict[str, list[tuple[str, float, float]]], list[str]]:
    """Per device: (task, total bytes, offloadable bytes) of each tasklet on it, and KV-room problems."""
    cluster, workload = plan.cluster_spec(), plan.workload_spec()
    types = {d.id: d.type for d in cluster.devices()}
    roles = workload.roles()
    seq_len = max(1, round(workload.prompt_len.mean + workload.response_len.mean))
    n = workload.sequences_per_step
    demands: dict[str, list[tuple[str, float, float]]] = {}
    problems: list[str] = []
    sharded = {p.task: (p.layout.dp, p.layout.sharding) for p in plan.tasks}
    for placement in plan.tasks:
        kind, role = TASKS[placement.task]
        # a follower runs on its leader's model: sharded as its leader shards it
        dp, sharding = sharded.get(FOLLOWS.get(placement.task), (placement.layout.dp, placement.layout.sharding))
        dp = min(dp, workload.training.shard_group or dp)  # HSDP: each shard group holds a whole copy
        model = roles[role]
        lay = placement.layout
        dtype = workload.dtype_of(kind)
        for r, s in ((r, s) for r in range(lay.dp) for s in range(lay.pp)):
            tp = lay.tp_of(r)  # a generation task's replicas may differ in TP
            layers = lay.layer_splits[r][s]
            batch = max(1, round(lay.shares[r] * n))
            for d in lay.stage_devices(r, s):
                capacity = cluster.catalog.lookup(types[d]).memory_bytes
                concurrent = batch
                if kind == TaskKind.GENERATION:
                    room = mem.max_concurrent_sequences(model, layers, tp, seq_len, dtype, capacity,
                                                        workload.generation.gpu_memory_utilization)
                    if room < 1:
                        problems.append(f"{d} ({types[d]}): {placement.task} has no room for even one "
                                        f"sequence's KV cache next to {layers} layers of {model.name} at TP{tp}")
                    concurrent = min(batch, max(room, 1))
                est = _estimate(workload, kind, model, layers, tp, batch, seq_len, dtype, concurrent, dp, sharding,
                                lay.sp if lay.sp > 1 else workload.training.sequence_parallel or 1, lay.cp, capacity)
                demands.setdefault(d, []).append((placement.task, est.total, est.weights + est.grads + est.optimizer))
    return demands, problems


def _estimate(workload, kind: str, model, layers: int, tp: int, batch: int, seq_len: int, dtype: str,
              concurrent: int, dp: int, sharding: str, sp: int, cp: int, capacity: float) -> mem.MemoryEstimate:
    """One device's bytes of a tasklet; padded micro-batches as large as fit the device (the planner's
    own choice, `memory.fitting_micro_tokens`), unless the workload packs by its own token budget."""
    training = workload.training
    budget = training.max_tokens_per_microbatch if kind != TaskKind.GENERATION else None

    def at(micro: int | None) -> mem.MemoryEstimate:
        return mem.task_memory(kind, model, layers, tp, batch, seq_len, dtype, training.recompute,
                               concurrent, dp, sharding, budget, sp, cp=cp, micro_tokens=micro,
                               offload=training.activation_offload,
                               optimizer_offload=training.optimizer_offload)

    if budget is not None or kind == TaskKind.GENERATION:
        return at(None)
    return mem.fitting_micro_tokens(at, capacity, seq_len, sp * cp)[1]


def device_peaks(plan: Plan) -> dict[str, float]:
    """Peak bytes per device under the resident-or-offload rule."""
    demands, _ = device_demands(plan)
    cluster = plan.cluster_spec()
    types = {d.id: d.type for d in cluster.devices()}
    return {d: _peak(items, cluster.catalog.lookup(types[d]).memory_bytes) for d, items in demands.items()}


def check_plan(plan: Plan) -> list[str]:
    """Every memory violation of a plan, as sentences (empty: every device holds its tasks)."""
    demands, problems = device_demands(plan)
    cluster = plan.cluster_spec()
    types = {d.id: d.type for d in cluster.devices()}
    for d, items in sorted(demands.items()):
        capacity = cluster.catalog.lookup(types[d]).memory_bytes
        peak = _peak(items, capacity)
        if peak > capacity:
            worst = max(items, key=lambda x: x[1])
            problems.append(f"{d} ({types[d]}, {capacity / GB:.0f} GB) needs {peak / GB:.1f} GB at its peak "
                            f"({worst[0]} alone needs {worst[1] / GB:.1f} GB; tasks on it: "
                            f"{', '.join(t for t, _, _ in items)})")
    return problems


def _peak(items: list[tuple[str, float, float]], capacity: float) -> float:
    if len(items) == 1:
        return items[0][1]
    here = {t for t, _, _ in items}
    resident = (sum(off for t, _, off in items if FOLLOWS.get(t) not in here)
                + max(total - off for _, total, off in items))
    return resident if resident <= capacity else max(total for _, total, _ in items)
