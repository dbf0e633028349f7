"""Which task layouts `hetprof run` carries out: one statement read by the executor and the planner.

The executor refuses a plan it cannot carry out rather than silently changing it; the planner (by
default, `hetprof plan --runnable`) plans only within the same limits, so its plans run as written.
Both read the rules here, so a layout the planner proposes is never one the executor refuses, and a
refusal names the same reason the planner would have given.
"""

from __future__ import annotations

from collections.abc import Sequence

from hetprof.specs.models import ModelShape
from hetprof.specs.precision import FP8, TaskPrecision, precision_of
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
    sp = workload.training.sequence_parallel or 1
    if sp > 1:
        out.append(f"training.sequence_parallel {sp}: `hetprof run` splits a task's sequences where its layout "
                   f"says so (`sp`), not by this workload-wide degree")
    cp = workload.training.context_parallel or 1
    if cp > 1:
        out.append(f"training.context_parallel {cp}: `hetprof run` does not split sequences by context parallelism")
    if workload.training.optimizer_offload > 0:
        out.append(f"training.optimizer_offload {workload.training.optimizer_offload:g}: `hetprof run` steps "
                   f"the optimizer where the weights are")
    if workload.training.padded_dispatch:
        out.append("training.padded_dispatch: `hetprof run` hands passes their samples unpadded, in process")
    out.extend(precision_problems(workload.precision))
    return out


def precision_problems(precision) -> list[str]:
    """What `hetprof run` does not carry out in a workload's `precision:` (scalar or per task kind): FP8
    anywhere (it has no FP8 kernels, and running FP8's plan in bf16 would time another job), and
    generation and inference in different precisions (one engine dtype serves both)."""
    kinds = [str(k) for k in TaskKind]
    field = (lambda k: f"precision.{k}") if isinstance(precision, TaskPrecision) else (lambda k: "precision")
    fp8 = [k for k in kinds if precision_of(precision, k) == FP8]
    if fp8:
        return [f"{field(fp8[0])} fp8 ({', '.join(fp8)}): `hetprof run` has no FP8 kernels (no Transformer "
                f"Engine, no vLLM FP8 weights) and does not run an FP8 plan in bf16"]
    gen, inf = precision_of(precision, TaskKind.GENERATION), precision_of(precision, TaskKind.INFERENCE)
    if gen != inf:
        return [f"precision.generation {gen} with precision.inference {inf}: `hetprof run` serves generation and "
                f"the inference passes in one precision"]
    return []


def may_pipeline(task: str) -> bool:
    """Whether the executor runs `task` in pipeline stages."""
    return task not in UNPIPELINED


# Ulysses sequence parallelism (a layout's `sp`): `sp` consecutive whole-model replicas run each packed
# row together, a slice of its tokens each, swapping tokens for attention heads by all-to-all.
def sequence_parallel_problems(task: str, kind: str, model: ModelShape, sp: int, tp: int, pp: int, packed: bool,
                               name: str) -> list[str]:
    """Why the executor would refuse `sp` > 1 for this layout (empty: it runs it). It splits the packed
    rows of training and forward passes (`packed`: the workload sets max_tokens_per_microbatch),
    over replicas without TP or PP, and every rank must hold whole attention and KV heads."""
    if sp == 1:
        return []
    why = []
    if kind == TaskKind.GENERATION:
        why.append("generation decodes each sequence on one replica")
    if tp > 1 or pp > 1:
        why.append("its groups are whole-model replicas (no TP or PP)")
    if not packed:
        why.append("it splits packed rows: set training.max_tokens_per_microbatch")
    if model.heads % sp or model.kv_heads % sp:
        why.append(f"SP{sp} must divide the {model.name} model's attention heads ({model.heads}) and KV heads "
                   f"({model.kv_heads})")
    return [f"task {task} has layout {name}: this executor runs Ulysses sequence parallelism only where it "
            f"can ({'; '.join(why)})"] if why else []


