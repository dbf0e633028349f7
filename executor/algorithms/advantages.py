"""Advantage estimators as pure tensor functions (so each is tested against a hand computation).

All tensors are in the trainer's shifted space [B, T-1]: column t is the action "emit token t+1",
taken in the state "tokens ≤ t". A response occupies one contiguous run of columns per row.
"""

from __future__ import annotations

import torch


def group_normalised(rewards: torch.Tensor, group_size: int, scale_std: bool = True,
                     eps: float = 1e-6) -> torch.Tensor:
    """GRPO: each response's reward minus its group's mean, over the group's std (per sequence, [B]).

    Responses to one prompt are consecutive rows. The result sums to zero within each group, so
    the group's baseline costs no critic, and a group of equal rewards gets exactly zero. The std is
    the population std (divide by n, as DeepSeekMath's normalisation reads; TRL divides by n−1).
    `scale_std=False` is Dr. GRPO's unbiased variant.
    """
    if rewards.dim() != 1:
        raise ValueError("rewards must be one scalar per sequence")
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"batch of {rewards.numel()} is not a whole number of groups of {group_size}")
    grouped = rewards.float().view(-1, group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if scale_std and group_size > 1:
        centred = centred / (grouped.std(dim=1, unbiased=False, keepdim=True) + eps)
    # A group whose rewards are all equal carries no signal: exactly 0. In float32 its mean can be
    # one ulp off the common value, and that residue over (tiny std + eps) is an O(1) advantage.
    tied = (grouped == grouped[:, :1]).all(dim=1, keepdim=True)
    return centred.masked_fill(tied, 0.0).reshape(-1)


def terminal_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token rewards [B, L] with each sequence's reward on its last response token, 0 elsewhere."""
    cols = torch.arange(mask.shape[1], device=mask.device)
    last = (mask.bool() * cols).amax(dim=1)
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    has = mask.bool().any(dim=1)
    out[has, last[has]] = rewards.float()[has]
    return out


def gae(token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float,
        lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over each row's response run; returns (advantages, returns).

    δ_t = r_t + γ V_{t+1} − V_t and A_t = δ_t + γλ A_{t+1}, with V = 0 after the last response token
    (the episode ends there). Columns outside the response get 0.
    """
    m = mask.float()
    values = values.float() * m
    adv = torch.zeros_like(values)
    running = torch.zeros(values.shape[0], device=values.device)
    next_value = torch.zeros_like(running)
    for t in range(values.shape[1] - 1, -1, -1):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        running = (delta + gamma * lam * running) * m[:, t]
        adv[:, t] = running
        next_value = values[:, t]
    return adv, adv + values


def whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """Normalise x over the masked entries to unit variance (and zero mean unless told otherwise)."""
    m = mask.float()
    n = m.sum().clamp(min=1.0)
    mean = (x * m).sum() / n
    var = (((x - mean) * m) ** 2).sum() / n
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * m
