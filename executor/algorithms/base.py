"""What every RL algorithm shares: the batch it consumes, its settings, and the clipped policy loss.

The policy loss is the decoupled PPO objective of AReaL, which reduces to plain PPO in sync runs.
Async generators sample from a *behaviour* policy up to k versions old; clipping the ratio against
that stale policy would either clip almost everything or nothing. The decoupled objective clips
against a *proximal* policy — the trainer's weights at the start of this update, recomputed here —
and corrects for the behaviour/proximal gap with an importance weight π_prox/π_behav, capped so
one very stale token cannot dominate a step:

    L = −E[ min(w, cap) · min(r·A, clip(r, 1−ε, 1+ε_high)·A) ],  r = π_θ/π_prox,  w = π_prox/π_behav

With no proximal log-probs (sync, one policy) π_prox = π_behav and w = 1: classic PPO-clip.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from hetprof.errors import SpecError
from hetprof.executor.models.logprobs import masked_mean

if TYPE_CHECKING:
    from hetprof.executor.backends.base import Rollout


@dataclasses.dataclass
class AlgorithmConfig:
    """Settings of GRPO and PPO; defaults follow common practice for small-model RL."""

    clip_eps: float = 0.2              # PPO clip range ε (low side)
    clip_eps_high: float | None = None  # upper clip (DAPO's clip-higher); None = clip_eps
    kl_coef: float = 0.0               # GRPO: KL-to-reference loss weight; PPO: KL penalty in the reward
    entropy_coef: float = 0.0          # bonus on policy entropy
    behaviour_cap: float | None = 5.0  # cap on π_prox/π_behav (decoupled objective); None = uncapped
    scale_std: bool = True             # GRPO: divide by the group's std (False = Dr. GRPO)
    gamma: float = 1.0                 # PPO discount
    lam: float = 1.0                   # PPO GAE λ: 1 (Monte-Carlo) suits one terminal reward per answer
    value_clip: float | None = 0.2     # PPO value-loss clip range; None = no clipping
    whiten_advantages: bool = True     # PPO: normalise advantages over the batch

    def __post_init__(self) -> None:
        checks = [("clip_eps", self.clip_eps > 0), ("kl_coef", self.kl_coef >= 0),
                  ("entropy_coef", self.entropy_coef >= 0), ("gamma", 0 <= self.gamma <= 1),
                  ("lam", 0 <= self.lam <= 1),
                  ("clip_eps_high", self.clip_eps_high is None or self.clip_eps_high > 0),
                  ("behaviour_cap", self.behaviour_cap is None or self.behaviour_cap >= 1),
                  ("value_clip", self.value_clip is None or self.value_clip > 0)]
        for field, ok in checks:
            if not ok:
                raise SpecError(None, f"algorithm.{field}", "a value in its valid range", getattr(self, field))


@dataclasses.dataclass
class RLBatch:
    """Scored rollouts in the trainer's shifted space ([B, T-1]; column t is the action 'emit token t+1')."""

    input_ids: torch.Tensor                         # [B, T]
    attention_mask: torch.Tensor                    # [B, T]
    mask: torch.Tensor                              # [B, T-1] response tokens (shifted)
    rewards: torch.Tensor                           # [B] one scalar per sequence
    behaviour_logprobs: torch.Tensor                # [B, T-1] from the generator
    group_size: int = 1                             # responses per prompt, consecutive rows
    ref_logprobs: torch.Tensor | None = None        # [B, T-1] reference model
    proximal_logprobs: torch.Tensor | None = None   # [B, T-1] trainer's weights before this update
    values: torch.Tensor | None = None              # [B, T-1] critic values at generation time
    advantages: torch.Tensor | None = None          # [B, T-1] filled by Algorithm.advantages
    returns: torch.Tensor | None = None             # [B, T-1] PPO value targets
    versions: torch.Tensor | None = None            # [B] weight version each sample was generated with

    @classmethod
    def from_rollout(cls, rollout: Rollout, rewards: Sequence[float] | torch.Tensor, group_size: int = 1,
                     **extra: torch.Tensor | None) -> RLBatch:
        """A batch from a backend's `Rollout` and per-sequence rewards (list or tensor)."""
        rewards = torch.as_tensor(rewards, dtype=torch.float32, device=rollout.input_ids.device)
        return cls(input_ids=rollout.input_ids, attention_mask=rollout.attention_mask,
                   mask=rollout.shifted_mask, rewards=rewards,
                   behaviour_logprobs=rollout.shifted_logprobs, group_size=group_size, **extra)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, index: torch.Tensor) -> RLBatch:
        """The rows `index` (a mini-batch); per-row tensors are sliced, the rest kept."""
        picked = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            picked[f.name] = value[index] if isinstance(value, torch.Tensor) else value
        return RLBatch(**picked)

    def to(self, device: torch.device | str) -> RLBatch:
        return RLBatch(**{f.name: (v.to(device) if isinstance(v := getattr(self, f.name), torch.Tensor) else v)
                          for f in dataclasses.fields(self)})


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(π_θ ‖ π_ref) per token: unbiased and never negative."""
    log_ratio = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
    return torch.exp(log_ratio) - log_ratio - 1.0


class Algorithm(abc.ABC):
    """Advantages from a scored batch, and the loss of one mini-batch under the current policy."""

    name = "base"
    needs_critic = False

    def __init__(self, config: AlgorithmConfig | None = None, **overrides):
        base = config or AlgorithmConfig()
        self.config = dataclasses.replace(base, **overrides) if overrides else base

    @property
    def needs_reference(self) -> bool:
        return self.config.kl_coef > 0

    @abc.abstractmethod
    def advantages(self, batch: RLBatch) -> RLBatch:
        """Fill `batch.advantages` (and `batch.returns` where a critic learns); returns the batch."""

    def kl_in_loss(self) -> bool:
        """Whether the KL-to-reference term belongs in the policy loss (GRPO) or the reward (PPO)."""
        return True

    def loss(self, batch: RLBatch, logprobs: torch.Tensor, entropy: torch.Tensor | None = None,
             denominator: torch.Tensor | float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """Decoupled clipped policy loss (+ KL, − entropy) averaged over response tokens.

        `denominator` overrides the token count the sum is divided by, so micro-batches accumulated
        into one optimizer step add up to that step's token mean.
        """
        cfg = self.config
        if batch.advantages is None:
            raise ValueError("call advantages() on the batch before loss()")
        mask = batch.mask.float()
        denom = mask.sum().clamp(min=1.0) if denominator is None else denominator
        behav = batch.behaviour_logprobs.float()
        prox = behav if batch.proximal_logprobs is None else batch.proximal_logprobs.float()
        log_ratio = (logprobs - prox).clamp(-20.0, 20.0)
        ratio = torch.exp(log_ratio)
        adv = batch.advantages.float()
        high = cfg.clip_eps_high if cfg.clip_eps_high is not None else cfg.clip_eps
        unclipped = -adv * ratio
        clipped = -adv * ratio.clamp(1.0 - cfg.clip_eps, 1.0 + high)
        pg = torch.maximum(unclipped, clipped)
        weight = torch.exp((prox - behav).clamp(-20.0, 20.0))
        capped = torch.zeros_like(weight, dtype=torch.bool)
        if cfg.behaviour_cap is not None:
            capped = weight > cfg.behaviour_cap
            weight = weight.clamp(max=cfg.behaviour_cap)
        per_token = weight.detach() * pg
        stats: dict[str, float] = {}
        if batch.ref_logprobs is not None:
            kl = k3_kl(logprobs, batch.ref_logprobs.float())
            if cfg.kl_coef > 0 and self.kl_in_loss():
                per_token = per_token + cfg.kl_coef * kl
            stats["kl"] = float(masked_mean(kl.detach(), mask))
        if entropy is not None:
            if cfg.entropy_coef > 0:
                per_token = per_token - cfg.entropy_coef * entropy
            stats["entropy"] = float(masked_mean(entropy.detach(), mask))
        loss = (per_token * mask).sum() / denom
        with torch.no_grad():
            stats.update({
                "policy_loss": float(masked_mean(pg, mask)),
                "clip_frac": float(masked_mean((clipped > unclipped).float(), mask)),
                "approx_kl": float(masked_mean(0.5 * log_ratio ** 2, mask)),
                "ratio_mean": float(masked_mean(ratio, mask)),
                "behaviour_weight_mean": float(masked_mean(weight, mask)),
                "behaviour_capped_frac": float(masked_mean(capped.float(), mask)),
            })
        return loss, stats

    def value_loss(self, batch: RLBatch, values: torch.Tensor,
                   denominator: torch.Tensor | float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """The critic's loss; only algorithms with a critic define it."""
        raise NotImplementedError(f"algorithm {self.name!r} has no critic")
