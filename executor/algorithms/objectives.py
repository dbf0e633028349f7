"""What a learner minimises, by the role it trains: the actor's policy loss over its log-probs and
entropy, or the critic's value loss over its values — each from a padded or packed forward, or from
a pipeline's output (whose last stage computes the loss per micro-batch)."""

from __future__ import annotations

import torch
from torch import nn

from hetprof.executor.algorithms.base import Algorithm, RLBatch
from hetprof.executor.models.logprobs import first_response_column, token_logprobs
from hetprof.executor.models.packing import packed_values
from hetprof.runtime.packedpass import entropy_from_logits, logits_to_logprobs, packed_token_logprobs
from hetprof.runtime.ulysses import SequenceParallel
from hetprof.specs.vocabulary import Role

Loss = tuple[torch.Tensor, dict[str, float]]


class Objective:
    """The loss of one role; `max_tokens`: packed micro-batches of at most that many tokens."""

    recomputes_proximal = False  # whether the update needs π_prox (the policy's old log-probs)

    def __init__(self, algorithm: Algorithm, temperature: float, max_tokens: int | None,
                 sequence_parallel: SequenceParallel | None = None) -> None:
        self.algorithm = algorithm
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.sequence_parallel = sequence_parallel  # packed rows split over a Ulysses group

    def loss(self, model: nn.Module, micro: RLBatch, denom: torch.Tensor) -> Loss:
        raise NotImplementedError

    def loss_from_output(self, micro: RLBatch, output: torch.Tensor, denom: torch.Tensor) -> Loss:
        raise NotImplementedError

    def batch_stats(self, batch: RLBatch) -> dict[str, float]:
        return {}


class PolicyObjective(Objective):
    recomputes_proximal = True

    def loss(self, model: nn.Module, micro: RLBatch, denom: torch.Tensor) -> Loss:
        grad = self.algorithm.config.entropy_coef > 0
        if self.max_tokens is not None:
            lp, ent = packed_token_logprobs(model, micro.input_ids, micro.attention_mask, self.temperature,
                                            with_entropy=True, needed=micro.mask, entropy_grad=grad,
                                            sequence_parallel=self.sequence_parallel)
        else:
            lp, ent = token_logprobs(model, micro.input_ids, micro.attention_mask, self.temperature,
                                     with_entropy=True, from_column=first_response_column(micro.mask),
                                     entropy_grad=grad)
        return self.algorithm.loss(micro, lp, ent, denominator=denom)

    def loss_from_output(self, micro: RLBatch, output: torch.Tensor, denom: torch.Tensor) -> Loss:
        col = first_response_column(micro.mask)
        logits = output[:, col:-1]
        lp = _left_zero_pad(logits_to_logprobs(logits, micro.input_ids[:, col + 1:], self.temperature), col)
        grad = self.algorithm.config.entropy_coef > 0
        ent = _left_zero_pad(entropy_from_logits(logits if grad else logits.detach(), self.temperature), col)
        return self.algorithm.loss(micro, lp, ent, denominator=denom)

    def batch_stats(self, batch: RLBatch) -> dict[str, float]:
        return {"reward_mean": float(batch.rewards.float().mean())}


class ValueObjective(Objective):
    def loss(self, model: nn.Module, micro: RLBatch, denom: torch.Tensor) -> Loss:
        if self.max_tokens is not None:
            values = packed_values(model, micro.input_ids, micro.attention_mask,
                                   sequence_parallel=self.sequence_parallel)[:, :-1]
        else:
            values = model(micro.input_ids, micro.attention_mask)[:, :-1]
        return self.algorithm.value_loss(micro, values, denominator=denom)

    def loss_from_output(self, micro: RLBatch, output: torch.Tensor, denom: torch.Tensor) -> Loss:
        return self.algorithm.value_loss(micro, output[:, :-1], denominator=denom)


OBJECTIVES: dict[str, type[Objective]] = {Role.ACTOR: PolicyObjective, Role.CRITIC: ValueObjective}


def _left_zero_pad(x: torch.Tensor, columns: int) -> torch.Tensor:
    return x if columns == 0 else torch.cat([x.new_zeros(x.shape[0], columns), x], dim=1)
