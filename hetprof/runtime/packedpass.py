"""One packed forward pass of a causal LM and its per-token log-probs: the code a run's reference and
log-prob passes execute, and the code the profiler's packed inference rows time.

A padded [B, T] batch spends compute on T − len(row) pad tokens per row; packing keeps only attended
tokens, concatenated into one row of N = Σ len tokens, with position ids restarting at 0 for each
sequence. The attention (hetprof/runtime/varlen_attention.py) splits a packed row at each restart and attends
within each sequence, so each sequence sees exactly what it sees padded. Per-token results are
scattered back to the padded layout, the trainer's shifted [B, T-1] space.

Why here and not in the executor: the profiler may not import the executor, and a row that times a
copy of this work instead of this work is a bias no fit recovers (a small model's pass spends about
a tenth of its time packing, scattering and taking log-probs around the forward: docs/DESIGN.md §10).

Positions follow `hetprof.runtime.generation.position_ids` (the count of attended tokens before a token),
so a left-padded row and its packed copy see the same RoPE phases.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch

from hetprof.runtime.tokenbudget import micro_batches_by_tokens

if TYPE_CHECKING:
    from hetprof.runtime.ulysses import SequenceParallel


@dataclasses.dataclass(frozen=True)
class PackedRows:
    """The attended tokens of a padded batch, end to end in one row."""

    input_ids: torch.Tensor      # [1, N]
    position_ids: torch.Tensor   # [1, N], restarting at 0 per sequence
    rows: torch.Tensor           # [N] padded row of each packed token
    columns: torch.Tensor        # [N] padded column of each packed token
    next_is_same: torch.Tensor   # [N] bool: the following packed token is this token's successor
    shape: tuple[int, int]       # the padded (B, T)

    @property
    def tokens(self) -> int:
        return int(self.input_ids.shape[1])


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> PackedRows:
    """The attended tokens of `input_ids` [B, T] concatenated row by row into one packed row."""
    mask = attention_mask.bool()
    rows, columns = mask.nonzero(as_tuple=True)  # row-major: each row's tokens in order
    positions = (mask.long().cumsum(-1) - 1)[rows, columns]
    same_row = rows[1:] == rows[:-1]
    adjacent = columns[1:] == columns[:-1] + 1
    next_is_same = torch.cat([same_row & adjacent, same_row.new_zeros(1)]) if len(rows) else same_row
    return PackedRows(input_ids=input_ids[rows, columns][None], position_ids=positions[None], rows=rows,
                      columns=columns, next_is_same=next_is_same, shape=tuple(input_ids.shape))


def unpack(values: torch.Tensor, packed: PackedRows, width: int | None = None,
           where: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token `values` [K] back in the padded layout [B, width] (zeros elsewhere).

    `where` [N] (bool) says which packed tokens `values` belongs to (default: all N).
    """
    b, t = packed.shape
    out = values.new_zeros(b, t if width is None else width)
    rows, cols = (packed.rows, packed.columns) if where is None else (packed.rows[where], packed.columns[where])
    return out.index_put((rows, cols), values)


