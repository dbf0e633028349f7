"""The scorers: the reward model's pass (reward_infer) on its replicas, and the leader's reward of
each sequence — the rule (or user) reward function plus the reward model's score if planned."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from hetprof.executor.models.modeling import build_reward_model
from hetprof.executor.models.packing import packed_sequence_scores
from hetprof.executor.prompts.data import Prompt
from hetprof.executor.runners.base import RunnerBase, Tensors, place
from hetprof.executor.runners.context import RankContext
from hetprof.executor.runners.inference import InferencePass
from hetprof.executor.runners.rewards import RewardModelScorer
from hetprof.specs.vocabulary import Role


class RewardModel(InferencePass):
    """reward_infer: the reward model's score at each sequence's last attended token."""

    def __init__(self, ctx: RankContext, task: str, peers: Mapping[str, RunnerBase]) -> None:
        super().__init__(ctx, task, peers)
        rm = build_reward_model(ctx.model_ref(Role.REWARD), seed=ctx.options.seed + 2, dtype=ctx.infer_dtype,
                                device=ctx.device, attn_implementation=self.attention).eval()
        self.module, self.sharded = place(ctx, task, rm, head="value", flatten=False)
        self.scorer = RewardModelScorer(rm, ctx.tokenizer, ctx.device)

    def from_pipeline(self, out: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> Tensors:
        t = torch.arange(mask.shape[1], device=mask.device)
        last = (mask.bool() * t).amax(dim=1)
        return {"rm_scores": out.gather(1, last[:, None]).squeeze(1).float()}

    def packed(self, ids: torch.Tensor, mask: torch.Tensor, budget: int,
               response_mask: torch.Tensor | None) -> Tensors:
        scorer = self.scorer
        return {"rm_scores": packed_sequence_scores(scorer.model, ids.to(scorer.device), mask.to(scorer.device),
                                                    budget, self.sequence_parallel).float()}

    def padded(self, ids: torch.Tensor, mask: torch.Tensor) -> Tensors:
        return {"rm_scores": self.scorer.score_ids(ids, mask).float()}


def score(ctx: RankContext, batch: Tensors, prompts: list[Prompt]) -> Tensors:
    """The batch with `rewards` per sequence: the run's reward function on the decoded response,
    plus the reward model's score where the plan ran one (the leader's part)."""
    texts, responses, answers = [], [], []
    for row, rmask, idx in zip(batch["input_ids"].tolist(), batch["response_mask"].tolist(),
                               batch["prompt_index"].tolist(), strict=True):
        resp = [t for t, m in zip(row, rmask, strict=True) if m]
        responses.append(ctx.tokenizer.decode(resp))
        texts.append(prompts[idx].text)
        answers.append(prompts[idx].answer)
    rewards = torch.tensor(ctx.reward_fn(texts, responses, answers), dtype=torch.float32)
    if "rm_scores" in batch:
        rewards = rewards + batch["rm_scores"].float()
    return {**batch, "rewards": rewards}
