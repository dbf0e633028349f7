"""The code each rank of the data-parallel training benchmark runs (importable, so `spawn` can start it).

Every rank times the same training step twice: alone (all ranks busy at once, no collectives)
and wrapped for data parallelism exactly as the executor wraps a replica
(`hetprof.runtime.dataparallel.wrap_replica`: DDP over gloo on the CPU, FSDP2 over NCCL on GPUs). A
data-parallel repeat's time is the slowest rank's (all-reduce MAX): every step ends in an
all-reduce that waits for it. A lone step's time is rank 0's own, as a task row measures it — so
the difference holds the wait for the slowest replica too, which no single-device row can see. The repeat count is fixed and agreed, never adaptive: a rank that stopped early
would leave its peers waiting in DDP's all-reduce.
"""

from __future__ import annotations

import gc
import time
from typing import Any

from hetprof.runtime.cpuslots import bind_to_slot
from hetprof.runtime.distributed import leave_process_group
from hetprof.runtime.hostmemory import keep_freed_memory
from hetprof.safety.processes import skip_teardown_at_exit


def worker(rank: int, world: int, init_method: str, backend: str, points: list[dict], warmup: int, repeats: int,
           threads: int, results: Any) -> None:
    """One rank: for every point ({task_model, batch, seq_len}), put rows of both modes in `results` (rank 0)."""
    import torch
    import torch.distributed as dist

    keep_freed_memory()
    torch.set_num_threads(threads)
    cuda = backend == "nccl"
    if not cuda:  # each rank on its slot's core, as a run's data-parallel workers (cpuslots.py)
        bind_to_slot(rank, world)
    device = torch.device(f"cuda:{rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                            device_id=device if cuda else None)
    try:
        rows = [_one_point(dist, torch, p, device, warmup, repeats) for p in points]
        if rank == 0:
            results.put(("ok", rows))
    except Exception as exc:  # report, so the parent raises a clear error instead of hanging
        if rank == 0:
            results.put(("error", f"{type(exc).__name__}: {exc}"))
        raise
    leave_process_group()  # on success only: after a failure a peer may be gone, and the process exits
    skip_teardown_at_exit()


def _one_point(dist: Any, torch: Any, point: dict, device: Any, warmup: int, repeats: int) -> dict:
    from hetprof.profiler import taskmodels
    from hetprof.profiler.suites.tasks import train_step
    from hetprof.runtime.dataparallel import wrap_replica

    tm = point["task_model"]
    gen = torch.Generator().manual_seed(dist.get_rank())
    x = taskmodels.inputs(tm, point["batch"], point["seq_len"], device, gen)
    out = {"grad_bytes": 0, "plain": [], "dp": []}
    for mode in ("plain", "dp"):
        model = taskmodels.build(tm, device, seed=0)  # same weights on every rank, as replicas start
        model.train()
        if not tm.with_head:  # blocks fed embeddings: the table gets no gradient, and DDP would wait for one
            model.get_input_embeddings().requires_grad_(False)
        out["grad_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
        if mode == "dp":
            model = wrap_replica(model, None, device)
        out[mode] = _time(dist, torch, train_step(model, tm, x), device, warmup, repeats, slowest=mode == "dp")
        del model
        gc.collect()  # DDP's reducer sits in reference cycles; it must go before its process group does
    return out


def _time(dist: Any, torch: Any, step: Any, device: Any, warmup: int, repeats: int, slowest: bool) -> list[float]:
    """Seconds per repeat: the slowest rank's (`slowest`), else rank 0's own."""
    cuda = device.type == "cuda"
    times = []
    for i in range(warmup + repeats):
        dist.barrier()
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    out = torch.tensor(times, dtype=torch.float64, device=device)
    if slowest:
        dist.all_reduce(out, op=dist.ReduceOp.MAX)
    return [float(t) for t in out.cpu()]
