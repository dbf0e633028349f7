"""What every runner on one rank shares: the run's settings, the rank's place, and the few objects
built once per rank (tokenizer, prompt source, reward function, the algorithm).

Nothing task-specific lives here: a model, its placement and its learner belong to the runner of
its task (runners/registry.py), so a rank holds only what the plan put on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from rich.console import Console

from hetprof.executor.algorithms import Algorithm, AlgorithmConfig, get_algorithm
from hetprof.executor.models.model_ref import model_ref
from hetprof.executor.models.modeling import torch_dtype
from hetprof.executor.models.tokenizer import Tokenizer, load_tokenizer
from hetprof.executor.options import RunOptions
from hetprof.executor.parallel.process_groups import ProcessGroups
from hetprof.executor.parallel.topology import TaskRanks, Topology
from hetprof.executor.prompts.data import Prompt, PromptSource
from hetprof.executor.prompts.prompt_files import prompt_sets
from hetprof.executor.runners.rewards import RewardFn, get_reward
from hetprof.specs import WorkloadSpec
from hetprof.specs.vocabulary import Role, TaskKind


@dataclass
class RankContext:
    """One rank's shared pieces; runners read it, none owns it."""

    workload: WorkloadSpec
    options: RunOptions
    topo: Topology
    groups: ProcessGroups
    rank: int
    device: torch.device
    tokenizer: Tokenizer
    source: PromptSource
    validation_prompts: list[Prompt]
    algorithm: Algorithm
    reward_fn: RewardFn
    console: Console = field(default_factory=Console)

    @classmethod
    def build(cls, workload: WorkloadSpec, options: RunOptions, topo: Topology, groups: ProcessGroups,
              rank: int, device: torch.device) -> RankContext:
        t = workload.training
        algorithm = get_algorithm(workload.algorithm)(AlgorithmConfig(
            clip_eps=t.clip_eps, kl_coef=t.kl_coef, gamma=t.gamma, lam=t.lam))
        sets = prompt_sets(workload.data, workload.base_dir, options.prompts, options.seed)
        return cls(workload=workload, options=options, topo=topo, groups=groups, rank=rank, device=device,
                   tokenizer=load_tokenizer(model_ref(workload, Role.ACTOR)),
                   source=PromptSource(sets.train, workload.prompts_per_step, seed=options.seed),
                   validation_prompts=sets.validation, algorithm=algorithm, reward_fn=get_reward(options.reward))

    @property
    def tasks(self) -> list[str]:
        """The tasks the plan put on this rank."""
        return self.topo.tasks_on(self.rank)

    def placement(self, task: str) -> TaskRanks:
        return self.topo.tasks[task]

    def model_ref(self, role: str) -> str:
        return model_ref(self.workload, role)

    # Masters and optimizer state in fp32; generation and inference in the workload's precision on
    # GPUs (CPUs compute in fp32: bf16 matmuls there are emulated and slow).
    @property
    def train_dtype(self) -> torch.dtype:
        return torch.float32

    @property
    def infer_dtype(self) -> torch.dtype:
        # one precision serves generation and inference (hetprof.specs.executable refuses two)
        return torch.float32 if self.device.type == "cpu" else torch_dtype(self.workload.dtype_of(TaskKind.GENERATION))

    @property
    def wire_dtype(self) -> torch.dtype | None:
        """What weight syncs send: the copies' precision when it differs from the masters'."""
        return self.infer_dtype if self.infer_dtype != self.train_dtype else None

    def prompts(self, batch: int) -> list[Prompt]:
        return self.source.batch(batch)
