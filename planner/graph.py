"""The RL workflow as a task graph: which task feeds which, and what travels on each edge.

The simulator walks this graph; the edges are where cross-group transfers are paid. Forward
edges carry per-token data of the step's rollouts (token ids, behaviour log-probs, reference
log-probs, values) or per-sequence scalars (rewards); back edges carry model weights to the
next iteration (actor training -> generation; critic training -> critic inference).

Which passes exist is the workload's (hetprof.specs.workload_tasks): the old-log-prob recompute
(actor_logprob) unless the rollout's own log-probs are trained on, the reference pass only with a
KL term, the reward model only for model rewards, the critic only for PPO. The log-prob pass
runs on the trainer's workers with its weights (FOLLOWS), so it has no weight edge of its own.
"""

from __future__ import annotations

import dataclasses
import functools

from hetprof.specs import TASKS, WorkloadSpec, workload_tasks
from hetprof.specs.models import ModelShape
from hetprof.specs.vocabulary import Role, Task

# Bytes per token of what each kind of forward edge carries.
ROLLOUT_BYTES_PER_TOKEN = 4 + 4 + 1   # token id (int32), behaviour log-prob (fp32), mask
SCORE_BYTES_PER_TOKEN = 4             # one fp32 per token: reference log-prob or value
REWARD_BYTES_PER_SEQUENCE = 4         # one fp32 per sequence


@dataclasses.dataclass(frozen=True)
class Edge:
    """src feeds dst. kind "rollouts" | "scores" | "rewards" go forward within an iteration;
    "weights" goes back to the next iteration (`model` says whose weights)."""

    src: str
    dst: str
    kind: str
    bytes_per_token: int = 0
    bytes_per_sequence: int = 0
    model: str = ""

    @functools.cached_property
    def name(self) -> str:  # cached: the scheduler keys its arrivals by it, millions of times a search
        return f"{self.kind}:{self.src}->{self.dst}"

    @property
    def backward(self) -> bool:
        return self.kind == "weights"

    def payload_bytes(self, sequences: int, seq_len: float, weights: float = 0.0) -> float:
        if self.backward:
            return weights
        return sequences * (seq_len * self.bytes_per_token + self.bytes_per_sequence)


@dataclasses.dataclass(frozen=True)
class RLGraph:
    """Tasks in a topological order of the forward edges, and all edges."""

    algorithm: str
    tasks: tuple[str, ...]
    edges: tuple[Edge, ...]
    models: dict[str, ModelShape] = dataclasses.field(hash=False, compare=False)

    def forward_in(self, task: str) -> tuple[Edge, ...]:
        return tuple(e for e in self.edges if e.dst == task and not e.backward)

    def forward_out(self, task: str) -> tuple[Edge, ...]:
        return tuple(e for e in self.edges if e.src == task and not e.backward)

    def backward_edges(self) -> tuple[Edge, ...]:
        return tuple(e for e in self.edges if e.backward)

    def model_of(self, task: str) -> ModelShape:
        return self.models[TASKS[task][1]]

    def kind_of(self, task: str) -> str:
        return TASKS[task][0]

    def order(self, task: str) -> int:
        return self.tasks.index(task)


def build_graph(workload: WorkloadSpec) -> RLGraph:
    """The task graph of a workload: PPO or GRPO, with or without a reward model."""
    tasks = workload_tasks(workload)
    present = set(tasks)
    edges: list[Edge] = []

    def add(src: str, dst: str, kind: str, **kw) -> None:
        if src in present and dst in present:
            edges.append(Edge(src, dst, kind, **kw))

    # Rollouts from generation to everything that scores or learns from them.
    for dst in (Task.ACTOR_LOGPROB, Task.REF_INFER, Task.REWARD_INFER, Task.CRITIC_INFER, Task.ACTOR_TRAIN, Task.CRITIC_TRAIN):
        add(Task.ACTOR_GEN, dst, "rollouts", bytes_per_token=ROLLOUT_BYTES_PER_TOKEN)
    # Scores computed on the rollouts, consumed by training.
    for src in (Task.ACTOR_LOGPROB, Task.REF_INFER):
        add(src, Task.ACTOR_TRAIN, "scores", bytes_per_token=SCORE_BYTES_PER_TOKEN)
    for dst in (Task.ACTOR_TRAIN, Task.CRITIC_TRAIN):
        add(Task.REWARD_INFER, dst, "rewards", bytes_per_sequence=REWARD_BYTES_PER_SEQUENCE)
        add(Task.CRITIC_INFER, dst, "scores", bytes_per_token=SCORE_BYTES_PER_TOKEN)
    # Weights back to the next iteration.
    add(Task.ACTOR_TRAIN, Task.ACTOR_GEN, "weights", model=Role.ACTOR)
    add(Task.CRITIC_TRAIN, Task.CRITIC_INFER, "weights", model=Role.CRITIC)
    return RLGraph(workload.algorithm, tuple(tasks), tuple(edges), workload.roles())
