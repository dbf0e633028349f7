"""Matmul throughput over a sweep of shapes per dtype: what a device's tensor cores really deliver.

Why a sweep and not one big square: achieved TFLOP/s depends on shape (tile quantisation, wave
quantisation), and LLM kernels are rarely square; the best shape is the device's practical peak
(what mamf-finder reports), the median is what a typical kernel gets. Every repeat is a sample.
"""

from __future__ import annotations

import statistics

from hetprof.profiler.context import ProfileContext
from hetprof.profiler.registry import Suite, register_suite
from hetprof.profiler.timing import Flusher, measure, random_tensor

TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}

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


def dtypes_for(device: str) -> list[str]:
    """fp32 only on the CPU (half-precision CPU matmuls are emulated and say nothing useful)."""
    return ["fp32"] if device == "cpu" else ["bf16", "fp16", "fp32"]


def shapes_for(device: str, quick: bool) -> list[tuple[int, int, int]]:
    return SHAPES[("cpu" if device == "cpu" else "cuda", quick)]


@register_suite
class ComputeSuite(Suite):
    name = "compute"
    help = "matmul TFLOP/s over shapes per dtype (best and median)"

    def steps(self, ctx: ProfileContext) -> int:
        return len(dtypes_for(ctx.device)) * len(shapes_for(ctx.device, ctx.quick))

    def run(self, ctx: ProfileContext) -> None:
        import torch

        device = torch.device(ctx.device)
        flush = Flusher(device)
        for dtype in dtypes_for(ctx.device):
            tdtype = getattr(torch, TORCH_DTYPES[dtype])
            if device.type == "cuda" and dtype == "fp32":
                torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32, not TF32
            samples = []
            for m, n, k in shapes_for(ctx.device, ctx.quick):
                try:
                    a = random_tensor((m, k), tdtype, device)
                    b = random_tensor((k, n), tdtype, device)
                    c = torch.empty((m, n), dtype=tdtype, device=device)
                except torch.OutOfMemoryError:
                    ctx.note(f"compute.matmul {dtype} {m}x{n}x{k}: out of memory, skipped")
                    ctx.advance(1)
                    continue
                flops = 2.0 * m * n * k
                for t in measure(lambda a=a, b=b, c=c: torch.matmul(a, b, out=c), device, ctx.policy,
                                 flush=flush):
                    samples.append({"params": {"m": m, "n": n, "k": k, "dtype": dtype, "threads": ctx.threads},
                                    "metrics": {"seconds": t, "tflops": flops / t / 1e12}})
                del a, b, c
                ctx.advance(1)
            if samples:
                tf = [s["metrics"]["tflops"] for s in samples]
                ctx.record("compute.matmul", {"dtype": dtype, "threads": ctx.threads}, samples,
                           f"{dtype}: best {max(tf):.3g} TFLOP/s, median {statistics.median(tf):.3g}")
