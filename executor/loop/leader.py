"""The leader's own steps on a collected batch: its statistics, the rewards and the advantages.

The leader (actor_train's replica 0) scores every sequence (runners/scorers.py) and computes the
algorithm's advantages over the whole batch before it is split over the training replicas.
"""

from __future__ import annotations

import torch

from hetprof.executor.algorithms import RLBatch
from hetprof.executor.loop.staleness import VersionCounter
from hetprof.executor.loop.timing import StepTiming
from hetprof.executor.records.iteration_report import BatchStats, sample_texts
from hetprof.executor.runners.context import RankContext
from hetprof.executor.runners.scorers import score

# The RLBatch fields that travel to training replicas (None fields are left out).
BATCH_FIELDS = ("input_ids", "attention_mask", "mask", "rewards", "behaviour_logprobs", "ref_logprobs",
                "proximal_logprobs", "values", "advantages", "returns", "versions")

Tensors = dict[str, torch.Tensor]


class Leader:
    """The leader's part of each iteration."""

    def __init__(self, ctx: RankContext, timing: StepTiming) -> None:
        self.ctx = ctx
        self.timing = timing
        self._lengths_checked = False

    def score(self, b: int, batch: Tensors, counter: VersionCounter) -> Tensors:
        """The batch with its rewards and advantages; its statistics into the step's report."""
        with self.timing.span("reward"):
            stats = self.batch_stats(batch, counter)
            prompts = self.ctx.prompts(b)
            batch = score(self.ctx, batch, prompts)
            stats.reward_mean = float(batch["rewards"].mean())
            stats.reward_std = float(batch["rewards"].std(correction=0))
            stats.samples = sample_texts(batch, prompts, self.ctx.tokenizer)
            self.timing.report.batch = stats
        with self.timing.span("advantage"):
            return self.advantages(batch)

    def batch_stats(self, batch: Tensors, counter: VersionCounter) -> BatchStats:
        ages = counter.staleness(batch["version"].tolist())
        response = batch["response_mask"].sum(1).float()
        stats = BatchStats(tokens=int(batch["response_mask"].sum()),
                           prompt_tokens_mean=float((batch["attention_mask"].sum(1).float() - response).mean()),
                           response_tokens_mean=float(response.mean()),
                           staleness_max=max(ages), staleness_mean=sum(ages) / len(ages),
                           sequences=int(batch["response_mask"].shape[0]))
        self._check_lengths(stats)
        return stats

    def advantages(self, batch: Tensors) -> Tensors:
        """The algorithm's advantages (and PPO returns) over the whole batch, as RLBatch fields."""
        rl = RLBatch(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                     mask=batch["response_mask"][:, 1:], rewards=batch["rewards"],
                     behaviour_logprobs=batch["logprobs"][:, 1:],
                     group_size=self.ctx.workload.responses_per_prompt,
                     ref_logprobs=batch.get("ref_logprobs"), proximal_logprobs=batch.get("proximal_logprobs"),
                     values=batch.get("values"), versions=batch["version"])
        self.ctx.algorithm.advantages(rl)
        return {f: getattr(rl, f) for f in BATCH_FIELDS if getattr(rl, f) is not None}

    def _check_lengths(self, stats: BatchStats) -> None:
        """Say once when the data's lengths are far from the workload's: the plan was predicted for those."""
        if self._lengths_checked:
            return
        self._lengths_checked = True
        workload = self.ctx.workload
        for what, declared, seen in (("prompts", workload.prompt_len, stats.prompt_tokens_mean),
                                     ("responses", workload.response_len, stats.response_tokens_mean)):
            if not 0.67 <= seen / declared.mean <= 1.5:
                self.ctx.console.print(
                    f"[yellow]note: {what} average {seen:.0f} tokens but the workload says {declared.mean:g} "
                    f"({what[:-1]}_len.mean); the plan's predictions assume the workload's lengths[/yellow]")
