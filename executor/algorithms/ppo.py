"""PPO with a learned critic: GAE advantages, the KL to the reference as a per-token reward penalty,
and a clipped value loss.
"""

from __future__ import annotations

import torch

from hetprof.executor.algorithms import register_algorithm
from hetprof.executor.algorithms.advantages import gae, terminal_rewards, whiten
from hetprof.executor.algorithms.base import Algorithm, RLBatch
from hetprof.executor.models.logprobs import masked_mean


@register_algorithm("ppo")
class PPO(Algorithm):
    needs_critic = True

    def kl_in_loss(self) -> bool:
        return False

    def advantages(self, batch: RLBatch) -> RLBatch:
        cfg = self.config
        if batch.values is None:
            raise ValueError("PPO needs the critic's values on the batch (batch.values)")
        mask = batch.mask.float()
        rewards = terminal_rewards(batch.rewards, batch.mask)
        if cfg.kl_coef > 0 and batch.ref_logprobs is not None:
            policy = batch.behaviour_logprobs if batch.proximal_logprobs is None else batch.proximal_logprobs
            rewards = rewards - cfg.kl_coef * (policy.float() - batch.ref_logprobs.float()) * mask
        adv, ret = gae(rewards, batch.values, mask, cfg.gamma, cfg.lam)
        batch.advantages = whiten(adv, mask) if cfg.whiten_advantages else adv
        batch.returns = ret
        return batch

    def value_loss(self, batch: RLBatch, values: torch.Tensor,
                   denominator: torch.Tensor | float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """0.5·max((V−R)², (V_clip−R)²), V_clip = V_old + clip(V − V_old, ±c); token mean."""
        if batch.returns is None or batch.values is None:
            raise ValueError("call advantages() on a batch with critic values before value_loss()")
        mask = batch.mask.float()
        denom = mask.sum().clamp(min=1.0) if denominator is None else denominator
        returns, old = batch.returns.float(), batch.values.float()
        err = (values - returns) ** 2
        if self.config.value_clip is not None:
            c = self.config.value_clip
            clipped_v = old + (values - old).clamp(-c, c)
            err_clipped = (clipped_v - returns) ** 2
            per_token = 0.5 * torch.maximum(err, err_clipped)
            clip_frac = masked_mean((err_clipped > err).float(), mask)
        else:
            per_token = 0.5 * err
            clip_frac = torch.zeros(())
        loss = (per_token * mask).sum() / denom
        with torch.no_grad():
            resid = masked_mean((returns - values) ** 2, mask) - masked_mean(returns - values, mask) ** 2
            var = masked_mean(returns ** 2, mask) - masked_mean(returns, mask) ** 2
            stats = {"value_loss": float(masked_mean(per_token, mask)), "value_clip_frac": float(clip_frac),
                     "value_mean": float(masked_mean(values, mask)),
                     "explained_variance": float(1.0 - resid / var) if float(var) > 1e-12 else 0.0}
        return loss, stats
