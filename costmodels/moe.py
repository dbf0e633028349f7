"""What a mixture-of-experts layer costs beyond its FLOPs: grouped GEMMs, imbalance, all-to-alls.

A routed expert's matmul is one group of a grouped GEMM whose rows are the tokens routed to that
expert — far fewer than the tokens in flight (a decode step of 256 sequences gives Qwen3-30B-A3B's
128 experts 16 rows each at top-8), so it runs where the catalog's matmul efficiency curve is low.
Under expert parallelism over `ep` ranks a rank holds experts/ep experts and receives their tokens
from all `ep` ranks (rows ×ep), in exchange for a dispatch and a combine all-to-all per MoE layer and
pass, and the busiest rank's load sets every rank's pace.

Cited figures:
- GROUPED_GEMM_FACTOR: DeepGEMM README (github.com/deepseek-ai/DeepGEMM, "Performance", H800, FP8):
  the contiguous-layout grouped GEMM of 8 groups × M 4096, N 4096, K 7168 reaches 1288 TFLOPS where
  the normal GEMM of M 4096, N 4096, K 7168 reaches 1304 — a grouped GEMM at m rows per group runs
  at 1288/1304 of a dense GEMM of m rows, so the catalog's curve at m rows, times this, prices it.
- MAX_VIOLATION: Wang et al., "Auxiliary-Loss-Free Load Balancing Strategy for Mixture-of-Experts"
  (DeepSeek, arXiv 2408.15664), Table 1: MaxVio_global (the busiest expert's load over the mean,
  minus 1) of 0.52 for the 3B model trained with an auxiliary balance loss (how Qwen3-MoE and
  GPT-OSS balance) and 0.04 with the loss-free bias (how DeepSeek-V3 balances). A rank's load is the
  sum of its experts', so the busiest expert's violation bounds the busiest rank's; it is charged
  to the expert matmuls and the all-to-alls of every rank once experts are spread over ranks (ep > 1:
  with every expert on every rank no rank waits for another).
- MOE_EXTRA_KERNELS: an MoE layer runs the router matmul, its softmax/top-k, the token permute, the
  grouped gate-up GEMM, the activation, the grouped down GEMM and the unpermute (Megatron-core's
  MoELayer, transformers' Qwen3MoeSparseMoeBlock) where a dense FFN runs gate-up, activation and
  down: 4 kernels more per MoE layer and pass.
"""

from __future__ import annotations

from hetprof.specs.models import ModelShape

GROUPED_GEMM_FACTOR = 1288.0 / 1304.0
MAX_VIOLATION = {"aux_loss": 0.52, "loss_free": 0.04}
BALANCING = {"deepseek_v3": "loss_free"}  # model family -> how it balances (default: an auxiliary loss)
MOE_EXTRA_KERNELS = 7 - 3


def imbalance(model: ModelShape, ep: int) -> float:
    """The busiest expert-parallel rank's load over the mean (1 without EP or experts)."""
    if model.moe is None or ep <= 1:
        return 1.0
    return 1.0 + MAX_VIOLATION[BALANCING.get(model.family, "aux_loss")]


def routed_flops_per_token_per_layer(model: ModelShape) -> float:
    """Forward FLOPs of the routed experts one token goes through, mean over the layers (the part of
    `matmul_flops_per_token_per_layer` that runs as grouped GEMMs)."""
    if model.moe is None:
        return 0.0
    e = model.moe
    return 2.0 * 3 * model.hidden * e.expert_ffn * e.top_k * model.moe_layers / model.layers


def rows_per_expert(model: ModelShape, tokens: float, ep: int) -> float:
    """Rows of each local expert's GEMM on a rank holding `tokens` tokens, its EP group's tokens
    routed evenly: tokens × ep × top_k / experts."""
    if model.moe is None:
        return float(tokens)
    return tokens * ep * model.moe.top_k / model.moe.experts


def touched_fraction(model: ModelShape, tokens: float, ep: int) -> float:
    """Expected share of a rank's experts that at least one of its EP group's tokens is routed to
    (each token picks top_k of the experts): the expert weights a pass must read. A decode step of a
    few sequences reads a few experts; a prefill or training pass reads them all."""
    if model.moe is None:
        return 1.0
    miss = 1.0 - model.moe.top_k / model.moe.experts
    return 1.0 - miss ** (tokens * ep)


def routed_params_per_layer(model: ModelShape) -> float:
    """Mean routed-expert weights per layer (what EP splits; 0 for a dense model)."""
    return model.routed_expert_params_per_layer if model.moe is not None else 0.0


def dispatch_bytes(model: ModelShape, tokens: float, ep: int, dtype: str) -> float:
    """Bytes one rank holding `tokens` tokens sends in one MoE layer's dispatch all-to-all (the
    combine brings the same back): each token's hidden state to the (ep−1)/ep of its top_k experts
    that live on other ranks."""
    return tokens * model.dispatch_bytes_per_token_layer(ep, dtype)
