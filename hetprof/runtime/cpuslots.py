"""A `cpu` slot of a cluster spec is one core: the process that works a slot stays on that core.

Rule: a run's worker on a `cpu` slot, the profiler process that times a slot's task rows, and each
rank of the profiler's data-parallel step run on the core their slot owns — the slot's index among
the host's slots, mapped onto the cores the process may use — when the host has a core for every
slot; with more slots than cores they share, and the OS places them. Why: left to the scheduler,
a run's data-parallel workers are moved between cores and at times stacked on one while another
process holds the other, and every step waits for the slowest replica, so a run cost more than
the rows that priced it, which one profiler process had timed with every other core free. Both
sides now time work on a core of their own (docs/DESIGN.md §10 says why and which bench measures it).

Threads a process starts after binding inherit its core (gloo's loops, vLLM's engine threads).
A helper thread of hetprof's own that shares a worker's core (the leader's record thread) runs at
the lowest CPU priority (`yield_to_work`), so it takes the core only while the worker's thread waits.
Platforms without `sched_setaffinity` (macOS) are left as they are.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator


def usable_cores() -> list[int]:
    """The cores this process may run on, in order."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def slot_core(local_rank: int | None = None) -> int:
    """The core a worker slot owns: its index among this host's workers (torchrun's LOCAL_RANK unless
    given), mapped onto the cores this process may run on."""
    cores = usable_cores()
    index = int(os.environ.get("LOCAL_RANK", "0")) if local_rank is None else local_rank
    return cores[index % len(cores)]


def binding_core(index: int, slots: int) -> int | None:
    """The core slot `index` of a host with `slots` slots is bound to; None when the host has fewer
    cores than slots (they share the cores, placed by the OS) or the platform cannot bind."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    if not 0 <= index < slots:
        raise ValueError(f"slot index {index} is not one of the host's {slots} slots")
    cores = usable_cores()
    return cores[index] if slots <= len(cores) else None


def bind_to_slot(index: int, slots: int) -> int | None:
    """Keep the calling thread, and the threads and processes it starts from now on, on slot
    `index`'s core (see the module's rule); the core, or None where it stays unbound."""
    core = binding_core(index, slots)
    if core is not None:
        os.sched_setaffinity(0, {core})
    return core


@contextlib.contextmanager
def on_slot_core(index: int, slots: int) -> Iterator[int | None]:
    """`bind_to_slot` for the length of a block; the calling thread's cores are given back after it."""
    before = usable_cores()
    core = bind_to_slot(index, slots)
    try:
        yield core
    finally:
        if core is not None:
            os.sched_setaffinity(0, before)


def yield_to_work() -> None:
    """Run the calling thread at the lowest CPU priority (nice 19), so it takes its core only while the
    process's working thread waits (module docstring). Linux keeps a nice value per thread; other
    platforms would lower the whole process, so there the thread is left as it is."""
    if sys.platform.startswith("linux"):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
