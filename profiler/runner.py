"""Runs the chosen suites over the chosen devices, with progress bars, and collects the summary.

Device suites run once per device; with several GPUs (`--all-gpus`) each GPU gets its own worker
process so independent GPUs are measured in parallel without one Python thread's launch overhead
disturbing another's timings. Host suites (collectives) then run once over all local devices, and
cluster suites (links) once across hosts.
"""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hetprof.profiler import devices as devmod
from hetprof.profiler.context import ProfileContext, SummaryRow
from hetprof.profiler.registry import Suite, suites_to_run
from hetprof.profiles import ProfileDB
from hetprof.runtime.hostmemory import keep_freed_memory
from hetprof.safety.processes import isolated_children
from hetprof.specs.models import ModelShape


@dataclasses.dataclass
class ProfileOptions:
    db_path: Path
    suites: list[str] | None = None
    devices: tuple[str, ...] = ()
    all_gpus: bool = False
    quick: bool = False
    models: list[ModelShape] = dataclasses.field(default_factory=list)
    threads: int = 1
    host: str = dataclasses.field(default_factory=socket.gethostname)
    options: dict[str, Any] = dataclasses.field(default_factory=dict)


ProgressFactory = Callable[[str, int], Callable[[int], None]]  # (label, total) -> advance(n)


def _no_progress(label: str, total: int) -> Callable[[int], None]:
    return lambda n=1: None


def run_profile(opts: ProfileOptions, progress: ProgressFactory = _no_progress,
                note: Callable[[str], None] = lambda text: None) -> list[SummaryRow]:
    """Profile this host as `opts` asks; every result is in the database when this returns."""
    suites = suites_to_run(opts.suites)
    devices = devmod.select_devices(opts.devices, opts.all_gpus)
    summary: list[SummaryRow] = []
    device_suites = [s for s in suites if s.scope == "device"]
    cuda = [d for d in devices if d != "cpu"]
    if device_suites and len(cuda) > 1:
        summary += _parallel_devices(opts, device_suites, devices, progress, note)
    elif device_suites:
        for device in devices:
            summary += run_device(opts, device_suites, device, devices, progress, note)
    with ProfileDB(opts.db_path) as db:
        for cls in suites:
            if cls.scope == "device":
                continue
            # host suites (collectives) run on the local devices: file them under the first one's fingerprint
            device_id = db.add_device(devmod.describe(devices[0], opts.host, opts.threads)) \
                if cls.scope == "host" else None
            ctx = _context(opts, db, cls, devices[0], device_id, devices, note)
            suite = cls()
            ctx.advance = progress(f"{cls.name} ({opts.host})", suite.steps(ctx))
            suite.run(ctx)
            summary += ctx.summary
    return summary


def _context(opts, db, cls, device, device_id, devices, note) -> ProfileContext:
    return ProfileContext(db=db, host=opts.host, device=device, device_id=device_id, quick=opts.quick,
                          threads=opts.threads, models=list(opts.models), devices=list(devices),
                          options=dict(opts.options), note=note, suite=cls.name)


def run_device(opts: ProfileOptions, suites: list[type[Suite]], device: str, devices: list[str],
               progress: ProgressFactory = _no_progress,
               note: Callable[[str], None] = lambda text: None) -> list[SummaryRow]:
    """The device-scope suites on one device (in this process)."""
    import torch

    keep_freed_memory()  # the allocator a run's workers use (hostmemory.py says why)
    if device == "cpu":
        torch.set_num_threads(opts.threads)
    else:
        torch.cuda.set_device(torch.device(device))
    summary: list[SummaryRow] = []
    with ProfileDB(opts.db_path) as db:
        device_id = db.add_device(devmod.describe(device, opts.host, opts.threads))
        for cls in suites:
            suite = cls()
            ctx = _context(opts, db, cls, device, device_id, devices, note)
            ctx.advance = progress(f"{cls.name} ({device})", suite.steps(ctx))
            suite.run(ctx)
            summary += ctx.summary
    return summary


def _device_worker(opts: ProfileOptions, suite_names: list[str], device: str, devices: list[str],
                   queue: Any) -> list[SummaryRow]:
    """One GPU's suites in a worker process; progress goes back through `queue`."""

    def progress(label: str, total: int) -> Callable[[int], None]:
        queue.put(("task", device, label, total))
        return lambda n=1: queue.put(("advance", device, label, n))

    suites = [cls for cls in suites_to_run(suite_names)]
    return run_device(opts, suites, device, devices, progress, lambda text: queue.put(("note", device, text, 0)))


def _parallel_devices(opts, suites, devices, progress, note) -> list[SummaryRow]:
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    with isolated_children():  # the manager, the pool's workers and the resource tracker start inside
        return _run_pool(ctx, opts, suites, devices, progress, note)


def _run_pool(ctx, opts, suites, devices, progress, note) -> list[SummaryRow]:
    import queue as queue_mod
    from concurrent.futures import ProcessPoolExecutor, wait

    manager = ctx.Manager()
    events = manager.Queue()
    advancers: dict[tuple[str, str], Callable[[int], None]] = {}
    names = [s.name for s in suites]
    with ProcessPoolExecutor(max_workers=len(devices), mp_context=ctx) as pool:
        futures = [pool.submit(_device_worker, opts, names, d, devices, events) for d in devices]
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.2)
            while True:
                try:
                    kind, device, label, n = events.get_nowait()
                except queue_mod.Empty:
                    break
                if kind == "task":
                    advancers[(device, label)] = progress(label, n)
                elif kind == "advance":
                    advancers[(device, label)](n)
                else:
                    note(f"{device}: {label}")
        summary: list[SummaryRow] = []
        for f in futures:
            summary += f.result()
    manager.shutdown()
    return summary
