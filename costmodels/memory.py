"""Bytes a task keeps on one device, per phase: weights, gradients, optimizer state, activations, KV.

Counting conventions (the tests check each against hand arithmetic):
- weights in the task's dtype; tensor parallelism shards every matrix, so a device holds 1/tp;
  a pipeline stage holds its layers plus (conservatively) the embedding and LM head.
- mixed-precision Adam (bf16/fp16 weights): bf16 gradients (2 B/param) plus an fp32 master copy and
  the two fp32 moments (12 B/param) — 16 B per parameter with the weights, as in the ZeRO paper.
  fp32 training keeps no master copy: 4 B grads + 8 B moments.
- training activations: what one layer stores for its backward pass, per token, with a fused
  (flash) attention kernel so no seq² score matrix: layer input and norm output (2h), q/k/v and
  attention output (2·q_dim + 2·kv_dim, sharded by tp), residual and second norm (3h), SwiGLU gate,
  up, activation and product (4·ffn, sharded by tp) — the SwiGLU/GQA form of Korthikanti et al.
  (2022). Recomputation (`recompute`): full keeps only each layer's input and replays one layer at
  a time; selective (Megatron's) replays each layer's attention core, whose seq² scores the fused
  kernel never stores, so it keeps what none keeps. Activation offload moves each layer's stored
  bytes to the host after its forward: the device holds OFFLOAD_RESIDENT_LAYERS layers' worth.
  Training and inference run in padded micro-batches of at most `micro_tokens` tokens (gradient
  accumulation; MICRO_BATCH_TOKENS, verl's default token budget per GPU, unless a planner chose
  fewer: `fitting_micro_tokens`), so activations scale with the micro-batch.
- sequence splitting: Ulysses (`sp` data-parallel ranks share each sequence) and context parallelism
  (`cp` ranks of a stage share each sequence) put 1/(sp·cp) of a micro-batch's tokens on a rank.
- the LM head's fp32 logits (and their gradient in training) for one micro-batch.
- data-parallel sharding over `dp` replicas (ZeRO paper, FSDP): zero1 divides the optimizer state
  by dp, zero2 the gradients too, fsdp (ZeRO-3) the weights too, and then holds the units it
  gathers while they compute: the root unit (embeddings, LM head, final norm — FSDP keeps the
  root gathered through the step) plus two decoder layers (the one computing and the one being
  prefetched), as activations since they are freed, not moved.
- generation keeps the KV cache of its concurrent sequences (KV heads shard over tp, at least one
  per rank) plus a fixed workspace; at most GPU_MEMORY_UTILIZATION of the device is used, as vLLM does.
  MLA (DeepSeek) caches one latent and rope key per token and layer, whole on every tp rank (vLLM's
  MLA backends replicate it: the latent has no heads to split).
- mixture of experts: expert parallelism over `ep` ranks splits the routed experts, and expert
  tensor parallelism (`etp`, default tp: Megatron-core's --expert-tensor-parallel-size default)
  splits each expert; the rest (attention, dense FFN, shared experts, router) shards over tp as
  above. EP ranks come out of the data-parallel ranks, so the experts have dp·tp/(ep·etp)
  replicas, over which ZeRO shards their gradients and optimizer state (Megatron's expert
  data-parallel group). A dense model has no routed experts and none of this changes its bytes.
- FP8 (hetprof/specs/precision.py says what each engine's recipe keeps, and why): generation holds
  its Linear weights in 1 byte and the embedding and LM head in bf16, and its KV cache in 1 byte;
  training and inference hold the bf16 weights plus two cached FP8 copies of every Linear weight, and
  training keeps bf16 gradients, the fp32 master and moments (12 B/param), and activations in bf16
  but for the Linear layers' inputs (both norm outputs, the attention output, the SwiGLU product),
  saved in FP8 for the weight-gradient GEMMs.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from hetprof.costmodels.data import MemoryEstimate
from hetprof.specs.layout import SHARDING
from hetprof.specs.models import DTYPE_BYTES, ModelShape
from hetprof.specs.precision import FP8, FP8_BYTES, kv_width, linear_weight_bytes, stored
from hetprof.specs.vocabulary import TaskKind
from hetprof.specs.workload import recompute_mode

MIXED_PRECISION_OPTIMIZER_BYTES = 12  # fp32 master weights + Adam m + Adam v, per parameter
FP32_OPTIMIZER_BYTES = 8  # Adam m + v when the weights already are fp32
MICRO_BATCH_TOKENS = 16384
OFFLOAD_RESIDENT_LAYERS = 2  # activation offload: the layer computing and the one in flight to or from the host
GPU_MEMORY_UTILIZATION = 0.9
GEN_WORKSPACE_TOKENS = 8192  # prefill chunk a generation engine schedules at once
GEN_MAX_SAMPLED = 256  # sequences whose logits are materialised per decode step
LOGIT_BYTES = 4


def split_params_on_device(model: ModelShape, layers: int, tp: int, with_embeddings: bool = True,
                           ep: int = 1, etp: int | None = None) -> tuple[float, float]:
    """(tp-sharded, expert-sharded) parameters one device of `layers` layers holds: everything but
    the routed experts over tp, the routed experts (their mean per layer) over ep·etp."""
    experts = layers * model.routed_expert_params_per_layer
    n = layers * model.params_per_layer - experts
    if with_embeddings:
        n += model.embedding_params + model.lm_head_params + model.hidden
    return n / tp, experts / (ep * (tp if etp is None else etp))


def params_on_device(model: ModelShape, layers: int, tp: int, with_embeddings: bool = True,
                     ep: int = 1, etp: int | None = None) -> float:
    """Parameters one device of a tp-way shard of `layers` layers holds (routed experts over ep·etp)."""
    shared, experts = split_params_on_device(model, layers, tp, with_embeddings, ep, etp)
    return shared + experts


def expert_replicas(dp: int, tp: int, ep: int, etp: int | None = None) -> float:
    """Copies of each expert shard among dp·tp ranks (Megatron's expert data-parallel size)."""
    return max(1.0, dp * tp / (ep * (tp if etp is None else etp)))


def kv_bytes_per_token(model: ModelShape, layers: int, tp: int, dtype: str = "bf16") -> float:
    """KV-cache bytes one token adds on one device (K and V of its share of KV heads; MLA: the
    latent and rope key, whole on every rank)."""
    if model.mla is not None:
        return float(layers * model.mla.cached_per_layer * kv_width(dtype))
    kv_heads = math.ceil(model.kv_heads / tp)
    return 2.0 * layers * kv_heads * model.head_dim * kv_width(dtype)


def activation_bytes_per_token_layer(model: ModelShape, tp: int, dtype: str = "bf16") -> float:
    """Bytes one layer stores per token for its backward pass (see the module docstring)."""
    q_dim = model.heads * model.head_dim
    kv_dim = model.kv_heads * model.head_dim
    half = DTYPE_BYTES[stored(dtype)]
    full = half * (5 * model.hidden + (2 * q_dim + 2 * kv_dim + 4 * model.ffn) / tp)
    if dtype != FP8:
        return full
    # FP8 (Transformer Engine): the Linear layers' inputs are saved in FP8 for the wgrad GEMMs
    return full - (half - FP8_BYTES) * (2 * model.hidden + (q_dim + model.ffn) / tp)


def micro_batch(batch: int, seq_len: int, token_budget: int = MICRO_BATCH_TOKENS) -> int:
    """Sequences per micro-batch: as many as fit the token budget, at least one."""
    return max(1, min(batch, token_budget // max(1, seq_len)))


def micro_token_choices(seq_len: int, group: int = 1) -> tuple[int, ...]:
    """Padded micro-batch token budgets (per rank) a planner may choose, largest first: MICRO_BATCH_TOKENS
    halved until one sequence, split over the `group` ranks that share it, fills a budget alone
    (smaller budgets hold that one sequence all the same)."""
    out = [MICRO_BATCH_TOKENS]
    while out[-1] * group > seq_len and out[-1] > 1:
        out.append(out[-1] // 2)
    return tuple(out)


def fitting_micro_tokens(estimate: Callable[[int], MemoryEstimate], capacity: float, seq_len: int,
                         group: int = 1) -> tuple[int, MemoryEstimate]:
    """The largest of `micro_token_choices` whose `estimate(budget)` fits within `capacity` bytes, with that
    estimate; the smallest and its estimate when none fits. Why the largest: fewer, fuller micro-batches
    keep matmuls wide and per-micro-batch costs (FSDP gathers, launches) few."""
    choices = micro_token_choices(seq_len, group)
    for budget in choices:
        est = estimate(budget)
        if est.total <= capacity:
            return budget, est
    return choices[-1], est


def training_activations(model: ModelShape, layers: int, tp: int, dtype: str, tokens: float,
                         recompute: bool | str = "none", offload: bool = False) -> float:
    """Bytes a training stage keeps for its backward over `tokens` tokens (module docstring): every
    layer's stored tensors (none, selective) or its input plus one replayed layer's (full), of all
    `layers` or, offloaded, of OFFLOAD_RESIDENT_LAYERS."""
    per_layer = activation_bytes_per_token_layer(model, tp, dtype)
    kept = min(layers, OFFLOAD_RESIDENT_LAYERS) if offload else layers
    if recompute_mode(recompute) == "full":
        return tokens * (kept * model.hidden * DTYPE_BYTES[stored(dtype)] + per_layer)
    return tokens * kept * per_layer


def offloaded_activation_bytes(model: ModelShape, layers: int, tp: int, dtype: str, tokens: float,
                               recompute: bool | str = "none") -> float:
    """Bytes activation offload moves to the host (and back) over `tokens` tokens: what every layer
    but the resident ones stores for its backward."""
    moved = max(0, layers - OFFLOAD_RESIDENT_LAYERS)
    if recompute_mode(recompute) == "full":
        return tokens * moved * model.hidden * DTYPE_BYTES[stored(dtype)]
    return tokens * moved * activation_bytes_per_token_layer(model, tp, dtype)


def sharded_state(sharding: str) -> tuple[str, ...]:
    """What a data-parallel sharding level divides over the replicas (hetprof.specs.plan.SHARDING)."""
    try:
        return SHARDING[sharding]
    except KeyError:
        raise ValueError(f"unknown sharding {sharding!r} (one of {', '.join(SHARDING)})") from None


def gathered_params(model: ModelShape, tp: int) -> float:
    """Parameters a fully sharded replica holds gathered at once: the root unit and two layers."""
    return (model.embedding_params + model.lm_head_params + model.hidden + 2 * model.params_per_layer) / tp


def optimizer_bytes_per_param(dtype: str) -> int:
    return FP32_OPTIMIZER_BYTES if DTYPE_BYTES[stored(dtype)] >= 4 else MIXED_PRECISION_OPTIMIZER_BYTES


def weight_bytes_on_device(model: ModelShape, layers: int, tp: int, dtype: str, kind: str, ep: int = 1,
                           etp: int | None = None) -> float:
    """Bytes of the weights one device of a tp-way shard of `layers` layers holds in `kind`'s recipe:
    params × width, FP8 splitting the Linear layers (their recipe's bytes) from the embedding and LM head
    (bf16)."""
    params = params_on_device(model, layers, tp, ep=ep, etp=etp)
    if dtype != FP8:
        return params * DTYPE_BYTES[dtype]
    edges = (model.embedding_params + model.lm_head_params + model.hidden) / tp
    return (params - edges) * linear_weight_bytes(dtype, kind) + edges * DTYPE_BYTES[stored(dtype)]


def generation_workspace(model: ModelShape, tp: int, dtype: str = "bf16") -> float:
    """Scratch a generation engine needs besides weights and KV: one prefill chunk, sampled logits."""
    act = GEN_WORKSPACE_TOKENS * activation_bytes_per_token_layer(model, tp, stored(dtype))
    logits = GEN_MAX_SAMPLED * model.vocab * LOGIT_BYTES / tp
    return act + logits


def max_concurrent_sequences(model: ModelShape, layers: int, tp: int, seq_len: int, dtype: str,
                             memory_bytes: float, utilization: float = GPU_MEMORY_UTILIZATION,
                             ep: int = 1, etp: int | None = None) -> int:
    """How many sequences of `seq_len` tokens have room for their KV cache next to the weights, within
    `utilization` of the device (the share the engine is told it may use)."""
    usable = memory_bytes * utilization
    free = (usable - weight_bytes_on_device(model, layers, tp, dtype, TaskKind.GENERATION, ep, etp)
            - generation_workspace(model, tp, dtype))
    per_seq = max(1, seq_len) * kv_bytes_per_token(model, layers, tp, dtype)
    return max(0, int(free // per_seq))


def _state(params: float, experts: float, per_param: float, copies: float, expert_copies: float) -> float:
    """Bytes of `per_param` per parameter with the non-expert part sharded over `copies` replicas
    and the routed experts over `expert_copies` (no experts: the dense formula, unchanged)."""
    if not experts:
        return params * per_param / copies
    return (params - experts) * per_param / copies + experts * per_param / expert_copies


def task_memory(kind: str, model: ModelShape, layers: int, tp: int, batch: int, seq_len: int, dtype: str,
                recompute: bool | str, concurrent: int, dp: int = 1, sharding: str = "none",
                token_budget: int | None = None, sp: int = 1, ep: int = 1, etp: int | None = None,
                cp: int = 1, micro_tokens: int | None = None, offload: bool = False,
                optimizer_offload: float = 0.0) -> MemoryEstimate:
    """Peak bytes on one device of a (tp-sharded, `layers`-layer) replica during its phase.

    `concurrent` is the number of sequences whose KV cache generation holds at once (ignored by
    the other kinds); `sharding` shards a training replica's state over its `dp` replicas, and the
    weights of an inference pass run on such a replica (the log-prob pass on an FSDP trainer's
    model holds its parameter shard and gathers a layer at a time, as the trainer's forward does).
    `token_budget` prices packed micro-batches: at most that many tokens at once, whatever the lengths.
    Under Ulysses sequence parallelism over `sp` ranks a micro-batch is formed for the group (`sp`
    replicas' sequences, `sp` budgets) and each rank holds 1/sp of its tokens: the same as one budget
    when many sequences fill it, but one sequence longer than the budget splits over the ranks.
    Context parallelism over `cp` ranks of a stage splits each of the replica's own sequences the same
    way. `micro_tokens` is the padded micro-batch's budget (None: MICRO_BATCH_TOKENS); `recompute`
    (none, selective, full) and activation `offload` set what training keeps for its backward;
    `optimizer_offload` is the share of the optimizer state held in host memory instead.
    `ep` and `etp` shard an MoE model's routed experts (module docstring); the sharding levels then
    divide the expert state over its expert replicas, not over dp.
    """
    width = DTYPE_BYTES[stored(dtype)]  # gradients, and the bytes a layer's activations count in
    shared, experts = split_params_on_device(model, layers, tp, ep=ep, etp=etp)
    params = shared + experts
    replicas = expert_replicas(dp, tp, ep, etp)
    weights = weight_bytes_on_device(model, layers, tp, dtype, kind, ep, etp)
    held = weights / params if dtype == FP8 else width  # bytes per parameter as held (FP8: with its copies)
    grads = optimizer = kv = gathered = 0.0
    if kind == TaskKind.INFERENCE and dp > 1 and "params" in sharded_state(sharding):
        weights = _state(params, experts, held, dp, replicas)
        gathered = min(params, gathered_params(model, tp)) * held
    if kind == TaskKind.GENERATION:
        kv = concurrent * seq_len * kv_bytes_per_token(model, layers, tp, dtype)
        act = generation_workspace(model, tp, dtype)
    else:
        group, pooled = max(1, sp) * max(1, cp), batch * max(1, sp)  # sp pools its replicas' sequences
        budget = MICRO_BATCH_TOKENS if micro_tokens is None else micro_tokens
        tokens = (micro_batch(pooled, seq_len, budget * group) * seq_len if token_budget is None
                  else min(token_budget * group, pooled * seq_len)) / group
        per_layer = activation_bytes_per_token_layer(model, tp, dtype)
        logits = tokens * model.vocab * LOGIT_BYTES / tp
        if kind == TaskKind.INFERENCE:
            act = tokens * per_layer + logits + gathered  # layers run one after another, nothing kept
        elif kind == TaskKind.TRAINING:
            shards = sharded_state(sharding) if dp > 1 else ()
            grads = _state(params, experts, width, *((dp, replicas) if "grads" in shards else (1, 1)))
            optimizer = _state(params, experts, optimizer_bytes_per_param(dtype),
                               *((dp, replicas) if "optimizer" in shards else (1, 1))) * (1 - optimizer_offload)
            act = training_activations(model, layers, tp, dtype, tokens, recompute, offload)
            act += 2 * logits  # logits and their gradient
            if "params" in shards:
                weights = _state(params, experts, held, dp, replicas)
                act += min(params, gathered_params(model, tp)) * held
        else:
            raise ValueError(f"unknown work kind {kind!r}")
    total = weights + grads + optimizer + act + kv
    return MemoryEstimate(weights, grads, optimizer, act, kv, total, phase=kind)
