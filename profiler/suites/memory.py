"""Device memory bandwidth by large copies, counting bytes read plus bytes written.

Sizes are kept well above the last-level cache (4× the CPU's LLC, or far above the GPU's L2), so
the copy streams from memory and not from cache; the best of the sweep is the practical peak.
"""

from __future__ import annotations

import statistics

from hetprof.profiler import hostinfo
from hetprof.profiler.context import ProfileContext
from hetprof.profiler.registry import Suite, register_suite
from hetprof.profiler.timing import Flusher, measure, random_tensor

MiB = 1024**2


def sizes_for(device: str, quick: bool) -> list[int]:
    if device == "cpu":
        llc = hostinfo.last_level_cache_bytes() or 32 * MiB
        base = max(64 * MiB, 4 * llc)
        return [base, 2 * base] if quick else [base, 2 * base, 4 * base, 8 * base]
    return [1024 * MiB, 2048 * MiB] if quick else [256 * MiB, 512 * MiB, 1024 * MiB, 2048 * MiB, 4096 * MiB]


@register_suite
class MemorySuite(Suite):
    name = "memory"
    help = "device-to-device copy bandwidth, bytes read + written (best and median)"

    def steps(self, ctx: ProfileContext) -> int:
        return len(sizes_for(ctx.device, ctx.quick))

    def run(self, ctx: ProfileContext) -> None:
        import torch

        device = torch.device(ctx.device)
        flush = Flusher(device)
        samples = []
        for size in sizes_for(ctx.device, ctx.quick):
            try:
                src = random_tensor((size // 4,), torch.float32, device)
                dst = torch.empty_like(src)
            except (torch.OutOfMemoryError, RuntimeError) as exc:
                ctx.note(f"memory.copy {size // MiB} MiB: cannot allocate ({type(exc).__name__}), skipped")
                ctx.advance(1)
                continue
            for t in measure(lambda src=src, dst=dst: dst.copy_(src), device, ctx.policy, flush=flush):
                samples.append({"params": {"size_bytes": size, "threads": ctx.threads},
                                "metrics": {"seconds": t, "bandwidth_Bps": 2.0 * size / t}})
            del src, dst
            ctx.advance(1)
        if samples:
            bw = [s["metrics"]["bandwidth_Bps"] for s in samples]
            ctx.record("memory.copy", {"threads": ctx.threads}, samples,
                       f"best {max(bw) / 1e9:.3g} GB/s, median {statistics.median(bw) / 1e9:.3g} GB/s")
