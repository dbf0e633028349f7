"""Mixture-of-experts layers at the job's shapes: the router, the grouped expert GEMMs, the all-to-all.

An MoE layer's routed experts run as a grouped GEMM whose groups have the rows routed to each expert
— a few in a decode step, thousands in training — far below the rows where a dense matmul reaches its
peak, so the catalog's matmul curve is a guess there (costmodels/moe.py). This suite times, for every
MoE model being profiled (`--models` or `--workload`), on every local device:

- `moe.router`: the gate matmul (tokens × hidden → experts), an fp32 softmax and the top-k with its
  weights renormalised, as Qwen3-MoE's and DeepSeek-V3's routers run it;
- `moe.experts`: `groups` experts' SwiGLU (gate-up GEMM, SiLU × up, down GEMM) as batched GEMMs over
  `rows` tokens each — the contiguous layout of a grouped GEMM with even groups — forward (no grad)
  and backward (data and weight gradients), over a sweep of rows per expert that spans decode and
  training plus the rows the workload's own shapes produce (tokens × top_k / experts);
- `moe.all_to_all`: one dispatch all-to-all of the job's hidden states among the local ranks
  (gloo processes on the CPU, NCCL on ≥ 2 GPUs; the combine is its mirror), at a sweep of tokens per rank.

The suite is a host suite: devices are timed one after another, the all-to-all once over them all.
`hetprof fit` learns the grouped GEMM's time from the `moe.experts` rows (costmodels/moefit.py).
"""

from __future__ import annotations

import contextlib
import math
import statistics
from collections.abc import Callable
from typing import Any

from hetprof.profiler import devices as devmod
from hetprof.profiler.context import ProfileContext
from hetprof.profiler.registry import Suite, register_suite
from hetprof.profiler.suites.collectives import run_world, sizes_for, worlds_for
from hetprof.profiler.suites.tasks import default_dtype
from hetprof.profiler.timing import Flusher, Timed, measure, random_tensor
from hetprof.runtime.cpuslots import on_slot_core
from hetprof.specs.models import DTYPE_BYTES, ModelShape
from hetprof.specs.vocabulary import MoeBenchmark

TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
# Rows per expert swept on (device kind, quick?): powers of two from a decode step's one row to a
# training pass's thousands; a workload's own rows join them (`rows_for`).
ROWS = {("cpu", True): (1, 4, 16, 64, 256), ("cpu", False): tuple(2**i for i in range(11)),
        ("cuda", True): (1, 8, 64, 512, 4096), ("cuda", False): tuple(2**i for i in range(15))}
# Experts timed in one grouped GEMM: enough groups that per-group costs show, few enough that the
# largest rows fit in memory beside the weights (a rank holds experts / ep of them anyway).
GROUPS = {"cpu": 4, "cuda": 16}
PASSES = ("forward", "backward")
# Tokens per rank whose dispatch the all-to-all times, capped by the collectives' largest message.
A2A_TOKENS = {("cpu", True): (16, 256, 4096), ("cpu", False): (16, 64, 256, 1024, 4096, 16384),
              ("cuda", True): (64, 1024, 16384), ("cuda", False): (16, 128, 1024, 4096, 16384, 65536)}


def _kind(device: str) -> str:
    return "cpu" if device == "cpu" else "cuda"


def moe_models(models: list[ModelShape]) -> list[ModelShape]:
    """The MoE models among `models`, one per distinct expert shape (hidden, expert width, experts, top-k)."""
    out: dict[tuple[int, int, int, int], ModelShape] = {}
    for m in models:
        if m.moe is not None:
            out.setdefault((m.hidden, m.moe.expert_ffn, m.moe.experts, m.moe.top_k), m)
    return list(out.values())


def workload_rows(points: dict[str, list[tuple[int, ...]]], model: ModelShape) -> list[int]:
    """Rows per expert the workload's task points produce without expert parallelism: a decode step's
    batch, a prefill's or a training pass's batch × length tokens, each × top_k / experts."""
    assert model.moe is not None
    tokens = {p[0] for p in points.get("decode", [])}
    tokens |= {p[0] * p[1] for task in ("prefill", "train") for p in points.get(task, [])}
    return sorted({max(1, math.ceil(t * model.moe.top_k / model.moe.experts)) for t in tokens})


def rows_for(ctx: ProfileContext, device: str, model: ModelShape) -> list[int]:
    """The sweep of rows per expert: the device's grid plus the workload's rows within its range."""
    grid = ROWS[(_kind(device), ctx.quick)]
    extra = workload_rows(ctx.options.get("workload_points") or {}, model)
    return sorted({*grid, *(r for r in extra if r <= max(grid))})


