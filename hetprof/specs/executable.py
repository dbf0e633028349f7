"""Which task layouts `hetprof run` carries out: one statement read by the executor and the planner.

The executor refuses a plan it cannot carry out rather than silently changing it; the planner (by
default, `hetprof plan --runnable`) plans only within the same limits, so its plans run as written.
Both read the rules here, so a layout the planner proposes is never one the executor refuses, and a
refusal names the same reason the planner would have given.
"""

from __future__ import annotations

from collections.abc import Sequence

from hetprof.specs.models import ModelShape
from hetprof.specs.vocabulary import Task, TaskKind

# Tasks that run no pipeline stages, and why.
UNPIPELINED = {
    Task.ACTOR_GEN: ("the hf backend decodes token by token on one model copy, and vLLM's own pipeline "
                  "parallelism is not wired to the weight sync"),
    Task.CRITIC_INFER: ("it receives the critic's weights every iteration, and only whole or TP-sharded "
                     "models take a weight sync"),
}


# Whether `hetprof run` streams rollouts: hands each finished group of a generation step to the next
# stage while the rest still decodes (StreamRL, AReaL). It does not: a stage's output moves once the
# whole stage is done. The planner prices streaming only where this says the run has it, so a plan
# for `hetprof run` is not priced for overlap its run never has.
STREAMS_ROLLOUTS = False
NO_STREAMING_WHY = "the executor hands a step's rollouts to the next stage once the whole generation step is done"


def priced_streaming(executable: bool) -> bool:
    """Whether a plan is priced with streaming by default: as `hetprof run` does for a runnable plan;
    a what-if (--any-layout) plans the overlap a streaming runtime would have."""
    return STREAMS_ROLLOUTS if executable else True


def streaming_problem(streaming: bool | None) -> str | None:
    """Why a plan priced with (`streaming` True) or without streaming runs other than priced (None: as priced;
    an older plan that does not record it is taken as priced for what it runs on)."""
    if streaming and not STREAMS_ROLLOUTS:
        return (f"the plan was priced with streaming generation, but {NO_STREAMING_WHY}: its prediction "
                "counts overlap this run will not have (replan without --streaming for a prediction that holds)")
    return None


def workload_problems(workload) -> list[str]:
    """What `hetprof run` does not carry out in a workload (`workload`: a WorkloadSpec); a plan made
    with --any-layout prices it as a what-if."""
    out = []
    if workload.generation.partial_rollout:
        out.append("generation.partial_rollout: `hetprof run` does not interrupt generation at a weight sync")
    if workload.training.sequence_parallel > 1:
        out.append(f"training.sequence_parallel {workload.training.sequence_parallel}: `hetprof run` does not "
                   f"split sequences over ranks")
    if workload.training.padded_dispatch:
        out.append("training.padded_dispatch: `hetprof run` hands passes their samples unpadded, in process")
    return out


def may_pipeline(task: str) -> bool:
    """Whether the executor runs `task` in pipeline stages."""
    return task not in UNPIPELINED


def tp_divides(model: ModelShape, tp: int) -> bool:
    """Whether torch's tensor-parallel plan can shard `model` `tp` ways (heads, KV heads, FFN)."""
    return not (model.heads % tp or model.kv_heads % tp or model.ffn % tp)


def layout_problems(task: str, kind: str, model: ModelShape, tp: int, pp: int,
                    layer_splits: Sequence[Sequence[int]] = (), layout: str = "", sharding: str = "none") -> list[str]:
    """Sentences saying why the executor would refuse this layout of `task` (empty: it runs it).

    `kind` is the task's kind (generation, inference, training); `layer_splits` each replica's
    layers per pipeline stage; `layout` how to name the layout in the sentences (e.g. DP2×TP1×PP2).
    Sharded data parallelism runs on whole-model replicas — FSDP2 `fully_shard` for zero2 (kept
    gathered between forward and backward) and fsdp, on GPUs and on the CPU (gloo) alike; zero1 has
    no runner (the planner never picks it: zero2 moves the same bytes and holds less); TP/PP
    replicas average gradients explicitly and shard nothing.
    """
    name = layout or f"TP{tp}×PP{pp}"
    out = []
    if sharding == "zero1":
        out.append(f"task {task} has layout {name} with zero1 sharding: this executor shards with FSDP2 "
                   f"(zero2, fsdp) and has no ZeRO-1 optimizer; zero2 moves the same bytes and holds less")
    elif sharding != "none" and (tp > 1 or pp > 1):
        out.append(f"task {task} has layout {name} with {sharding} sharding: this executor shards the state of "
                   f"whole-model replicas only (TP/PP replicas average their gradients explicitly)")
    if pp > 1 and not may_pipeline(task):
        out.append(f"task {task} has layout {name}: this executor runs no pipeline stages for {task} "
                   f"({UNPIPELINED[task]})")
    splits = {tuple(s) for s in layer_splits}
    if pp > 1 and kind == TaskKind.TRAINING and len(splits) > 1:
        out.append(f"task {task} has layout {name} with replicas that split the layers differently "
                   f"({sorted(splits)}): replicas average gradients stage by stage, so every replica's "
                   f"stage s must hold the same layers")
    if tp > 1 and not tp_divides(model, tp):
        out.append(f"task {task} has layout {name}: TP{tp} must divide the {model.name} model's attention "
                   f"heads ({model.heads}), KV heads ({model.kv_heads}) and FFN width ({model.ffn})")
    return out
