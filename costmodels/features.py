"""From profiler task rows to phases, and from phases to the fitted models' features.

A task row (`task.prefill`, `task.decode`, `task.train`; see docs/CONTRACTS.md) describes exactly
one `Phase`: the model's shape fields, `layers_run` blocks, batch, seq_len or context_len, dtype,
tp (default 1), with_head (default false), recompute. The same `Phase` is what the cost model
asks about when it composes a task, so training and prediction share one definition.

Features (all ≥ 0 and non-decreasing in batch, length and layers, so a non-negative combination of
them — or a monotone-constrained model of them — can never predict that more work is cheaper):

| name          | meaning                                                                    |
|---------------|----------------------------------------------------------------------------|
| compute_s     | weight-matmul (+ LM head) FLOPs / the device's datasheet peak FLOP/s for the dtype |
| attention_s   | attention FLOPs (QKᵀ, AV) / the same peak                                  |
| memory_s      | bytes moved (weights, activations, KV, optimizer) / datasheet memory bandwidth |
| kv_s          | KV-cache bytes / datasheet memory bandwidth (decode reads it all each step) |
| launches      | kernels launched, × 1 µs (the dispatch floor of small phases)               |
| token_layers  | tokens × layers, × 1 µs (per-token elementwise work: norms, RoPE, SiLU)     |
| seq_layers    | sequences × layers, × 1 µs (per-sequence attention set-up)                  |
| const         | 1 ms (per-call overhead)                                                    |

Dividing by the datasheet peaks makes a coefficient read as 1 / achieved efficiency.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from hetprof.costmodels import phases
from hetprof.costmodels.data import Phase
from hetprof.specs.catalog import lookup
from hetprof.specs.models import DTYPE_BYTES, PRESETS, ModelShape

FEATURES = ("compute_s", "attention_s", "memory_s", "kv_s", "launches", "token_layers", "seq_layers", "const")
TASK_PHASE = {"task.prefill": "prefill", "task.decode": "decode", "task.train": "train"}
PHASE_TASK = {v: k for k, v in TASK_PHASE.items()}
SHAPE_FIELDS = ("hidden", "ffn", "heads", "kv_heads", "head_dim", "vocab")


class RowError(ValueError):
    """A task row that does not describe a phase (missing or invalid fields)."""


def _int(row: Mapping[str, Any], key: str, default: int | None = None) -> int:
    v = row.get(key, default)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        if default is None:
            raise RowError(f"missing {key}")
        v = default
    if isinstance(v, bool) or not float(v).is_integer() or int(v) < 1:
        raise RowError(f"{key} must be a positive integer, got {v!r}")
    return int(v)


def _flag(row: Mapping[str, Any], key: str) -> bool:
    v = row.get(key, False)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return False
    return bool(v)


def phase_from_row(benchmark: str, row: Mapping[str, Any]) -> Phase:
    """The Phase a profiler task row timed; raises RowError naming what is missing."""
    if benchmark not in TASK_PHASE:
        raise RowError(f"not a task benchmark: {benchmark!r}")
    kind = TASK_PHASE[benchmark]
    preset = PRESETS.get(str(row.get("model", "")).lower())
    shape = {}
    for key in SHAPE_FIELDS:
        fallback = getattr(preset, key) if preset is not None else None
        shape[key] = _int(row, key, fallback)
    layers = _int(row, "layers_run", preset.layers if preset is not None else None)
    model = ModelShape(name=str(row.get("model", "custom")), family="qwen3", layers=layers,
                       tie_embeddings=True, qk_norm=bool(preset.qk_norm) if preset else False, **shape)
    length_key = "context_len" if kind == "decode" else "seq_len"
    dtype = str(row.get("dtype", "bf16"))
    if dtype not in DTYPE_BYTES:
        raise RowError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {dtype!r}")
    return Phase(kind, model, layers, _int(row, "batch"), _int(row, length_key), _int(row, "tp", 1),
                 _flag(row, "with_head"), dtype, _flag(row, "recompute") and kind == "train")


def phase_features(phase: Phase, device_type: str) -> list[float]:
    """The feature vector (order of FEATURES) of one phase on one device type."""
    gpu = lookup(device_type)
    peak = gpu.peak_flops(phase.dtype)
    bw = gpu.hbm_Bps
    fwd_attn = 4.0 * phase.model.heads * phase.model.head_dim * phases.attention_pairs(phase) * phase.layers / phase.tp
    passes = (4.0 if phase.recompute else 3.0) if phase.kind == "train" else 1.0
    attn = fwd_attn * passes
    total = phases.flops(phase)
    toks = phases.tokens(phase)
    return [
        (total - attn) / peak,
        attn / peak,
        phases.memory_bytes(phase) / bw,
        phases.kv_bytes(phase) / bw,
        phases.kernel_launches(phase) * 1e-6,
        toks * phase.layers * passes * 1e-6,
        phase.batch * phase.layers * passes * 1e-6,
        1e-3,
    ]
