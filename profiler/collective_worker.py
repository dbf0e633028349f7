"""The code each collective-benchmark process runs (importable, so `spawn` can start it).

Timing follows nccl-tests: warm up, then time a batch of back-to-back operations per repeat; a
repeat's time is the slowest rank's (an all-reduce of the per-rank times with MAX), since a
collective is done only when every rank is done. The batch length is agreed on by all ranks from a
probe, so small messages are timed over many operations and large ones over a few.
"""

from __future__ import annotations

import time
from typing import Any

from hetprof.runtime.distributed import leave_process_group
from hetprof.safety.processes import skip_teardown_at_exit

# bus-bandwidth factors of nccl-tests: what each rank's link must carry relative to S / t
BUS_FACTORS = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "all_to_all": lambda n: (n - 1) / n,  # S is what each rank sends; 1/n of it stays on the rank
}
TARGET_REPEAT_S = 0.01


def bus_factor(op: str, world: int) -> float:
    return BUS_FACTORS[op](world)


def _op(dist: Any, op: str, buf: Any, out: Any, parts: list | None):
    if op == "all_reduce":
        return lambda: dist.all_reduce(buf)
    if op == "broadcast":
        return lambda: dist.broadcast(buf, src=0)
    if op == "all_to_all":
        return lambda: dist.all_to_all_single(out, buf)
    if parts is not None:
        return lambda: dist.all_gather(parts, buf)
    return lambda: dist.all_gather_into_tensor(out, buf)


def worker(rank: int, world: int, init_method: str, backend: str, ops: list[str], sizes: list[int],
           warmup: int, repeats: int, threads: int, results: Any) -> None:
    """One rank: run every (op, size) and, on rank 0, put [(op, size, [seconds...]), ...] in `results`."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    cuda = backend == "nccl"
    device = torch.device(f"cuda:{rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                            device_id=device if cuda else None)
    try:
        out_rows = []
        for op in ops:
            verify(dist, torch, op, world, device)
            for size in sizes:
                out_rows.append((op, size, _time_one(dist, torch, op, size, world, device, warmup, repeats)))
        if rank == 0:
            results.put(("ok", out_rows))
    except Exception as exc:  # report, so the parent raises a clear error instead of hanging
        if rank == 0:
            results.put(("error", f"{type(exc).__name__}: {exc}"))
        raise
    leave_process_group()  # on success only: after a failure a peer may be gone, and the process exits
    skip_teardown_at_exit()


def verify(dist, torch, op: str, world: int, device) -> None:
    """Check the collective computes the right thing among `world` ranks before timing it."""
    rank = dist.get_rank()
    x = torch.full((world * 4,), float(rank + 1), device=device)
    if op == "all_reduce":
        dist.all_reduce(x)
        want = torch.full_like(x, world * (world + 1) / 2)
    elif op == "broadcast":
        dist.broadcast(x, src=0)
        want = torch.ones_like(x)
    elif op == "all_to_all":  # rank r's chunk j goes to rank j: every rank receives chunk j from rank j
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x)
        x = out
        want = torch.arange(1, world + 1, device=device, dtype=x.dtype).repeat_interleave(4)
    else:
        parts = [torch.empty(4, device=device) for _ in range(world)]
        dist.all_gather(parts, x[:4].contiguous())
        x = torch.cat(parts)
        want = torch.arange(1, world + 1, device=device, dtype=x.dtype).repeat_interleave(4)
    if not torch.equal(x, want):
        raise RuntimeError(f"{op} among {world} ranks returned wrong values on rank {rank}")


def _time_one(dist, torch, op: str, size: int, world: int, device, warmup: int, repeats: int) -> list[float]:
    elems = max(world, size // 4)
    elems -= elems % world  # all-gather splits the message evenly
    out, parts = None, None
    if op == "all_gather":
        buf = torch.rand(elems // world, device=device).add_(0.5)
        out = torch.empty(elems, device=device)
        if device.type == "cpu":
            parts = list(out.chunk(world))
    else:
        buf = torch.rand(elems, device=device).add_(0.5)
        if op == "all_to_all":
            out = torch.empty_like(buf)
    fn = _op(dist, op, buf, out, parts)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    probe = _timed(fn, sync, 1)
    agreed = torch.tensor([probe], dtype=torch.float64, device=device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
    iters = int(min(200, max(1, TARGET_REPEAT_S / max(float(agreed.item()), 1e-7))))
    times = []
    for _ in range(repeats):
        dist.barrier()
        t = torch.tensor([_timed(fn, sync, iters)], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        times.append(float(t.item()))
    return times


def _timed(fn, sync, iters: int) -> float:
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - start) / iters
