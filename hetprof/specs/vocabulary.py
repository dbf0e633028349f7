"""The RL vocabulary every stage shares: model roles, tasks, task kinds and weight-sync edges.

String enums, so a member is its own plain name in JSON, YAML, SQLite and dict keys ("actor_gen"
== Task.ACTOR_GEN) and files written before the enums existed read back unchanged; code names the
member so a typo fails at import time instead of silently matching nothing.
"""

from __future__ import annotations

from enum import Enum


class StrEnum(str, Enum):
    """A member is its plain name in f-strings, JSON, dict keys and the lists an error message prints
    (enum.StrEnum before Python 3.11, with the plain repr too)."""

    def __str__(self) -> str:
        return str(self.value)

    def __repr__(self) -> str:
        return repr(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class Role(StrEnum):
    """A model of the RL job; several tasks can run copies of one role (the actor generates and trains)."""

    ACTOR = "actor"
    REFERENCE = "reference"
    REWARD = "reward"
    CRITIC = "critic"


class TaskKind(StrEnum):
    """What a task does with its model: decode token by token, one forward pass, or forward+backward+step."""

    GENERATION = "generation"
    INFERENCE = "inference"
    TRAINING = "training"


class Task(StrEnum):
    """One unit of an RL iteration that the planner places on devices and the executor runs."""

    ACTOR_GEN = "actor_gen"
    ACTOR_LOGPROB = "actor_logprob"  # the old log-probs under the trainer's current weights
    REF_INFER = "ref_infer"
    REWARD_INFER = "reward_infer"
    CRITIC_INFER = "critic_infer"
    ACTOR_TRAIN = "actor_train"
    CRITIC_TRAIN = "critic_train"

    @property
    def kind(self) -> TaskKind:
        return TASK_KIND[self]

    @property
    def role(self) -> Role:
        return TASK_ROLE[self]


class SyncEdge(StrEnum):
    """A weight transfer from a trainer to the copies that must hold its new weights."""

    WEIGHT_SYNC = "weight_sync"  # actor_train -> actor_gen
    CRITIC_SYNC = "critic_sync"  # critic_train -> critic_infer (PPO)


TASK_KIND: dict[Task, TaskKind] = {
    Task.ACTOR_GEN: TaskKind.GENERATION, Task.ACTOR_LOGPROB: TaskKind.INFERENCE, Task.REF_INFER: TaskKind.INFERENCE,
    Task.REWARD_INFER: TaskKind.INFERENCE, Task.CRITIC_INFER: TaskKind.INFERENCE,
    Task.ACTOR_TRAIN: TaskKind.TRAINING, Task.CRITIC_TRAIN: TaskKind.TRAINING,
}
TASK_ROLE: dict[Task, Role] = {
    Task.ACTOR_GEN: Role.ACTOR, Task.ACTOR_LOGPROB: Role.ACTOR, Task.REF_INFER: Role.REFERENCE, Task.REWARD_INFER: Role.REWARD,
    Task.CRITIC_INFER: Role.CRITIC, Task.ACTOR_TRAIN: Role.ACTOR, Task.CRITIC_TRAIN: Role.CRITIC,
}
# Order in which a rank that holds several tasks of a kind runs them within one iteration.
INFERENCE_ORDER: tuple[Task, ...] = (Task.REF_INFER, Task.REWARD_INFER, Task.CRITIC_INFER)
TRAINING_ORDER: tuple[Task, ...] = (Task.ACTOR_TRAIN, Task.CRITIC_TRAIN)
# Each sync edge: the trained role, the task that sends (its replica 0's lead) and the task that receives.
SYNC_EDGES: dict[SyncEdge, tuple[Role, Task, Task]] = {
    SyncEdge.WEIGHT_SYNC: (Role.ACTOR, Task.ACTOR_TRAIN, Task.ACTOR_GEN),
    SyncEdge.CRITIC_SYNC: (Role.CRITIC, Task.CRITIC_TRAIN, Task.CRITIC_INFER),
}


class MoeBenchmark(StrEnum):
    """The profiler's mixture-of-experts rows (the `moe` suite), named once for the profiler that writes
    them, `hetprof fit` that learns from them and the planner that checks they exist."""

    ROUTER = "moe.router"  # gate matmul, softmax and top-k over a batch of tokens
    EXPERTS = "moe.experts"  # the routed experts' grouped SwiGLU GEMMs, forward or backward
    ALL_TO_ALL = "moe.all_to_all"  # one dispatch all-to-all among the local ranks (the combine mirrors it)
