"""The validation split: greedy answers to held-out prompts, scored by the run's reward, every N iterations.

Generation replica 0 evaluates with its own engine (hf or vllm) right after a weight sync, so it
sees the weights the next rollouts will get and the trainer's layout does not matter; generation
is greedy (temperature 0), so two evaluations differ only because the weights did. Three numbers go
to the leader. The planner does not price it: it shows in the iteration's `validation` lap and the
records' `val_*` fields.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from hetprof.executor.backends.base import GenerationBackend
from hetprof.executor.models.tokenizer import Tokenizer
from hetprof.executor.prompts.data import Prompt, encode_prompt
from hetprof.executor.runners.rewards import RewardFn
from hetprof.specs import WorkloadSpec
from hetprof.specs.vocabulary import Task

if TYPE_CHECKING:
    from hetprof.executor.runners.context import RankContext


class Validator:
    """Scores greedy responses to the first `eval_prompts` validation prompts."""

    def __init__(self, prompts: Sequence[Prompt], reward: RewardFn, tokenizer: Tokenizer, workload: WorkloadSpec,
                 iterations: int):
        data = workload.data
        self.prompts = list(prompts)[: data.eval_prompts]
        self.reward = reward
        self.tokenizer = tokenizer
        self.every = data.eval_every
        self.last = iterations
        self.max_new_tokens = workload.response_len.cap
        self.rows_per_batch = workload.sequences_per_step  # the generation batch the plan sized memory for
        self.ids = [encode_prompt(tokenizer, p, data.chat_template) for p in self.prompts]

    def due(self, iterations_done: int) -> bool:
        """Every `eval_every` iterations, and after the last one."""
        return bool(self.every and self.prompts) and (iterations_done % self.every == 0
                                                      or iterations_done == self.last)

    @torch.no_grad()
    def evaluate(self, engine: GenerationBackend) -> torch.Tensor:
        """[mean reward, mean response tokens, prompts] of greedy responses from `engine` (float64)."""
        responses: list[str] = []
        lengths: list[int] = []
        for lo in range(0, len(self.ids), self.rows_per_batch):
            out = engine.generate(self.ids[lo:lo + self.rows_per_batch], self.max_new_tokens, temperature=0.0)
            responses.extend(self.tokenizer.decode(r) for r in out.response_ids())
            lengths.extend(out.lengths.tolist())
        scores = self.reward([p.text for p in self.prompts], responses, [p.answer for p in self.prompts])
        return torch.tensor([sum(scores) / len(scores), sum(lengths) / len(lengths), len(scores)], dtype=torch.float64)

    @staticmethod
    def named(scores: torch.Tensor) -> dict[str, float]:
        """The record fields of `evaluate`'s numbers."""
        return dict(zip(VALIDATION_FIELDS, (float(x) for x in scores.tolist()), strict=True))


VALIDATION_FIELDS = ("val_reward_mean", "val_response_tokens_mean", "val_prompts")


def validator_for(ctx: RankContext, is_leader: bool) -> Validator | None:
    """Generation replica 0 evaluates the validation split and the leader records it; other ranks,
    and a run without a validation split or `eval_every`, hold no validator."""
    gen = ctx.topo.tasks[Task.ACTOR_GEN]
    if not (ctx.workload.data.eval_every and ctx.validation_prompts
            and (is_leader or ctx.rank in gen.replica_ranks[0])):
        return None
    return Validator(ctx.validation_prompts, ctx.reward_fn, ctx.tokenizer, ctx.workload, ctx.options.iterations)
