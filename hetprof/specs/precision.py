"""Precision per task: what a task's matmuls run at and what it keeps in memory, bf16 unless a workload says.

A workload names one precision for every task (`precision: bf16`) or one per task kind
(`precision: {generation: fp8, training: fp8}`); a kind it leaves out computes in bf16, except
inference (the reference and log-prob passes), which follows training: those passes run on the
trainer's engine, in its precision (NeMo RL's Megatron policy computes log-probs under the same
FP8 recipe it trains with).

bf16, fp16 and fp32 compute and store in that dtype (mixed-precision Adam for the 16-bit ones).
FP8 is two recipes, one per engine, each from its engine's documentation:

- generation (vLLM `quantization="fp8"` with `kv_cache_dtype="fp8"`, what NeMo RL's `vllm_cfg.precision:
  fp8` turns on): every Linear layer's weights in FP8 E4M3, 1 byte, "all Linear modules (except for the
  final lm_head)" (vLLM docs, FP8 W8A8); the embedding and LM head stay bf16; the KV cache is FP8 (vLLM
  docs, Quantized KV Cache), 1 byte per element; activations stay bf16. GEMMs run at the FP8 peak;
  attention at the bf16 peak (only FlashAttention-3 computes attention in the FP8 domain, per the same
  page; the other backends dequantize).
- training and inference (Transformer Engine `fp8_autocast`, as NeMo RL's Megatron policy and NeMo
  run it: TE user guide, "Using FP8 with Transformer Engine"): parameters, gradients and the optimizer
  stay as in bf16 training (bf16 weights, fp32 master weights and Adam moments: "mixed precision
  training with FP8" keeps the higher-precision master copy); every Linear weight also has cached FP8
  copies, one row-wise for the forward and one column-wise (transposed) for the backward's dgrad GEMM
  ("FP8 weight caching"), FP8_WEIGHT_COPIES bytes per Linear parameter; a Linear layer saves its input
  for the weight-gradient GEMM in FP8 (1 byte), every other saved activation stays bf16; all three GEMMs
  (fprop, dgrad, wgrad) run at the FP8 peak and DotProductAttention at the bf16 peak (TE's default: FP8
  attention is a separate opt-in, `fp8_dpa`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Literal

from hetprof.errors import SpecError
from hetprof.specs.loader import field
from hetprof.specs.models import DTYPE_BYTES
from hetprof.specs.vocabulary import TaskKind

Precision = Literal["bf16", "fp16", "fp32", "fp8"]
PRECISIONS: tuple[str, ...] = ("bf16", "fp16", "fp32", "fp8")
FP8 = "fp8"
FP8_BYTES = 1
FP8_WEIGHT_COPIES = 2  # TE's cached FP8 weight, row-wise (forward) and column-wise (backward dgrad)
HALF = "bf16"  # what FP8 recipes keep everything else in


@dataclasses.dataclass
class TaskPrecision:
    """`precision:` as a mapping: the precision of each task kind (left out: bf16; inference: training's)."""

    generation: Precision | None = field(None, help="rollout generation (fp8: vLLM FP8 weights and KV cache)")
    inference: Precision | None = field(None, help="reference, reward and log-prob passes (default: training's)")
    training: Precision | None = field(None, help="training passes (fp8: Transformer Engine FP8 GEMMs over bf16 "
                                                  "weights and fp32 master weights)")

    def of(self, kind: str) -> str:
        """The precision of a task kind."""
        if kind == TaskKind.GENERATION:
            return self.generation or HALF
        if kind == TaskKind.INFERENCE:
            return self.inference or self.training or HALF
        return self.training or HALF


def precision_of(precision: str | TaskPrecision, kind: str) -> str:
    """The precision a task of `kind` computes in, from a workload's `precision:` (scalar or mapping)."""
    return precision.of(kind) if isinstance(precision, TaskPrecision) else precision


def uses_fp8(precision: str | TaskPrecision) -> list[str]:
    """The task kinds a workload's `precision:` runs in FP8 (empty: none)."""
    return [str(k) for k in TaskKind if precision_of(precision, k) == FP8]


def stored(dtype: str) -> str:
    """The dtype of what an FP8 recipe keeps in 16 bits (weights, gradients, activations), else `dtype`."""
    return HALF if dtype == FP8 else dtype


def width(dtype: str) -> int:
    """Bytes per element of the tensors kept in `dtype`'s storage dtype (activations, gradients, messages)."""
    return DTYPE_BYTES[stored(dtype)]


def attention_dtype(dtype: str) -> str:
    """The peak attention runs at: FP8 recipes run it in bf16 (module docstring)."""
    return stored(dtype)


def kv_width(dtype: str) -> int:
    """Bytes per KV-cache element: FP8 generation keeps the cache in FP8."""
    return FP8_BYTES if dtype == FP8 else DTYPE_BYTES[dtype]


def gemm_weight_width(dtype: str) -> int:
    """Bytes per weight a GEMM reads: FP8 GEMMs read the FP8 copies."""
    return FP8_BYTES if dtype == FP8 else DTYPE_BYTES[dtype]


def linear_weight_bytes(dtype: str, kind: str) -> float:
    """Bytes a Linear layer's parameter takes on a device: FP8 generation 1; FP8 training and inference
    the bf16 weight plus its FP8 copies; otherwise the dtype's width."""
    if dtype != FP8:
        return DTYPE_BYTES[dtype]
    if kind == TaskKind.GENERATION:
        return FP8_BYTES
    return DTYPE_BYTES[HALF] + FP8_WEIGHT_COPIES * FP8_BYTES


def require_fp8(precision: str | TaskPrecision, fp8_tflops: Mapping[str, float | None]) -> None:
    """Refuse an FP8 workload on a cluster none of whose GPU types (`fp8_tflops`: type -> its catalog
    figure) has FP8 units, naming the catalog field that is missing; where only some lack it, the
    planner refuses FP8 tasks on those (planner/replicas.py) and places them on the others."""
    kinds = uses_fp8(precision)
    if kinds and fp8_tflops and all(v is None for v in fp8_tflops.values()):
        name = sorted(fp8_tflops)[0]
        raise SpecError(None, f"gpus.{name}.fp8_tflops", f"a dense FP8 figure: the workload runs {', '.join(kinds)} "
                        f"in fp8 and no GPU type of the cluster ({', '.join(sorted(fp8_tflops))}) has FP8 tensor "
                        f"cores in the catalog; plan it in bf16 or on FP8 GPUs", None)
