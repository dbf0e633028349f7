"""GRPO: the group of responses to one prompt is its own baseline, so no critic is trained.

Every response's tokens share the sequence's group-normalised advantage; the KL to the reference
policy is a loss term (k3 estimator) rather than a reward penalty, as in DeepSeekMath.
"""

from __future__ import annotations

from hetprof.executor.algorithms import register_algorithm
from hetprof.executor.algorithms.advantages import group_normalised
from hetprof.executor.algorithms.base import Algorithm, AlgorithmConfig, RLBatch


@register_algorithm("grpo")
class GRPO(Algorithm):
    def __init__(self, config: AlgorithmConfig | None = None, **overrides):
        if config is None and "kl_coef" not in overrides:
            overrides["kl_coef"] = 0.04  # the usual GRPO default; 0 disables the reference model
        super().__init__(config, **overrides)

    def advantages(self, batch: RLBatch) -> RLBatch:
        per_seq = group_normalised(batch.rewards, batch.group_size, scale_std=self.config.scale_std)
        batch.advantages = per_seq[:, None] * batch.mask.float()
        batch.returns = None
        return batch
