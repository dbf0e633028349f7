"""The executor bench's weight-sync row: the runtime's bucketed sync against a plain gloo broadcast of
the same bytes over the same group, alternated round by round."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from hetprof.executor.parallel.weightsync import DEFAULT_BUCKET_MB, WeightSync, copy_into, flatten_params
from hetprof.runtime.distributed import file_init_method, leave_process_group


# ---- 3: weight sync vs plain broadcast ------------------------------------------------------
def sync_model(total_mb: float) -> nn.Module:
    """Transformer-like parameter shapes: big matrices and many small norm vectors."""
    hidden = 512
    per_layer = 4 * hidden * hidden * 4 + 2 * hidden * 4  # bytes of 4 matrices + 2 norms
    layers = max(1, int(total_mb * 1e6 // per_layer))
    blocks = []
    for _ in range(layers):
        blocks += [nn.Linear(hidden, hidden, bias=False) for _ in range(4)]
        blocks += [nn.LayerNorm(hidden, bias=False), nn.LayerNorm(hidden, bias=False)]
    return nn.Sequential(*blocks)


def _sync_worker(rank: int, world: int, init: str, total_mb: float, repeats: int, out: str,
                 bucket_mb: float) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    _sync_rounds(rank, world, total_mb, repeats, out, bucket_mb)
    leave_process_group()


def _sync_rounds(rank: int, world: int, total_mb: float, repeats: int, out: str, bucket_mb: float) -> None:
    torch.manual_seed(rank)
    model = sync_model(total_mb)
    flatten_params(model, bucket_mb)  # as the runtime lays out trainer and generator models
    group = dist.new_group(list(range(world)))
    sync = WeightSync(group, 0, model.named_parameters(), bucket_mb=bucket_mb)
    # The baseline sends the same bytes from memory as real as the weights': a buffer never written
    # is the kernel's shared zero page on the sender, read from cache, and would make the plain
    # broadcast look faster than any broadcast of real data.
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    apply = copy_into(model)
    times: dict[str, list[float]] = {"sync": [], "plain": []}
    for i in range(repeats + 1):  # the first round warms up connections and allocations
        for kind in (("sync", "plain") if i % 2 == 0 else ("plain", "sync")):  # alternate the order
            dist.barrier(group)
            t0 = time.perf_counter()
            if kind == "plain":
                dist.broadcast(flat, 0, group=group)
            elif rank == 0:
                sync.send(model.named_parameters(), i)
            else:
                sync.receive(apply, target=model)
            dist.barrier(group)  # done when the slowest receiver is done
            if i:
                times[kind].append(time.perf_counter() - t0)
    if rank == 0:
        Path(out).write_text(json.dumps({"bytes": sync.total_bytes, "buckets": len(sync.buckets), **times}))


SYNC_WORLD = 3  # one sender, two receivers


def sync_bandwidth(total_mb: float, repeats: int, work: Path, bucket_mb: float = DEFAULT_BUCKET_MB,
                   world: int | None = None) -> dict:
    out = work / "sync.json"
    world = world or SYNC_WORLD
    mp.spawn(_sync_worker, args=(world, file_init_method(work), total_mb, repeats, str(out), bucket_mb), nprocs=world, join=True)
    data = json.loads(out.read_text())
    sync_bw = data["bytes"] / statistics.median(data["sync"])
    plain_bw = data["bytes"] / statistics.median(data["plain"])
    return {"bytes": data["bytes"], "buckets": data["buckets"], "sync_Bps": sync_bw, "plain_Bps": plain_bw,
            "world": world}
