"""What data parallelism adds to a training step: the same step timed alone and as a replica.

A planner that prices a data-parallel step as "compute + one ring all-reduce of the gradients"
misses what the data-parallel wrapper really costs: hooks and gradient buckets, the points where
every replica waits for the slowest, the communication threads competing with compute on a CPU
slot, or (on GPUs) the part of the all-reduce that overlaps the backward pass. This suite measures
it instead of modelling it: `world` processes run the executor's training step at once, first each
alone, then wrapped as the executor wraps replicas (DDP over gloo on the CPU, FSDP2 over NCCL on
GPUs), for models of a few sizes so the cost can be told apart per byte of gradient and per step.
The cost models read the difference back (`costmodels/calibration.py`, `dp_step`).
"""

from __future__ import annotations

import os
import statistics

from hetprof.errors import ExecutionError
from hetprof.profiler import taskmodels
from hetprof.profiler.context import ProfileContext
from hetprof.profiler.registry import Suite, register_suite
from hetprof.profiler.suites.tasks import default_dtype
from hetprof.runtime.distributed import file_init_method
from hetprof.safety.processes import isolated_children

BENCHMARK = "dp.train_step"
# one step's shape per device kind: big enough that the backward pass is real work, small enough to be quick
SHAPES = {"cpu": (8, 64), "cuda": (4, 512)}
LAYER_COUNTS = (1, 2, 4)


def worlds_for(ctx: ProfileContext) -> list[int]:
    """CPU: worlds that fit one core per rank (a cpu slot is a core); GPUs: 2 and all local GPUs."""
    asked = ctx.options.get("worlds")
    gpus = [d for d in ctx.devices if d != "cpu"]
    if gpus:
        n = len(gpus)
        return [] if n < 2 else sorted({2, n} if not asked else {w for w in asked if 2 <= w <= n})
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return sorted({w for w in (asked or [2]) if 2 <= w <= cores})


def task_models(ctx: ProfileContext, dtype: str) -> list[taskmodels.TaskModel]:
    """Each profiled model at a few depths, so gradient bytes vary by at least 2× per model."""
    out = []
    for shape in ctx.models:
        for n in sorted({min(shape.layers, c) for c in LAYER_COUNTS}):
            out.append(taskmodels.plan_model(shape, dtype, n))
    return out


def run_world(world: int, backend: str, points: list[dict], *, warmup: int, repeats: int, threads: int,
              timeout_s: float = 600.0) -> list[dict]:
    """Spawn `world` ranks; per point {grad_bytes, plain: rank 0's [s], dp: the slowest rank's [s]}."""
    import queue

    import torch.multiprocessing as mp

    from hetprof.profiler.dp_worker import worker

    ctx = mp.get_context("spawn")
    init = file_init_method()  # a file store: no port to race for
    with isolated_children():  # the ranks and the resource tracker start isolated from the current folder
        results = ctx.Queue()
        procs = mp.start_processes(worker, args=(world, init, backend, points, warmup, repeats, threads, results),
                                   nprocs=world, join=False, start_method="spawn")
    try:
        status, payload = results.get(timeout=timeout_s)
    except queue.Empty:
        raise ExecutionError(f"data-parallel training among {world} {backend} processes timed out after "
                             f"{timeout_s:.0f} s") from None
    finally:
        try:
            while not procs.join(timeout=30):
                pass
        except Exception as exc:  # a rank died: say which and why
            raise ExecutionError(f"data-parallel training among {world} {backend} processes failed: {exc}") from None
    if status != "ok":
        raise ExecutionError(f"data-parallel training among {world} {backend} processes failed: {payload}")
    return payload


def workload_points(ctx: ProfileContext, tms: list[taskmodels.TaskModel]) -> list[dict]:
    """The training steps of the workload being profiled for (`--workload`), on each model's deepest
    profiled build.

    What data parallelism adds is not a constant: a replica waits for the slowest at every step's
    all-reduce, and that wait grows with the step, so the job's own steps are measured next to the
    generic ones (docs/DESIGN.md §10 says why and which bench measures it).
    """
    extra = (ctx.options.get("workload_points") or {}).get("train", [])
    deepest: dict[str, taskmodels.TaskModel] = {}
    for tm in tms:  # each model at the most layers profiled (whole for small presets)
        if tm.shape.name not in deepest or tm.layers_run > deepest[tm.shape.name].layers_run:
            deepest[tm.shape.name] = tm
    return [{"task_model": tm, "batch": b, "seq_len": n} for tm in deepest.values() for b, n in extra
            if n + 1 <= tm.shape.max_position]


@register_suite
class DataParallelTrainSuite(Suite):
    name = "dptrain"
    scope = "host"
    help = "a training step alone vs as a data-parallel replica (DDP/gloo on CPU, FSDP2/NCCL on GPUs)"

    def steps(self, ctx: ProfileContext) -> int:
        return len(worlds_for(ctx))

    def run(self, ctx: ProfileContext) -> None:
        gpus = [d for d in ctx.devices if d != "cpu"]
        kind = "cuda" if gpus else "cpu"
        backend = "nccl" if gpus else "gloo"
        worlds = worlds_for(ctx)
        if not worlds:
            ctx.note("dptrain: fewer than 2 local GPUs (or CPU cores), nothing to measure")
            return
        dtype = ctx.options.get("dtype") or default_dtype(kind)
        batch, seq = SHAPES[kind]
        tms = task_models(ctx, dtype)
        points = [{"task_model": tm, "batch": batch, "seq_len": min(seq, tm.shape.max_position - 1)} for tm in tms]
        points += workload_points(ctx, tms)
        policy = ctx.policy
        for world in worlds:
            rows = run_world(world, backend, points, warmup=policy.warmup, repeats=min(policy.repeats, 10),
                             threads=ctx.threads)
            samples = []
            for point, row in zip(points, rows, strict=True):
                tm = point["task_model"]
                params = {**tm.shape_params(), "backend": backend, "world": world, "batch": point["batch"],
                          "seq_len": point["seq_len"], "grad_bytes": row["grad_bytes"], "threads": ctx.threads}
                samples += [{"params": {**params, "mode": mode}, "metrics": {"seconds": t}}
                            for mode in ("plain", "dp") for t in row[mode]]
            added = [statistics.median(r["dp"]) - statistics.median(r["plain"]) for r in rows]
            ctx.record(BENCHMARK, {"backend": backend, "world": world, "dtype": dtype, "threads": ctx.threads},
                       samples, f"{backend} ×{world}: data parallelism adds "
                       f"{statistics.median(added) * 1e3:.2f} ms per step (median of {len(rows)} models)")
            ctx.advance(1)
