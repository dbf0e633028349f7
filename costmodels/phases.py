"""The physics of one phase: FLOPs and bytes of memory traffic on one device.

Both the roofline and the fitted models start from these numbers, so the fitted model's features
are documented quantities rather than raw shape fields. Counts are per device of a tp-way shard.

- matmul FLOPs: 2 per multiply-accumulate of every weight matrix, per token.
- attention FLOPs: QKᵀ and AV, 4·heads·head_dim per (query, key) pair; a causal prefill of s tokens
  has s²/2 pairs per sequence, a decode step at context c has c. Sequences of different lengths
  have Σs²/2 pairs, not n·s̄²/2: a phase priced at the mean length s̄ carries `attention_span`
  Σs²/Σs, so a long tail costs its quadratic share (lognormal with std = mean: twice s̄²).
- training: a weight matmul's backward is twice its forward; the attention core's backward is
  ATTENTION_BACKWARD times its forward (FlashAttention recomputes QKᵀ in the backward: five matmuls
  to the forward's two); full recomputation replays the forward once more, selective recomputation
  (Megatron's) only each layer's attention core (QKᵀ, AV).
- bytes: weights read once per pass (three times in training: forward, input- and weight-gradient),
  activations read+written ACT_RW_PER_LAYER hidden-sized and 3 ffn-sized tensors per token per
  layer, KV cache written (prefill) or read (decode), and Adam's update touches for every parameter
  the fp32 master, both moments (read + write) and the gradient (`adam_step_bytes`; the cost model
  prices it apart, over the rank's optimizer shard when data parallelism shards it).
- FP8 (hetprof/specs/precision.py): GEMMs read 1-byte weights and the KV cache is 1 byte; activations
  move in bf16.
"""

from __future__ import annotations

import math

from hetprof.costmodels import moe
from hetprof.costmodels.data import Phase
from hetprof.costmodels.memory import kv_bytes_per_token, optimizer_bytes_per_param
from hetprof.specs.precision import gemm_weight_width, width

ACT_RW_PER_LAYER = 12  # hidden-sized tensors read or written per token per layer (norms, residuals, qkv, o)
ADAM_BYTES_PER_PARAM = 2 * 12 + 2 + 2  # master, m, v read+write (fp32); gradient read; new weight write
# FLOPs of FlashAttention's backward over its forward: 5 matmuls (QKᵀ recomputed, dV, dP, dQ, dK) to 2.
# Tri Dao, "FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning" (2023),
# §4.1: "multiply the forward pass FLOPs by 2.5"; flash-attention's benchmarks/benchmark_flash_attention.py
# flops(): 2.5 × fwd for "bwd".
ATTENTION_BACKWARD = 2.5


def tokens(p: Phase) -> int:
    """Tokens the phase pushes through its layers (one new token per sequence when decoding)."""
    return p.batch if p.kind == "decode" else p.batch * p.tokens


def attention_pairs(p: Phase) -> float:
    """(query, key) pairs per layer, over the whole batch."""
    if p.kind == "decode":
        return float(p.batch * p.tokens)
    return p.batch * p.tokens * (span(p) + 1) / 2.0


def span(p: Phase) -> float:
    """Keys an average token of a prefill or training phase attends over (causal: up to itself)."""
    return float(p.tokens if p.attention_span is None else p.attention_span)


def forward_matmul_flops(p: Phase) -> float:
    """Forward FLOPs of the weight matmuls (and LM head) on one device."""
    m = p.model
    matmul = tokens(p) * m.matmul_flops_per_token_per_layer()
    head = 2.0 * m.vocab * m.hidden * tokens(p) if p.with_head else 0.0
    return (p.layers * matmul + head) / p.tp


def routed_matmul_flops(p: Phase) -> float:
    """The part of `forward_matmul_flops` in an MoE model's routed experts (0 for a dense model):
    on average a rank computes its own tokens' top-k expert FLOPs, whoever holds the experts."""
    return p.layers * tokens(p) * moe.routed_flops_per_token_per_layer(p.model) / p.tp


def expert_rows(p: Phase) -> float:
    """Rows of each routed expert's GEMM on one device (moe.rows_per_expert)."""
    return moe.rows_per_expert(p.model, tokens(p), p.ep)


def forward_attention_flops(p: Phase) -> float:
    """Forward FLOPs of attention scores and values (QKᵀ, AV) on one device (the model's own count per
    (query, key) pair: 4·heads·head_dim, or MLA's 2·heads·(qk + v head dims))."""
    return p.layers * p.model.attention_flops_per_token_per_layer(1.0) * attention_pairs(p) / p.tp


def forward_flops(p: Phase) -> float:
    """Forward FLOPs on one device."""
    return forward_matmul_flops(p) + forward_attention_flops(p)


def passes(p: Phase) -> float:
    """Forward-equivalents of work: training adds backward (twice the forward) and recomputation."""
    if p.kind == "train":
        return 4.0 if p.recompute else 3.0
    return 1.0


