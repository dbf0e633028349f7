"""`hetprof run --trace DIR`: a torch.profiler trace of a few iterations, one file per rank.

Each rank profiles the same loop steps — CPU ops, and CUDA kernels on a GPU — and writes
`DIR/rank<R>.pt.trace.json` in the Chrome trace format, which Perfetto (ui.perfetto.dev) and
chrome://tracing open. The first loop step is skipped when the run is long enough: it holds
start-up (first weight sync, allocator and kernel warm-up) that is not what a steady iteration
costs. Every step is labelled `iteration N` in the trace, so one iteration's work is found at once.
"""

from __future__ import annotations

import contextlib
import gc
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch


def trace_file(directory: str | Path, rank: int) -> Path:
    return Path(directory) / f"rank{rank}.pt.trace.json"


def skipped_steps(steps: int, traced: int) -> int:
    """Loop steps left out before tracing: the first one when the run has room for it."""
    return 1 if steps > traced else 0


class IterationTrace:
    """Profiles `iterations` loop steps of one rank and writes its trace when they are done."""

    def __init__(self, directory: str | Path | None, rank: int, steps: int, iterations: int) -> None:
        self.enabled = directory is not None
        self._profiler: Any = None
        if not self.enabled:
            return
        self.path = trace_file(directory, rank)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        from torch.profiler import ProfilerActivity, profile, schedule

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        active = min(iterations, steps)
        with warnings.catch_warnings():  # the skipped first step is the warm-up; no profiler warm-up step
            warnings.filterwarnings("ignore", message="Profiler won't be using warmup")
            when = schedule(skip_first=skipped_steps(steps, active), wait=0, warmup=0, active=active, repeat=1)
        self._profiler = profile(activities=activities, record_shapes=False, with_stack=False, schedule=when,
                                 on_trace_ready=lambda prof: prof.export_chrome_trace(str(self.path)))

    def __enter__(self) -> IterationTrace:
        if self._profiler is not None:
            self._profiler.__enter__()
        return self

    @contextlib.contextmanager
    def step(self, label: str) -> Iterator[None]:
        """One loop step, labelled in the trace; the profiler's schedule advances after it."""
        if self._profiler is None:
            yield
            return
        with torch.profiler.record_function(label):
            yield
        self._profiler.step()

    def __exit__(self, *exc: object) -> None:
        if self._profiler is not None:
            self._profiler.__exit__(*exc)
            # the profiler's results hold references into the run (ops, tensors, groups): freed here,
            # while the process groups still exist, not by a later collection during their teardown
            self._profiler = None
            gc.collect()
