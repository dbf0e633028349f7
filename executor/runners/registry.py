"""The runner of each task, by name, and the runners one rank builds.

Keyed by `Task`, with hetprof.registry's rules: a registration (`register_runner`) wins over a
built-in, a built-in over an entry point in `hetprof.task_runners`. A runner is a class taking
(rank context, task, the runners already built on the rank) that satisfies `TaskRunner`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hetprof.errors import ExecutionError
from hetprof.executor.runners.base import TaskRunner
from hetprof.executor.runners.context import RankContext
from hetprof.registry import Registry
from hetprof.specs.vocabulary import Task

ENTRY_POINT_GROUP = "hetprof.task_runners"
_HERE = "hetprof.executor.runners"

RUNNERS: Registry[type] = Registry(
    "task runner", ENTRY_POINT_GROUP,
    builtins={Task.ACTOR_GEN: f"{_HERE}.generator:Generator",
              Task.ACTOR_LOGPROB: f"{_HERE}.inference:ActorLogprobs",
              Task.REF_INFER: f"{_HERE}.inference:ReferenceLogprobs",
              Task.REWARD_INFER: f"{_HERE}.scorers:RewardModel",
              Task.CRITIC_INFER: f"{_HERE}.inference:CriticValues",
              Task.ACTOR_TRAIN: f"{_HERE}.trainers:ActorTrainer",
              Task.CRITIC_TRAIN: f"{_HERE}.trainers:CriticTrainer"},
    check=lambda obj: isinstance(obj, type), expected="a TaskRunner class")


def register_runner(task: str) -> Callable[[type], type]:
    """Class decorator making a class the runner of `task` (replacing the built-in)."""
    return RUNNERS.register(task)


def build_runners(ctx: RankContext) -> dict[str, Any]:
    """The runners of the tasks the plan put on this rank, and no other: each built after the
    runners it uses (`after`), in the plan's task order otherwise."""
    pending = list(ctx.tasks)
    built: dict[str, TaskRunner] = {}
    while pending:
        ready = [t for t in pending if all(a in built or a not in pending for a in _after(t))]
        if not ready:
            raise ExecutionError(f"task runners: {', '.join(pending)} wait on each other")
        for task in ready:
            missing = [a for a in _after(task) if a not in built]
            if missing:
                raise ExecutionError(f"task {task} on rank {ctx.rank} needs {', '.join(missing)} on the same rank")
            built[task] = RUNNERS.get(task)(ctx, task, built)
            pending.remove(task)
    return {t: built[t] for t in ctx.tasks}


def _after(task: str) -> tuple[str, ...]:
    return tuple(getattr(RUNNERS.get(task), "after", ()))