def attention_passes(p: Phase) -> float:
    """Forward-equivalents of attention-core work: the forward, in training its FlashAttention backward
    (ATTENTION_BACKWARD forwards) and one more forward when the core is replayed (full or selective
    recomputation)."""
    if p.kind != "train":
        return passes(p)
    return 1.0 + ATTENTION_BACKWARD + (1.0 if p.recompute or p.recompute_attention else 0.0)


def flops(p: Phase) -> float:
    """FLOPs of the phase on one device (training: forward, backward, optional recomputation)."""
    return forward_flops(p) * passes(p) + forward_attention_flops(p) * (attention_passes(p) - passes(p))


# What the catalog's efficiency curves are indexed by (hetprof/data/gpus.yaml says why these).
def matmul_rows(p: Phase) -> float:
    """Rows of each weight matmul on one device: the tokens in flight (small for decode)."""
    return float(tokens(p))


def attention_keys(p: Phase) -> float:
    """Keys each query attends over: the context length (decode), the span of a batch of lengths."""
    return float(p.tokens) if p.kind == "decode" else span(p)


def weight_bytes(p: Phase) -> float:
    """Bytes of the phase's weights on one device (an MoE model's: the rank's 1/ep of the routed
    experts, of which the experts its EP group's tokens reach, moe.touched_fraction)."""
    m = p.model
    n = p.layers * m.params_per_layer + (m.vocab * m.hidden if p.with_head else 0)
    if m.moe is not None:
        routed = p.layers * moe.routed_params_per_layer(m)
        n -= routed * (1.0 - moe.touched_fraction(m, tokens(p), p.ep) / p.ep)
    return n * gemm_weight_width(p.dtype) / p.tp


def kv_bytes(p: Phase) -> float:
    """KV-cache bytes the phase writes (prefill, train) or reads (decode)."""
    per_token = kv_bytes_per_token(p.model, p.layers, p.tp, p.dtype)
    return per_token * (p.batch * p.tokens)


def activation_bytes(p: Phase) -> float:
    """Activation traffic: hidden- and ffn-sized tensors read and written per token per layer."""
    m = p.model
    size = width(p.dtype)
    per_token_layer = size * (ACT_RW_PER_LAYER * m.hidden + 3 * m.ffn / p.tp)
    act = tokens(p) * p.layers * per_token_layer
    if p.with_head:
        act += tokens(p) * m.vocab * size / p.tp
    if p.kind == "train":
        act *= 4.0 if p.recompute else 3.0
    return act


def adam_step_bytes(params: float, dtype: str) -> float:
    """Bytes one Adam step over `params` parameters moves: fp32 master, m and v read and written, the
    gradient read and the new weight written (fp32 training: no master copy)."""
    extra = ADAM_BYTES_PER_PARAM if optimizer_bytes_per_param(dtype) > 8 else 2 * 8 + 2 * 4
    return params * extra


def optimizer_bytes(p: Phase) -> float:
    """Adam step traffic of the phase's weights (training only), unsharded."""
    if p.kind != "train":
        return 0.0
    return adam_step_bytes(weight_bytes(p) / gemm_weight_width(p.dtype), p.dtype)


def pass_bytes(p: Phase) -> float:
    """Bytes the phase's forward (and backward) passes move: weights, KV cache, activations.

    The roofline overlaps these with the passes' matmuls; the Adam step that follows a backward
    is a separate memory-bound sweep over the optimizer state (`adam_step_bytes`), priced after it.
    """
    passes = 3.0 if p.kind == "train" else 1.0
    return passes * weight_bytes(p) + kv_bytes(p) + activation_bytes(p)


def memory_bytes(p: Phase) -> float:
    """Total bytes moved to and from device memory by the phase, the unsharded Adam step included
    (what a profiled training step moves: the fitted model's feature)."""
    return pass_bytes(p) + optimizer_bytes(p)


def kernel_launches(p: Phase) -> float:
    """Kernels launched: a fixed number per layer and pass (the latency floor of small phases)."""
    per_layer = 14.0
    if p.model.moe is not None:  # the router, permutes and grouped GEMMs (moe.MOE_EXTRA_KERNELS)
        per_layer += moe.MOE_EXTRA_KERNELS * p.model.moe_layers / p.model.layers
    passes = {"prefill": 1.0, "decode": 1.0, "train": 4.0 if p.recompute else 3.0}[p.kind]
    return passes * (p.layers * per_layer + (2.0 if p.with_head else 0.0)) + (
        3.0 * p.layers if p.kind == "train" else 0.0)


def check(p: Phase) -> None:
    """Shapes a phase can be computed for (guards divisions and logs downstream)."""
    if p.layers < 1 or p.batch < 1 or p.tokens < 1 or p.tp < 1 or p.ep < 1 or not math.isfinite(p.tokens):
        raise ValueError(f"invalid phase {p}")
