"""Timing kernels the way careful GPU benchmarks do: warm up, time each repeat, keep every sample.

Why a module of its own: every suite needs the same discipline (DESIGN §3, after nccl-tests and
mamf-finder). On a GPU the host clock measures launch overhead, not the kernel, so repeats are
timed with CUDA events; the L2 cache is flushed between repeats so a small operand cannot be read
from cache and look faster than memory allows. On the CPU a monotonic clock is right; the RL task
rows evict the core's own caches between repeats (a run's pass follows other work), and the other
suites' operands are either compute-bound or sized well above the last-level cache.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any

from hetprof.profiler.hostinfo import core_cache_bytes


@dataclasses.dataclass(frozen=True)
class TimingPolicy:
    """How hard to try: a quick profile trades repeats for wall time, never warm-ups for speed."""

    warmup: int = 3
    repeats: int = 20
    min_repeats: int = 3
    max_seconds: float = 2.0  # stop adding repeats after this much timed work (keeps huge shapes bounded)

    @classmethod
    def quick(cls) -> TimingPolicy:
        return cls(warmup=2, repeats=7, min_repeats=3, max_seconds=0.5)


class Flusher:
    """Evicts the GPU's L2 cache by overwriting a buffer twice its size; on the CPU, with
    `cpu_caches`, the core's private caches (twice the largest per-core cache), else nothing.

    Why on the CPU: a run executes a pass once, between other tasks that fill the core's caches with
    their own weights and activations, while a tight loop of repeats finds the previous repeat's
    data still cached — a small model's pass then times faster than the run ever sees it.
    """

    def __init__(self, device: Any, cpu_caches: bool = False):
        import torch

        self.buffer = None
        if getattr(device, "type", str(device)).startswith("cuda"):
            props = torch.cuda.get_device_properties(device)
            size = max(int(getattr(props, "L2_cache_size", 0)) * 2, 64 * 1024 * 1024)
            self.buffer = torch.empty(size // 4, dtype=torch.float32, device=device)
        elif cpu_caches:
            self.buffer = torch.empty(2 * core_cache_bytes() // 4, dtype=torch.float32)

    def __call__(self) -> None:
        if self.buffer is not None:
            self.buffer.fill_(1.0)


@dataclasses.dataclass(frozen=True)
class Timed:
    """One call to time: `setup` runs untimed before every call, `flush` (if any) right before it."""

    fn: Callable[[], Any]
    setup: Callable[[], Any] | None = None
    flush: Flusher | None = None


def measure(fn: Callable[[], Any], device: Any, policy: TimingPolicy, *,
            setup: Callable[[], Any] | None = None, flush: Flusher | None = None) -> list[float]:
    """Seconds of each timed call of `fn` after warm-ups; `setup` runs untimed before every call."""
    return measure_round_robin([Timed(fn, setup, flush)], device, policy)[0]


def measure_round_robin(calls: list[Timed], device: Any, policy: TimingPolicy) -> list[list[float]]:
    """Seconds of each call's timed repeats, taken in turns: every repeat of a call follows one repeat
    of each other call still being timed, each call stopping on its own repeat and time budget.

    Why turns: a run makes each task's call once an iteration, after the other tasks' work, and on a
    shared CPU a call's cost grows with the time since it last ran, whatever filled that time
    (DESIGN §10); repeats back to back time it faster than any run reaches it.
    """
    is_cuda = getattr(device, "type", str(device)).startswith("cuda")
    for _ in range(policy.warmup):
        for call in calls:
            if call.setup is not None:
                call.setup()
            call.fn()
    if is_cuda:
        import torch

        torch.cuda.synchronize(device)
    samples: list[list[float]] = [[] for _ in calls]
    spent = [0.0] * len(calls)
    active = list(range(len(calls)))
    while active:
        for i in active:
            samples[i].append(_time_once(calls[i], device, is_cuda))
            spent[i] += samples[i][-1]
        active = [i for i in active if len(samples[i]) < policy.repeats
                  and not (spent[i] > policy.max_seconds and len(samples[i]) >= policy.min_repeats)]
    return samples


def _time_once(call: Timed, device: Any, is_cuda: bool) -> float:
    if call.setup is not None:
        call.setup()
    if call.flush is not None:
        call.flush()
    if is_cuda:
        return _cuda_time(call.fn, device)
    start = time.perf_counter()
    call.fn()
    return time.perf_counter() - start


def _cuda_time(fn: Callable[[], Any], device: Any) -> float:
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.device(device):
        start.record()
        fn()
        end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def median(values: list[float]) -> float:
    return statistics.median(values)


def random_tensor(shape: tuple[int, ...], dtype: Any, device: Any) -> Any:
    """Uniform in [0.5, 1.5): never zero, so no hardware shortcut on zeros can flatter a timing."""
    import torch

    return torch.rand(shape, dtype=dtype, device=device).add_(0.5)
