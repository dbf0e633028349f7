"""One colour per RL task, shared by every timeline drawn (the planner's predicted Gantt and the
executor's measured one), so a task looks the same in both pictures."""

from __future__ import annotations

from hetprof.specs.vocabulary import Task

TASK_COLOURS = {
    Task.ACTOR_GEN: "#4C72B0", Task.REF_INFER: "#55A868", Task.REWARD_INFER: "#C44E52", Task.CRITIC_INFER: "#8172B2",
    Task.ACTOR_TRAIN: "#CCB974", Task.CRITIC_TRAIN: "#64B5CD", Task.ACTOR_LOGPROB: "#DD8452",
}
OTHER = "#999999"


def task_colour(name: str) -> str:
    """The colour of the task `name` starts with (a tasklet or transfer named after it), else grey."""
    for task, colour in TASK_COLOURS.items():
        if name.startswith(task):
            return colour
    return OTHER
