"""Ulysses sequence parallelism: a group of ranks runs each packed row together, a slice of its
tokens each, and swaps tokens for heads around attention.

A packed row (hetprof/runtime/packedpass.py) is padded to a multiple of the group's size (the pad is
a sequence of its own, so no real token attends to it) and each rank holds one contiguous slice of
it: embeddings, MLPs, norms and the LM head run on 1/size of the tokens. Attention needs whole
sequences, so an all-to-all first trades the token split for a head split (every rank: all tokens,
heads/size of q, k and v), the varlen attention runs per sequence exactly as on one rank, and a
second all-to-all trades back (DeepSpeed-Ulysses; verl's ulysses_sequence_parallel_size).

Per-token results (log-probs, values) are all-gathered over the group, so every rank computes the
loss of the whole group's rows; the gather's backward keeps each rank's own slice, so the group's
gradients add up to the one-rank gradient of that loss (the learner's denominators count the
group's tokens once: executor/algorithms/replicas.py).

The attention is registered as `ULYSSES_ATTENTION`: a model built with it runs the varlen attention
unchanged unless a forward passes `sequence_shard`, which reaches every attention layer through
transformers' keyword arguments.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from hetprof.runtime.varlen_attention import varlen_attention_forward, varlen_mask

ULYSSES_ATTENTION = "hetprof_ulysses"


@dataclasses.dataclass(frozen=True)
class SequenceParallel:
    """A Ulysses group: its process group, its size and this rank's index in it."""

    group: dist.ProcessGroup
    size: int
    index: int

    @classmethod
    def of(cls, group: dist.ProcessGroup) -> SequenceParallel:
        return cls(group, dist.get_world_size(group), dist.get_rank(group))


@dataclasses.dataclass(frozen=True)
class SequenceShard:
    """This rank's slice [start, start + width) of a packed row padded to `padded` tokens (`tokens`
    real ones), and the whole row's restarting positions, where attention splits it."""

    input_ids: torch.Tensor      # [1, width]
    position_ids: torch.Tensor   # [1, width]
    row_positions: torch.Tensor  # [1, padded]
    start: int
    tokens: int
    group: SequenceParallel

    @property
    def width(self) -> int:
        return int(self.input_ids.shape[1])

    def local(self, where: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Of packed-row indices `where`: which fall in this slice, and their indices within it."""
        mine = (where >= self.start) & (where < self.start + self.width)
        return mine, where[mine] - self.start

    def gather(self, values: torch.Tensor) -> torch.Tensor:
        """Per-token `values` [width, ...] of every rank's slice, as the row's first `tokens` [tokens, ...]."""
        return _GatherSlices.apply(values.contiguous(), self.group)[:self.tokens]


def shard_row(input_ids: torch.Tensor, position_ids: torch.Tensor, group: SequenceParallel) -> SequenceShard:
    """This rank's slice of a packed row [1, N]: the row padded to a multiple of the group's size
    with a sequence of its own (positions from 0), cut in equal consecutive slices."""
    tokens = int(input_ids.shape[1])
    pad = -tokens % group.size
    if pad:
        input_ids = torch.cat([input_ids, input_ids.new_zeros(1, pad)], dim=1)
        position_ids = torch.cat([position_ids, torch.arange(pad, device=position_ids.device)[None]], dim=1)
    width = (tokens + pad) // group.size
    start = group.index * width
    return SequenceShard(input_ids[:, start:start + width], position_ids[:, start:start + width], position_ids,
                         start, tokens, group)


class _AllToAll(torch.autograd.Function):
    """all_to_all_single over equal slices of dim 0; its gradient travels back the same way."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        x = x.contiguous()  # the output takes the input's strides: both laid out as the collective reads them
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous()
        out = torch.empty_like(grad)
        dist.all_to_all_single(out, grad, group=ctx.group)
        return out, None


class _GatherSlices(torch.autograd.Function):
    """Every rank's equal slice along dim 0, in group order; the backward keeps this rank's slice of
    the gradient, since every rank computes the same loss from the gathered whole."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: SequenceParallel) -> torch.Tensor:
        ctx.index, ctx.width = group.index, x.shape[0]
        parts = [torch.empty_like(x) for _ in range(group.size)]
        dist.all_gather(parts, x, group=group.group)
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad[ctx.index * ctx.width:(ctx.index + 1) * ctx.width], None


def heads_for_tokens(states: torch.Tensor, group: SequenceParallel) -> torch.Tensor:
    """[1, heads, width, d] of this rank's tokens → [1, heads/size, size × width, d]: the whole row for
    this rank's share of the heads (rank i gets heads [i·heads/size, (i+1)·heads/size))."""
    _, heads, width, dim = states.shape
    x = _AllToAll.apply(states[0].reshape(group.size, heads // group.size, width, dim), group.group)
    return x.permute(1, 0, 2, 3).reshape(1, heads // group.size, group.size * width, dim)


def tokens_for_heads(out: torch.Tensor, group: SequenceParallel) -> torch.Tensor:
    """[1, size × width, heads/size, d] attention output of the whole row → [1, width, heads, d]:
    this rank's tokens with every head, as transformers' attention returns them."""
    _, tokens, heads, dim = out.shape
    width = tokens // group.size
    x = _AllToAll.apply(out[0].reshape(group.size, width, heads, dim), group.group)
    return x.permute(1, 0, 2, 3).reshape(1, width, group.size * heads, dim)


def ulysses_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                              attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                              sequence_shard: SequenceShard | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """Attention over this rank's slice of a packed row (module docstring); the varlen attention's
    own when the forward passes no `sequence_shard`."""
    if sequence_shard is None:
        return varlen_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                        **kwargs)
    group = sequence_shard.group
    q, k, v = (heads_for_tokens(t, group) for t in (query, key, value))
    kwargs["position_ids"] = sequence_shard.row_positions
    out, _ = varlen_attention_forward(module, q, k, v, None, dropout=dropout, scaling=scaling, **kwargs)
    return tokens_for_heads(out, group), None


AttentionInterface.register(ULYSSES_ATTENTION, ulysses_attention_forward)
AttentionMaskInterface.register(ULYSSES_ATTENTION, varlen_mask)
