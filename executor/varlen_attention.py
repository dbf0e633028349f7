"""Variable-length attention for packed sequences: each sequence attends only to itself, at its own cost.

A packed row (executor/packing.py) holds several sequences end to end, marked by position ids that
restart at 0. transformers' `sdpa` keeps them apart with an N × N block-diagonal mask over the
whole row, so attention costs N² — more than the padded batch it replaces when a pack is long.
This implementation (registered as `VARLEN_ATTENTION`, the executor's default) splits the row at
each restart and runs causal SDPA per sequence: Σ len² work, the CPU counterpart of flash
attention's varlen kernels. Inputs with a padding mask, a cache or one sequence take transformers'
own SDPA path unchanged, so unpacked forwards compute exactly what `sdpa` computes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

VARLEN_ATTENTION = "hetprof_varlen"


def sequence_starts(position_ids: torch.Tensor) -> list[int]:
    """Where each packed sequence begins in a [1, N] row of restarting positions, plus N at the end."""
    row = position_ids[0]
    restarts = (row[1:] <= row[:-1]).nonzero().squeeze(1) + 1
    return [0, *restarts.tolist(), int(row.shape[0])]


def varlen_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                             position_ids: torch.Tensor | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """Attention over [1, heads, N, d] packed states, one causal SDPA per sequence; else `sdpa`'s."""
    packed = (attention_mask is None and position_ids is not None and query.shape[0] == 1
              and query.shape[2] == key.shape[2] == position_ids.shape[-1])
    starts = sequence_starts(position_ids) if packed else []
    if len(starts) <= 2:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      position_ids=position_ids, **kwargs)
    gqa = query.shape[1] != key.shape[1]
    p = dropout if module.training else 0.0
    parts = [F.scaled_dot_product_attention(query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], dropout_p=p,
                                            is_causal=True, scale=scaling, enable_gqa=gqa)
             for a, b in zip(starts[:-1], starts[1:], strict=True)]
    return torch.cat(parts, dim=2).transpose(1, 2).contiguous(), None


def varlen_mask(*args, attention_mask: torch.Tensor | None = None, config=None, **kwargs) -> torch.Tensor | None:
    """No mask for unpadded input (the attention splits packed rows itself); `sdpa`'s mask otherwise.
    Sliding-window models keep `sdpa`'s mask, whose window the per-sequence path would not apply."""
    if attention_mask is None and not getattr(config, "use_sliding_window", False):
        return None
    return sdpa_mask(*args, attention_mask=attention_mask, config=config, **kwargs)


AttentionInterface.register(VARLEN_ATTENTION, varlen_attention_forward)
AttentionMaskInterface.register(VARLEN_ATTENTION, varlen_mask)
