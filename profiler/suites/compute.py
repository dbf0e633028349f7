"""Matmul throughput over a sweep of shapes per dtype: what a device's tensor cores really deliver.

Why a sweep and not one big square: achieved TFLOP/s depends on shape (tile quantisation, wave
quantisation), and LLM kernels are rarely square; the best shape is the device's practical peak
(what mamf-finder reports), the median is what a typical kernel gets. Every repeat is a sample.

fp8 is timed where the device has fp8 tensor cores (compute capability 8.9 and later: Ada, Hopper,
Blackwell) as the kernel fp8 training and inference run: e4m3 × e4m3 with per-tensor scales into
bf16 (`torch._scaled_mm`), the second operand column-major as that kernel requires.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from hetprof.profiler.context import ProfileContext
from hetprof.profiler.registry import Suite, register_suite
from hetprof.profiler.timing import Flusher, measure, random_tensor

TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
FP8_MIN_CAPABILITY = (8, 9)  # the first CUDA architecture with fp8 tensor cores (Ada)

# (m, n, k): squares plus transformer-like shapes (tokens × hidden → ffn and back)
SHAPES = {
    ("cpu", True): [(256, 256, 256), (512, 512, 512), (1024, 1024, 1024), (1024, 2048, 512)],
    ("cpu", False): [(256, 256, 256), (512, 512, 512), (768, 768, 768), (1024, 1024, 1024),
                     (1536, 1536, 1536), (2048, 2048, 2048), (2048, 3072, 1024), (2048, 1024, 3072)],
    ("cuda", True): [(4096, 4096, 4096), (8192, 8192, 8192), (8192, 12288, 4096)],
    ("cuda", False): [(1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096), (6144, 6144, 6144),
                      (8192, 8192, 8192), (12288, 12288, 12288), (16384, 16384, 16384),
                      (8192, 12288, 4096), (8192, 4096, 12288), (16384, 14336, 4096),
                      (16384, 4096, 14336), (4096, 28672, 8192)],
}


def dtypes_for(device: str, capability: tuple[int, int] | None = None) -> list[str]:
    """fp32 only on the CPU (half-precision CPU matmuls are emulated and say nothing useful); on a
    GPU bf16, fp16 and fp32, plus fp8 where its compute `capability` has fp8 tensor cores."""
    if device == "cpu":
        return ["fp32"]
    fp8 = ["fp8"] if capability is not None and tuple(capability) >= FP8_MIN_CAPABILITY else []
    return ["bf16", "fp16", *fp8, "fp32"]


def dense_matmul(m: int, n: int, k: int, dtype: str, device: Any) -> Callable[[], Any]:
    """C = A @ B in one dtype, into a preallocated C."""
    import torch

    tdtype = getattr(torch, TORCH_DTYPES[dtype])
    a = random_tensor((m, k), tdtype, device)
    b = random_tensor((k, n), tdtype, device)
    c = torch.empty((m, n), dtype=tdtype, device=device)
    return lambda: torch.matmul(a, b, out=c)


def fp8_matmul(m: int, n: int, k: int, dtype: str, device: Any) -> Callable[[], Any]:
    """e4m3 A (row-major) × e4m3 B (column-major) with per-tensor fp32 scales, out in bf16."""
    import torch

    a = random_tensor((m, k), torch.bfloat16, device).to(torch.float8_e4m3fn)
    b = random_tensor((n, k), torch.bfloat16, device).to(torch.float8_e4m3fn).t()
    scale_a = torch.ones((), dtype=torch.float32, device=device)
    scale_b = torch.ones((), dtype=torch.float32, device=device)
    return lambda: torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)


# dtype -> builder of the timed call for an (m, n, k) shape on a device
MATMULS: dict[str, Callable[..., Callable[[], Any]]] = {
    "bf16": dense_matmul, "fp16": dense_matmul, "fp32": dense_matmul, "fp8": fp8_matmul}


def capability_of(device: Any) -> tuple[int, int] | None:
    """The CUDA compute capability of `device` (None on the CPU)."""
    import torch

    return tuple(torch.cuda.get_device_capability(device)) if device.type == "cuda" else None


def shapes_for(device: str, quick: bool) -> list[tuple[int, int, int]]:
    return SHAPES[("cpu" if device == "cpu" else "cuda", quick)]


@register_suite
class ComputeSuite(Suite):
    name = "compute"
    help = "matmul TFLOP/s over shapes per dtype (best and median)"

    def steps(self, ctx: ProfileContext) -> int:
        import torch

        dtypes = dtypes_for(ctx.device, capability_of(torch.device(ctx.device)))
        return len(dtypes) * len(shapes_for(ctx.device, ctx.quick))

    def run(self, ctx: ProfileContext) -> None:
        import torch

        device = torch.device(ctx.device)
        flush = Flusher(device)
        for dtype in dtypes_for(ctx.device, capability_of(device)):
            if device.type == "cuda" and dtype == "fp32":
                torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32, not TF32
            samples = []
            for m, n, k in shapes_for(ctx.device, ctx.quick):
                try:
                    call = MATMULS[dtype](m, n, k, dtype, device)
                except torch.OutOfMemoryError:
                    ctx.note(f"compute.matmul {dtype} {m}x{n}x{k}: out of memory, skipped")
                    ctx.advance(1)
                    continue
                flops = 2.0 * m * n * k
                for t in measure(call, device, ctx.policy, flush=flush):
                    samples.append({"params": {"m": m, "n": n, "k": k, "dtype": dtype, "threads": ctx.threads},
                                    "metrics": {"seconds": t, "tflops": flops / t / 1e12}})
                del call
                ctx.advance(1)
            if samples:
                tf = [s["metrics"]["tflops"] for s in samples]
                ctx.record("compute.matmul", {"dtype": dtype, "threads": ctx.threads}, samples,
                           f"{dtype}: best {max(tf):.3g} TFLOP/s, median {statistics.median(tf):.3g}")
