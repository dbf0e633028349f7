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

Measured instead of cited: where `hetprof fit` has learned the grouped GEMM's time on a device type and
dtype from the profiler's `moe.experts` rows (costmodels/moefit.py), the routed experts run at the rate
that fitted model gives at their rows per expert (`ExpertGemm.rate`), and the catalog curve × the
DeepGEMM factor stands only where it has not.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any

from hetprof.costmodels.entries import checked_parts
from hetprof.costmodels.families import Family
from hetprof.specs.catalog import lookup
from hetprof.specs.models import ModelShape
from hetprof.specs.precision import gemm_weight_width, stored, width
from hetprof.specs.vocabulary import MoeBenchmark

GROUPED_GEMM_FACTOR = 1288.0 / 1304.0
MAX_VIOLATION = {"aux_loss": 0.52, "loss_free": 0.04}
BALANCING = {"deepseek_v3": "loss_free"}  # model family -> how it balances (default: an auxiliary loss)
MOE_EXTRA_KERNELS = 7 - 3


def imbalance(model: ModelShape, ep: int, stated: float | None = None) -> float:
    """The busiest expert-parallel rank's load over the mean (1 without EP or experts): the workload's
    `stated` figure (a router's measured statistics, or 1 where routing is forced to balance), else
    the cited one for how the model balances."""
    if model.moe is None or ep <= 1:
        return 1.0
    if stated is not None:
        return stated
    return 1.0 + MAX_VIOLATION[BALANCING.get(model.family, "aux_loss")]


def imbalance_source(model: ModelShape, stated: float | None = None) -> str:
    """Where `imbalance` takes its figure from, for reports."""
    if stated is not None:
        return "the workload's expert_imbalance"
    balancing = BALANCING.get(model.family, "aux_loss")
    how = "an auxiliary balance loss" if balancing == "aux_loss" else "DeepSeek's loss-free bias"
    return f"cited for {how} (arXiv 2408.15664, Table 1); set expert_imbalance to your router's figure"


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
    that live on other ranks. An FP8 recipe sends them in bf16: the cast to FP8 happens inside the
    expert GEMMs (precision.stored)."""
    return tokens * model.dispatch_bytes_per_token_layer(ep, stored(dtype))


# ---- the fitted grouped GEMM ----------------------------------------------------------------

EXPERT_MODEL = str(MoeBenchmark.EXPERTS)  # name and task type of its cost-model entries
EXPERT_FORMAT = 1
# Features of one grouped expert pass (all ≥ 0, non-decreasing in rows and groups, so a monotone fit
# never prices more rows cheaper): its GEMM FLOPs / datasheet peak, expert weight bytes / datasheet HBM
# bandwidth (what a few rows per expert are bound by), activation bytes / the same, groups × 1 µs
# (per-group dispatch), and 1 ms (per-call overhead). Dividing by datasheet figures makes a
# coefficient read as 1 / achieved efficiency, as the task features do (features.py).
EXPERT_FEATURES = ("compute_s", "weight_s", "activation_s", "groups", "const")
# A backward pass computes the data and the weight gradients: two forward passes' GEMMs and traffic.
PASS_WORK = {"forward": 1.0, "backward": 2.0}


def expert_flops(hidden: int, ffn: int, groups: float, rows: float) -> float:
    """Forward FLOPs of `groups` SwiGLU experts (gate, up, down) over `rows` rows each."""
    return 2.0 * 3 * hidden * ffn * groups * rows


def expert_features(hidden: int, ffn: int, groups: float, rows: float, pass_: str, dtype: str,
                    device_type: str) -> list[float]:
    """The feature vector (order of EXPERT_FEATURES) of one grouped expert pass on a device type."""
    gpu = lookup(device_type)
    work = PASS_WORK[pass_]
    weights = 3.0 * hidden * ffn * groups * gemm_weight_width(dtype)
    activations = groups * rows * (2 * hidden + 3 * ffn) * width(dtype)  # in, gate-up out, activation, out
    return [work * expert_flops(hidden, ffn, groups, rows) / gpu.peak_flops(dtype), work * weights / gpu.hbm_Bps,
            work * activations / gpu.hbm_Bps, work * groups * 1e-6, 1e-3]


@dataclasses.dataclass(frozen=True)
class ExpertGemm:
    """A fitted grouped-GEMM time model of one device type and dtype (a `moe.experts` cost-model entry)."""

    id: str
    device_type: str
    dtype: str
    family: Family
    params: dict[str, Any]
    heldout_mape: float | None = None

    def seconds(self, hidden: int, ffn: int, groups: float, rows: float, pass_: str) -> float:
        x = expert_features(hidden, ffn, groups, rows, pass_, self.dtype, self.device_type)
        return self.family.predict_one(self.params, x)

    def rate(self, model: ModelShape, rows: float, ep: int, training: bool) -> float | None:
        """FLOP/s at which a rank's routed experts (experts / ep of them, `rows` rows each) run their
        forward FLOPs — forward alone, or for training forward and backward over 3× those FLOPs, the
        work the roofline's three passes charge. None when the model gives no positive time."""
        assert model.moe is not None
        groups = max(1.0, model.moe.experts / ep)
        ffn = model.moe.expert_ffn
        seconds = self.seconds(model.hidden, ffn, groups, rows, "forward")
        if training:
            seconds += self.seconds(model.hidden, ffn, groups, rows, "backward")
        if not (math.isfinite(seconds) and seconds > 0):
            return None
        return expert_flops(model.hidden, ffn, groups, rows) * (3.0 if training else 1.0) / seconds


def validate_expert_entry(entry: dict[str, Any]) -> ExpertGemm:
    """An ExpertGemm from one database entry, or ValueError saying what is wrong with it (entries may
    come from strangers' databases: numbers only, checked before anything is computed)."""
    params = entry.get("params")
    if not isinstance(params, dict) or params.get("format") != EXPERT_FORMAT:
        raise ValueError(f"params are not a format-{EXPERT_FORMAT} {EXPERT_MODEL} entry")
    device, dtype, family, model = checked_parts(params, EXPERT_FEATURES)
    mape = (entry.get("metrics") or {}).get("heldout_mape")
    return ExpertGemm(str(entry.get("id", "")), device, dtype, family, model,
                      float(mape) if isinstance(mape, (int, float)) else None)


def load_expert_gemms(db: Any | None) -> dict[tuple[str, str], ExpertGemm]:
    """The newest valid fitted grouped GEMM per (device type, dtype) in the profile database; invalid
    entries are skipped with one warning (an older valid one stands)."""
    if db is None:
        return {}
    index = db.cost_models(task_type=EXPERT_MODEL)
    if not len(index):
        return {}
    loaded: dict[tuple[str, str], ExpertGemm] = {}
    rejected = []
    for model_id in index[index["name"] == EXPERT_MODEL].sort_values("created")["id"]:
        try:
            gemm = validate_expert_entry(db.get_cost_model(model_id))
        except Exception as exc:  # noqa: BLE001 - any malformed entry is refused the same way
            rejected.append(f"cost model {str(model_id)[:12]}: {exc}")
            continue
        loaded[(gemm.device_type, gemm.dtype)] = gemm
    if rejected:
        warnings.warn(f"ignored {len(rejected)} invalid {EXPERT_MODEL} entries: " + "; ".join(rejected[:3]),
                      stacklevel=2)
    return loaded
