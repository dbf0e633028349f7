"""Expert parallelism's place in a layout: which EP degrees an MoE task's replicas may take.

EP moves no device: it decides which data-parallel replicas share their routed experts (costmodels/moe.py
prices what that costs and saves), so it is chosen per layout like a training layout's sharding
(search/layouts.balanced_layout), and every search that builds layouts explores it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from hetprof.specs import executable
from hetprof.specs.layout import WHOLE_EXPERTS
from hetprof.specs.plan import TASKS
from hetprof.specs.vocabulary import TaskKind

if TYPE_CHECKING:
    from hetprof.planner.planning import PlanningContext


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def expert_degrees(planning: PlanningContext, task: str, replicas: Sequence[tuple[str, ...]], tp: int = 1,
                   pp: int = 1) -> tuple[int, ...]:
    """The expert-parallel degrees an MoE task's layout over `replicas` (of `tp`×`pp` devices each) is
    tried with, smallest first: those dividing the replicas and the experts whose groups of consecutive
    replicas each hold one GPU type (an EP group computes in lockstep: every rank waits at each
    all-to-all). (1,) for a dense model; where `hetprof run` plans, only degrees its executor runs
    (hetprof/specs/executable.py)."""
    model = planning.model_of(task)
    if model.moe is None or len(replicas) < 2:
        return (1,)
    types = [frozenset(planning.devices[d].type for d in r) for r in replicas]
    return tuple(ep for ep in _divisors(len(replicas)) if model.moe.experts % ep == 0
                 and all(len(set(types[g:g + ep])) == 1 for g in range(0, len(types), ep))
                 and not (planning.executable and runs_refused(planning, task, ep, tp, pp, "none")))


def expert_tp_choices(planning: PlanningContext, task: str, tp: int) -> tuple[int | None, ...]:
    """The expert tensor parallelisms an MoE training or inference layout at `tp` is tried with: each
    expert sliced over the TP ranks (None) and whole, the EP group folded over them (WHOLE_EXPERTS);
    (None,) for a dense model, a generation task (vLLM slices experts over TP), TP1, or where `hetprof
    run` plans (its tensor parallelism slices no experts: hetprof/specs/executable.py)."""
    if (tp < 2 or planning.model_of(task).moe is None or TASKS[task][0] == TaskKind.GENERATION
            or planning.executable):
        return (None,)
    return (None, WHOLE_EXPERTS)


def runs_refused(planning: PlanningContext, task: str, ep: int, tp: int, pp: int, sharding: str) -> bool:
    """Whether `hetprof run` would refuse this expert-parallel layout (hetprof/specs/executable.py)."""
    return bool(executable.expert_parallel_problems(task, planning.model_of(task), ep, tp, pp, 1, sharding, ""))