def shifted_targets(packed: PackedRows, needed: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Which packed tokens predict a token of their own sequence, and that token.

    Column t of the shifted space is "emit token t+1", so packed token j scores packed token j+1 when
    both are consecutive tokens of one row. `needed` [B, T-1] restricts this to the columns a caller
    reads (e.g. the response mask), which lets the LM head skip the rest.
    """
    keep = packed.next_is_same.clone()
    if needed is not None:
        cols = packed.columns.clamp(max=needed.shape[1] - 1)
        keep &= needed.bool()[packed.rows, cols] & (packed.columns < needed.shape[1])
    where = keep.nonzero().squeeze(1)
    return where, packed.input_ids[0, where + 1]


def _scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    # Temperature 0 means greedy sampling, whose behaviour log-probs the generator reports at T = 1.
    logits = logits.float()
    return logits / temperature if temperature > 0 and temperature != 1.0 else logits


def logits_to_logprobs(logits: torch.Tensor, targets: torch.Tensor,
                       temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / T)[target], in fp32, without materialising the full log-softmax."""
    logits = _scaled(logits, temperature)
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of softmax(logits / T) per position, in fp32."""
    logp = torch.log_softmax(_scaled(logits, temperature), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def packed_token_logprobs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                          temperature: float = 1.0, with_entropy: bool = False, max_tokens: int | None = None,
                          needed: torch.Tensor | None = None, entropy_grad: bool = True,
                          sequence_parallel: SequenceParallel | None = None):
    """Per-token log-probs [B, T-1] of each next token through packed forwards of at most
    `max_tokens` tokens (None: one forward); with `with_entropy`, also the entropy [B, T-1].

    Same result as a padded forward in every column `needed` marks (default: every column whose token
    and next token are both attended); other columns are 0. The LM head runs only on the needed positions.
    With `sequence_parallel`, every rank of that Ulysses group passes the same rows and each forward
    runs on its slice of the packed row (hetprof/runtime/ulysses.py); every rank returns the whole result.
    """
    n, width = input_ids.shape
    groups = ([list(range(n))] if max_tokens is None
              else micro_batches_by_tokens(attention_mask.sum(1).tolist(), max_tokens))
    lp = torch.zeros(n, width - 1, device=input_ids.device)
    ent = torch.zeros_like(lp) if with_entropy else None
    parts = []
    for group in groups:
        rows = torch.tensor(group, dtype=torch.long, device=input_ids.device)
        packed = pack(input_ids[rows], attention_mask[rows])
        where, targets = shifted_targets(packed, needed[rows] if needed is not None else None)
        lp_of, ent_of = _packed_forward(model, packed, where, targets, temperature, with_entropy, entropy_grad,
                                        sequence_parallel)
        g_lp = unpack(lp_of, packed, width - 1, where)
        g_ent = unpack(ent_of, packed, width - 1, where) if with_entropy else None
        parts.append((rows, g_lp, g_ent))
    if len(parts) == 1 and len(parts[0][0]) == n:  # one group in batch order: keep the autograd graph simple
        return (parts[0][1], parts[0][2]) if with_entropy else parts[0][1]
    lp = lp.index_put((torch.cat([p[0] for p in parts]),), torch.cat([p[1] for p in parts]))
    if with_entropy:
        ent = ent.index_put((torch.cat([p[0] for p in parts]),), torch.cat([p[2] for p in parts]))
        return lp, ent
    return lp


def _packed_forward(model: Any, packed: PackedRows, where: torch.Tensor, targets: torch.Tensor, temperature: float,
                    with_entropy: bool, entropy_grad: bool, sequence_parallel: SequenceParallel | None
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) of the packed tokens `where` predicting `targets`: one forward of the
    whole row, or of this rank's slice of it, with every slice's values gathered over the group."""
    if sequence_parallel is None:
        logits = model(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False,
                       logits_to_keep=where).logits[0]
        ent = entropy_from_logits(logits if entropy_grad else logits.detach(), temperature) if with_entropy else None
        return logits_to_logprobs(logits, targets, temperature), ent
    from hetprof.runtime.ulysses import shard_row

    shard = shard_row(packed.input_ids, packed.position_ids, sequence_parallel)
    mine, local = shard.local(where)
    logits = model(input_ids=shard.input_ids, position_ids=shard.position_ids, use_cache=False,
                   logits_to_keep=local, sequence_shard=shard).logits[0]
    slots = logits.new_zeros(shard.width, dtype=torch.float32)
    lp = shard.gather(slots.index_put((local,), logits_to_logprobs(logits, targets[mine], temperature)))[where]
    if not with_entropy:
        return lp, None
    ent = entropy_from_logits(logits if entropy_grad else logits.detach(), temperature)
    return lp, shard.gather(slots.index_put((local,), ent))[where]
