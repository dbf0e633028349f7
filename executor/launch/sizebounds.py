"""A run's sizes checked against this host before any worker starts.

The workload spec bounds each size on its own (`hetprof.specs.workload`); here they are bounded
together against what the host can hold: every step in flight keeps its sequences' tokens and the
per-token vectors training needs, and an async run keeps up to `staleness` steps ahead. A plan
that cannot fit is refused with the sizes that make it up, instead of failing in a worker minutes
later with a MemoryError.
"""

from __future__ import annotations

import os

from hetprof.errors import ExecutionError, HetprofError
from hetprof.specs import WorkloadSpec

BYTES_PER_TOKEN = 64  # token id and mask (int64) and ~12 float32 vectors (logprobs, values, advantages...)
MAX_ITERATIONS = 10**7
HOST_SHARE = 0.5  # of physical memory the step buffers may take; models, activations and the OS need the rest


def host_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):  # not reported on this system: no bound from it
        return 1 << 62


def step_bytes(workload: WorkloadSpec) -> int:
    """Host bytes one step's sequences hold: each padded to the longest prompt plus the longest response."""
    width = workload.prompt_len.cap + workload.response_len.cap
    return workload.sequences_per_step * width * BYTES_PER_TOKEN


def check_run_sizes(workload: WorkloadSpec, iterations: int, memory_bytes: int | None = None) -> None:
    """Refuse a run whose iterations or step buffers are beyond this host, naming the sizes."""
    if iterations > MAX_ITERATIONS:
        raise HetprofError(f"--iterations must be at most {MAX_ITERATIONS:,}, got {iterations:,}")
    memory = host_memory_bytes() if memory_bytes is None else memory_bytes
    in_flight = 1 + (workload.staleness if workload.mode == "async" else 0)
    need = in_flight * step_bytes(workload)
    if need > HOST_SHARE * memory:
        raise ExecutionError(
            f"workload too large for this host: {in_flight} step(s) in flight (staleness) × prompts_per_step "
            f"{workload.prompts_per_step} × responses_per_prompt {workload.responses_per_prompt} × "
            f"(prompt_len.max {workload.prompt_len.cap} + response_len.max {workload.response_len.cap}) tokens "
            f"need ~{need / 2**30:.1f} GiB of step buffers, more than {HOST_SHARE:.0%} of its "
            f"{memory / 2**30:.1f} GiB; lower one of them")