def groups_for(device: str, model: ModelShape) -> int:
    assert model.moe is not None
    return min(model.moe.experts, GROUPS[_kind(device)])


def expert_call(groups: int, rows: int, hidden: int, ffn: int, dtype: str, device: Any, backward: bool) -> Timed:
    """One grouped SwiGLU expert pass: forward under no_grad, or the backward of a forward built untimed."""
    import torch

    tdtype = getattr(torch, TORCH_DTYPES[dtype])
    x = random_tensor((groups, rows, hidden), tdtype, device).requires_grad_(backward)
    gate_up = random_tensor((groups, hidden, 2 * ffn), tdtype, device).div_(hidden).requires_grad_(backward)
    down = random_tensor((groups, ffn, hidden), tdtype, device).div_(ffn).requires_grad_(backward)

    def forward() -> Any:
        g, u = torch.bmm(x, gate_up).chunk(2, dim=-1)
        return torch.bmm(torch.nn.functional.silu(g) * u, down)

    if not backward:
        def run() -> Any:
            with torch.no_grad():
                return forward()
        return Timed(run)
    state: dict[str, Any] = {}

    def setup() -> None:
        for t in (x, gate_up, down):
            t.grad = None
        state["y"] = forward()
        state["dy"] = torch.ones_like(state["y"])

    return Timed(lambda: state["y"].backward(state["dy"]), setup)


def router_call(tokens: int, model: ModelShape, dtype: str, device: Any) -> Timed:
    """Gate matmul, fp32 softmax, top-k and the renormalised top-k weights of `tokens` tokens."""
    import torch

    assert model.moe is not None
    tdtype = getattr(torch, TORCH_DTYPES[dtype])
    x = random_tensor((tokens, model.hidden), tdtype, device)
    gate = random_tensor((model.hidden, model.moe.experts), tdtype, device).div_(model.hidden)
    k = model.moe.top_k

    def run() -> Any:
        with torch.no_grad():
            probs = torch.softmax((x @ gate).float(), dim=-1)
            weights, chosen = torch.topk(probs, k, dim=-1)
            return weights / weights.sum(dim=-1, keepdim=True), chosen

    return Timed(run)


