"""What the simulator says about one candidate, and the objectives a search ranks scores by."""

from __future__ import annotations

import dataclasses
import functools
import math

from hetprof.planner.schedule import Event, ScheduleInput, timeline

OBJECTIVES = ("throughput", "cost", "throughput-under-budget")


@dataclasses.dataclass(frozen=True)
class Score:
    """What the simulator says about one candidate (see docs/CONTRACTS.md, "Planner internals")."""

    iteration_s: float
    feasible: bool
    violations: tuple[str, ...] = ()
    breakdown: dict[str, float] = dataclasses.field(default_factory=dict)
    bottleneck: str = ""
    task_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    memory_peak: dict[str, float] = dataclasses.field(default_factory=dict)
    memory_headroom: dict[str, float] = dataclasses.field(default_factory=dict)
    cost_per_iteration: float = math.inf
    throughput: float = 0.0
    price_per_hour: float = 0.0
    offload_s: dict[str, float] = dataclasses.field(default_factory=dict)
    transfer_s: dict[str, float] = dataclasses.field(default_factory=dict)
    schedule: ScheduleInput | None = dataclasses.field(default=None, repr=False, compare=False)

    def __hash__(self) -> int:
        return hash((self.iteration_s, self.feasible, self.violations))

    @functools.cached_property
    def timeline(self) -> tuple[Event, ...]:
        """Events of one steady-state iteration for the Gantt chart (replayed on first use)."""
        return timeline(self.schedule) if self.schedule is not None else ()


def objective_value(score: Score, objective: str, budget: float | None = None) -> float:
    """Lower is better. Budget is $/hour for the candidate's GPUs."""
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r} (one of {', '.join(OBJECTIVES)})")
    if not score.feasible:
        return math.inf
    if objective == "cost":
        return score.cost_per_iteration
    if objective == "throughput-under-budget" and budget is not None and score.price_per_hour > budget + 1e-9:
        return math.inf
    return score.iteration_s