# Expert parallelism (a layout's `ep`): `ep` consecutive whole-model replicas split every MoE layer's
# experts, exchanging tokens by all-to-all; the tasks whose copies cannot hold a split, and why.
NO_EXPERT_SPLIT = {
    Task.ACTOR_GEN: ("each generation replica decodes on its own (the hf backend token by token, and vLLM's "
                     "expert parallelism is not wired to the weight sync)"),
    Task.CRITIC_INFER: "it receives the critic's weights every iteration, and only whole-expert copies take a weight sync",
}


def expert_parallel_problems(task: str, model: ModelShape, ep: int, tp: int, pp: int, sp: int, sharding: str,
                             name: str) -> list[str]:
    """Why the executor would refuse `ep` > 1 for this layout (empty: it runs it). It splits the
    experts of an MoE model over whole-model replicas (no TP, PP, Ulysses or sharded state: their
    other gradients are averaged explicitly), `ep` dividing the experts of every MoE layer."""
    if ep == 1:
        return []
    why = [NO_EXPERT_SPLIT[task]] if task in NO_EXPERT_SPLIT else []
    if model.moe is None:
        why.append(f"the {model.name} model has no experts")
    elif model.moe.experts % ep:
        why.append(f"EP{ep} must divide the {model.name} model's {model.moe.experts} experts per MoE layer")
    if tp > 1 or pp > 1:
        why.append("its groups are whole-model replicas (no TP or PP)")
    if sp > 1:
        why.append("not with Ulysses sequence parallelism")
    if sharding != "none":
        why.append(f"its replicas average gradients explicitly and shard no state ({sharding} sharding)")
    return [f"task {task} has layout {name}: this executor runs expert parallelism only where it can "
            f"({'; '.join(why)})"] if why else []


def tp_divides(model: ModelShape, tp: int) -> bool:
    """Whether torch's tensor-parallel plan can shard `model` `tp` ways (heads, KV heads, FFN)."""
    return not (model.heads % tp or model.kv_heads % tp or model.ffn % tp)


def layout_problems(task: str, kind: str, model: ModelShape, tp: int, pp: int,
                    layer_splits: Sequence[Sequence[int]] = (), layout: str = "", sharding: str = "none", *,
                    sp: int = 1, cp: int = 1, ep: int = 1, packed: bool = True, backend: str = "vllm") -> list[str]:
    """Sentences saying why the executor would refuse this layout of `task` (empty: it runs it).

    `kind` is the task's kind (generation, inference, training); `layer_splits` each replica's
    layers per pipeline stage; `layout` how to name the layout in the sentences (e.g. DP2×TP1×PP2);
    `sp`, `cp`, `ep` its sequence-, context- and expert-parallel degrees; `packed` whether the
    workload packs its passes (training.max_tokens_per_microbatch); `backend` the generation engine
    (vLLM runs its own TP; the hf backend shards with this executor's). Ulysses sequence parallelism
    runs where `sequence_parallel_problems` finds nothing, expert parallelism where
    `expert_parallel_problems` does; context parallelism does not.
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
    if tp > 1 and model.moe is not None and (kind != TaskKind.GENERATION or backend == "hf"):
        out.append(f"task {task} has layout {name}: this executor's tensor parallelism splits dense MLPs only "
                   f"(torch's plan has no slicing of the {model.name} model's routed experts); run its replicas "
                   f"at TP1 (an ep degree splits its experts)")
    elif tp > 1 and not tp_divides(model, tp):
        out.append(f"task {task} has layout {name}: TP{tp} must divide the {model.name} model's attention "
                   f"heads ({model.heads}), KV heads ({model.kv_heads}) and FFN width ({model.ffn})")
    out += sequence_parallel_problems(task, kind, model, sp, tp, pp, packed, name)
    out += expert_parallel_problems(task, model, ep, tp, pp, sp, sharding, name)
    if cp != 1:
        out.append(f"task {task} has layout {name}: this executor runs no context parallelism (CP{cp})")
    return out