@register_suite
class MoeSuite(Suite):
    name = "moe"
    scope = "host"
    help = "MoE layers of the profiled MoE models: router, grouped expert GEMMs (fwd/bwd), dispatch all-to-all"

    def steps(self, ctx: ProfileContext) -> int:
        models = moe_models(ctx.models)
        per_device = sum(len(rows_for(ctx, d, m)) * (1 + len(PASSES)) for d in ctx.devices for m in models)
        return per_device + (len(worlds_for(ctx)) * len(models))

    def run(self, ctx: ProfileContext) -> None:
        """Every MoE model's layers on every local device, then its all-to-alls (a dense job: nothing)."""
        self.layers(ctx)
        self.all_to_alls(ctx)

    def layers(self, ctx: ProfileContext) -> None:
        """The router and grouped-expert rows of every MoE model, on each local device in turn."""
        dtype = ctx.options.get("dtype") or default_dtype(ctx.device)
        for device in ctx.devices if moe_models(ctx.models) else []:
            device_id = ctx.db.add_device(devmod.describe(device, ctx.host, ctx.threads))
            with _on_device(device, ctx.threads):
                for model in moe_models(ctx.models):
                    self._layers(ctx, device, device_id, model, dtype)

    def all_to_alls(self, ctx: ProfileContext) -> None:
        """The dispatch all-to-all rows of every MoE model among the local ranks."""
        dtype = ctx.options.get("dtype") or default_dtype(ctx.device)
        for model in moe_models(ctx.models):
            self._all_to_all(ctx, model, dtype)

    def _layers(self, ctx: ProfileContext, device: str, device_id: str, model: ModelShape, dtype: str) -> None:
        import torch

        assert model.moe is not None
        dev = torch.device(device)
        flush = Flusher(dev, cpu_caches=True)  # a layer runs after other layers' work, never its own repeat
        rows = rows_for(ctx, device, model)
        groups, ffn = groups_for(device, model), model.moe.expert_ffn
        shape = {"model": model.name, "hidden": model.hidden, "expert_ffn": ffn, "experts": model.moe.experts,
                 "top_k": model.moe.top_k, "dtype": dtype, "threads": ctx.threads}
        where = f"{device}: " if len(ctx.devices) > 1 else ""
        samples = []
        for r in rows:
            tokens = max(1, math.ceil(r * model.moe.experts / model.moe.top_k))
            times = _timed(ctx, f"{MoeBenchmark.ROUTER} {model.name} tokens={tokens}", dev, flush,
                           lambda t=tokens: router_call(t, model, dtype, dev))
            samples += [{"params": {**shape, "tokens": tokens}, "metrics": {"seconds": t}} for t in times]
        if samples:
            ctx.record(MoeBenchmark.ROUTER, {"model": model.name, "dtype": dtype, "threads": ctx.threads}, samples,
                       f"{where}{model.name}: {len(rows)} token counts, median {_median_ms(samples):.3f} ms",
                       device_id=device_id)
        samples = []
        for pass_ in PASSES:
            for r in rows:
                times = _timed(ctx, f"{MoeBenchmark.EXPERTS} {model.name} {pass_} rows={r}", dev, flush,
                               lambda r=r, b=pass_ == "backward": expert_call(groups, r, model.hidden, ffn, dtype, dev, b))
                params = {**shape, "groups": groups, "rows": r, "pass": pass_}
                samples += [{"params": params, "metrics": {"seconds": t}} for t in times]
        if samples:
            ctx.record(MoeBenchmark.EXPERTS, {"model": model.name, "dtype": dtype, "threads": ctx.threads}, samples,
                       f"{where}{model.name}: {groups} experts × {rows[0]}–{rows[-1]} rows, fwd+bwd",
                       device_id=device_id)

    def _all_to_all(self, ctx: ProfileContext, model: ModelShape, dtype: str) -> None:
        """Dispatch all-to-alls of this model's hidden states among 2..n local ranks (none on one GPU)."""
        assert model.moe is not None
        gpus = [d for d in ctx.devices if d != "cpu"]
        backend = "nccl" if gpus else "gloo"
        worlds = worlds_for(ctx)
        if not worlds:
            ctx.note("moe: fewer than 2 local GPUs, no all-to-all to measure")
            return
        per_token = model.hidden * DTYPE_BYTES[dtype] * model.moe.top_k  # a token's hidden state to each of its experts
        cap = max(sizes_for(bool(gpus), ctx.quick, ctx.options.get("collective_max_bytes")))
        tokens = [t for t in A2A_TOKENS[(_kind(ctx.device), ctx.quick)] if t * per_token <= cap] or [1]
        policy = ctx.policy
        for world in worlds:
            sizes = [t * per_token for t in tokens]
            timed = run_world(world, backend, sizes, warmup=policy.warmup, repeats=min(policy.repeats, 10),
                              threads=ctx.threads, ops=["all_to_all"])
            by_size = {size: times for _, size, times in timed}
            samples = [{"params": {"model": model.name, "backend": backend, "world": world, "size_bytes": size,
                                   "tokens": t, "hidden": model.hidden, "top_k": model.moe.top_k, "dtype": dtype},
                        "metrics": {"seconds": s, "algbw_Bps": size / s}}
                       for t, size in zip(tokens, sizes, strict=True) for s in by_size[size]]
            ctx.record(MoeBenchmark.ALL_TO_ALL, {"model": model.name, "backend": backend, "world": world}, samples,
                       f"{model.name} {backend} ×{world}: {tokens[-1]} tokens in {_median_ms(samples[-1:]):.3f} ms")
            ctx.advance(1)


def _timed(ctx: ProfileContext, label: str, dev: Any, flush: Flusher, build: Callable[[], Timed]) -> list[float]:
    """One point's repeats; a point that does not fit in the device's memory gets none and a note."""
    import torch

    try:
        call = build()
        return measure(call.fn, dev, ctx.policy, setup=call.setup, flush=flush)
    except torch.OutOfMemoryError:
        ctx.note(f"{label}: out of memory, skipped")
        torch.cuda.empty_cache()
        return []
    finally:
        ctx.advance(1)


@contextlib.contextmanager
def _on_device(device: str, threads: int):
    """The device's timing conditions: on the CPU `threads` threads on one slot's core, as the tasks
    suite times a CPU worker slot (the threads are given back after); on a GPU, that GPU current."""
    import torch

    if device == "cpu":
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            with on_slot_core(0, 1):
                yield
        finally:
            torch.set_num_threads(before)
        return
    with torch.cuda.device(torch.device(device)):
        yield


def _median_ms(samples: list[dict]) -> float:
    return statistics.median(s["metrics"]["seconds"] for s in samples) * 1e3
