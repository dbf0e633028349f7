"""Keep freed host memory mapped, so a tensor's memory is not faulted in afresh on every call.

glibc's malloc hands blocks above its mmap threshold (128 KiB at start, adapting up to 32 MiB) to the
kernel on free, and trims the heap's free top whenever it exceeds twice that. A CPU worker that
alternates training and generation frees megabytes between phases, so the next prefill
page-faults its activations back in and runs slower than the same prefill in the profiler's tight
loop (where the threshold had adapted and nothing was returned). Rule: pin the thresholds in every
process that times or runs kernels. Why: a run's kernels then cost what the profiler measured
(docs/DESIGN.md §10 says why and which bench measures it).

The profiler and the executor both call `keep_freed_memory()` at process start, so the kernels the
profiler times and the kernels a run executes see the same allocator. The price is that a process
keeps its peak heap: what an RL worker reuses every iteration anyway. Other C libraries (musl,
macOS) have no such knobs and are left as they are.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 * 1024 * 1024  # glibc's upper limit on 64-bit systems
TRIM_THRESHOLD = 1 << 30


@functools.cache
def keep_freed_memory() -> bool:
    """Pin glibc's mmap and trim thresholds for this process; True where the C library took them."""
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc: nothing to tune
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
