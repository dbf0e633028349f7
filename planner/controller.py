"""The controller's share of a task's time: what a GPU RL framework's driver does inside a pass.

Both terms are the catalog's `step:` constants, each cited there:
- the per-step work outside the GPU tasks (rewards, advantages, metrics), serial with the actor's update;
- with `training.padded_dispatch`, handing each pass its batch. A single controller (verl) pads every
  sequence to the longest prompt and response the workload allows and puts each data-parallel rank's
  chunk in Ray's object store before the pass starts, so the pass waits on bytes that do not shrink
  with its GPUs. Generation is handed the prompts (padded to prompt_len.max), every other pass the
  whole padded sequences; each pass is its own hand-off (verl dispatches per worker call).
The CPU pseudo-device runs `hetprof run`'s in-process controller, which pays neither (its runs
measure what it costs).
"""

from __future__ import annotations

from collections.abc import Iterable

from hetprof.specs import WorkloadSpec
from hetprof.specs.catalog import Catalog
from hetprof.specs.vocabulary import Task, TaskKind


def dispatch_slots(workload: WorkloadSpec, kind: str) -> int:
    """Token slots of the padded batch a pass of `kind` is handed: sequences × padded width."""
    width = workload.prompt_len.cap + (0 if kind == TaskKind.GENERATION else workload.response_len.cap)
    return workload.sequences_per_step * width


def controller_seconds(catalog: Catalog, workload: WorkloadSpec, task: str, kind: str,
                       device_types: Iterable[str]) -> float:
    """Seconds the controller adds to one step of `task` (of `kind`) on GPUs of `device_types`."""
    if all(catalog.lookup(t).vendor == "generic" for t in device_types):
        return 0.0
    seconds = catalog.step.seconds(workload.sequences_per_step) if task == Task.ACTOR_TRAIN else 0.0
    if workload.training.padded_dispatch:
        seconds += catalog.step.dispatch_seconds(dispatch_slots(workload, kind))
    return seconds
