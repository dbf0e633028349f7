"""All-reduce, all-gather and broadcast among local devices, one process per rank.

Real processes and a real torch.distributed backend (NCCL on GPUs, gloo on the CPU) — the path the
executor takes — so the rows carry the library's own overheads. algbw = S / t and busbw = algbw ×
the nccl-tests factor (all-reduce 2(n-1)/n, all-gather (n-1)/n, broadcast 1), with S the full
message (for all-gather the gathered output, each rank contributing S / n).
"""

from __future__ import annotations

import statistics

from hetprof.errors import ExecutionError
from hetprof.profiler.collective_worker import bus_factor, worker
from hetprof.profiler.context import ProfileContext
from hetprof.profiler.registry import Suite, register_suite
from hetprof.runtime.distributed import file_init_method
from hetprof.safety.processes import isolated_children

OPS = ["all_reduce", "all_gather", "broadcast"]
KiB, MiB, GiB = 1024, 1024**2, 1024**3


def sizes_for(cuda: bool, quick: bool, max_bytes: int | None = None) -> list[int]:
    """Message sizes: 4 KiB up to 1 GiB on GPUs, 64 MiB on the CPU (fewer with --quick), capped at max_bytes."""
    if max_bytes:
        return [s for s in sizes_for(cuda, quick) if s <= max_bytes] or [min(sizes_for(cuda, quick))]
    if cuda:
        return [64 * KiB * 16**i for i in range(4)] if quick else [4 * KiB * 4**i for i in range(9)]  # ..1 GiB
    return [4 * KiB * 16**i for i in range(4)] if quick else [4 * KiB * 4**i for i in range(8)]  # ..64 MiB


def worlds_for(ctx: ProfileContext) -> list[int]:
    asked = ctx.options.get("worlds")
    gpus = [d for d in ctx.devices if d != "cpu"]
    if gpus:
        n = len(gpus)
        return [] if n < 2 else sorted({2, n} if not asked else {w for w in asked if 2 <= w <= n})
    return list(asked or [2, 4])


def run_world(world: int, backend: str, sizes: list[int], *, warmup: int, repeats: int, threads: int,
              ops: list[str] = OPS, timeout_s: float = 600.0) -> list[tuple[str, int, list[float]]]:
    """Spawn `world` ranks and return [(op, size_bytes, [seconds per repeat]), ...] from rank 0."""
    import queue

    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    init = file_init_method()  # a file store: no port to race for
    with isolated_children():  # the ranks and the resource tracker start isolated from the current folder
        results = ctx.Queue()
        procs = mp.start_processes(worker, args=(world, init, backend, ops, sizes, warmup, repeats, threads, results),
                                   nprocs=world, join=False, start_method="spawn")
    try:
        status, payload = results.get(timeout=timeout_s)
    except queue.Empty:
        raise ExecutionError(f"collectives among {world} {backend} processes timed out after {timeout_s:.0f} s") \
            from None
    finally:
        try:
            while not procs.join(timeout=30):
                pass
        except Exception as exc:  # a rank died: say which and why
            raise ExecutionError(f"collectives among {world} {backend} processes failed: {exc}") from None
    if status != "ok":
        raise ExecutionError(f"collectives among {world} {backend} processes failed: {payload}")
    return payload


@register_suite
class CollectivesSuite(Suite):
    name = "collectives"
    scope = "host"
    help = "all_reduce / all_gather / broadcast among local processes (gloo) or GPUs (NCCL)"

    def steps(self, ctx: ProfileContext) -> int:
        return len(worlds_for(ctx))

    def run(self, ctx: ProfileContext) -> None:
        gpus = [d for d in ctx.devices if d != "cpu"]
        backend = "nccl" if gpus else "gloo"
        worlds = worlds_for(ctx)
        if not worlds:
            ctx.note("collectives: fewer than 2 local GPUs, nothing to measure")
            return
        policy = ctx.policy
        for world in worlds:
            sizes = sizes_for(bool(gpus), ctx.quick, ctx.options.get("collective_max_bytes"))
            rows = run_world(world, backend, sizes, warmup=policy.warmup,
                             repeats=min(policy.repeats, 10), threads=ctx.threads)
            for op in OPS:
                factor = bus_factor(op, world)
                samples = [{"params": {"backend": backend, "world": world, "size_bytes": size},
                            "metrics": {"seconds": t, "algbw_Bps": size / t, "busbw_Bps": size / t * factor}}
                           for o, size, times in rows if o == op for t in times]
                largest = max(size for o, size, _ in rows if o == op)
                top = statistics.median(s["metrics"]["busbw_Bps"] for s in samples
                                        if s["params"]["size_bytes"] == largest)
                ctx.record(f"collective.{op}", {"backend": backend, "world": world}, samples,
                           f"{backend} ×{world}: busbw {top / 1e9:.3g} GB/s at {largest / MiB:.0f} MiB")
            ctx.advance(1)
