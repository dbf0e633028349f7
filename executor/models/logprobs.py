"""Per-token log-probabilities of given sequences under a model (reference and training recompute).

The padded pass itself (`token_logprobs`) is the shared torch piece
hetprof/runtime/paddedpass.py, so the profiler times the very pass a run computes; the executor's
modules import it from here. The result is in "shifted" space: column t is log p(token t+1 | tokens ≤ t).
"""

from __future__ import annotations

import torch

from hetprof.runtime.paddedpass import token_logprobs

__all__ = ["first_response_column", "masked_mean", "token_logprobs"]


def first_response_column(mask: torch.Tensor) -> int:
    """The first shifted column any row's response occupies (0 when the mask is empty)."""
    cols = mask.bool().any(dim=0).nonzero()
    return int(cols[0]) if cols.numel() else 0


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of x where mask is set (0 where nothing is set), the token-mean RL losses use."""
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1.0)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1.0)
