"""Variable-length attention for packed sequences: each sequence attends only to itself, at its own cost.

A packed row (hetprof/runtime/packedpass.py) holds several sequences end to end, marked by position ids that
restart at 0. transformers' `sdpa` keeps them apart with an N × N block-diagonal mask over the
whole row, so attention costs N² — more than the padded batch it replaces when a pack is long.
This implementation (registered as `VARLEN_ATTENTION`, the executor's default and the model the
profiler's task rows run) splits the row at
each restart and runs causal SDPA per sequence: Σ len² work, the CPU counterpart of flash
attention's varlen kernels. Inputs with a padding mask, a cache or one sequence take transformers'
own SDPA path unchanged, so unpacked forwards compute exactly what `sdpa` computes. On a GPU with
the `flash_attn` package and half-precision states, a packed row goes to flash attention's varlen
kernel instead: one launch for all its sequences, from the same restarts.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

try:  # flash attention's varlen kernel: GPU builds only
    from flash_attn import flash_attn_varlen_func
except ImportError:  # CPU, or a GPU without the package: one causal SDPA per sequence
    flash_attn_varlen_func = None

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
    p = dropout if module.training else 0.0
    if flash_usable(query):
        return flash_varlen(query, key, value, starts, p, scaling), None
    gqa = query.shape[1] != key.shape[1]
    parts = [F.scaled_dot_product_attention(query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], dropout_p=p,
                                            is_causal=True, scale=scaling, enable_gqa=gqa)
             for a, b in zip(starts[:-1], starts[1:], strict=True)]
    return torch.cat(parts, dim=2).transpose(1, 2).contiguous(), None


def flash_usable(query: torch.Tensor) -> bool:
    """Whether flash attention's varlen kernel can take these states (it needs CUDA and fp16/bf16)."""
    return (flash_attn_varlen_func is not None and query.is_cuda
            and query.dtype in (torch.float16, torch.bfloat16))


def flash_varlen(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, starts: list[int], dropout: float,
                 scaling: float | None) -> torch.Tensor:
    """[1, heads, N, d] packed states through `flash_attn_varlen_func`, causal within each sequence
    between consecutive `starts`; [1, N, heads, d] as transformers' attention returns it (fewer key
    and value heads than query heads are the kernel's own GQA)."""
    bounds = torch.tensor(starts, dtype=torch.int32, device=query.device)
    longest = max(b - a for a, b in zip(starts[:-1], starts[1:], strict=True))
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [N, heads, d]
    out = flash_attn_varlen_func(q, k, v, bounds, bounds, longest, longest, dropout_p=dropout,
                                 softmax_scale=scaling, causal=True)
    return out[None]


def varlen_mask(*args, attention_mask: torch.Tensor | None = None, config=None, **kwargs) -> torch.Tensor | None:
    """No mask for unpadded input (the attention splits packed rows itself); `sdpa`'s mask otherwise.
    Sliding-window models keep `sdpa`'s mask, whose window the per-sequence path would not apply."""
    if attention_mask is None and not getattr(config, "use_sliding_window", False):
        return None
    return sdpa_mask(*args, attention_mask=attention_mask, config=config, **kwargs)


AttentionInterface.register(VARLEN_ATTENTION, varlen_attention_forward)
AttentionMaskInterface.register(VARLEN_ATTENTION, varlen_mask)
