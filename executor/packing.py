"""Packed sequences: a padded batch's real tokens laid end to end, and token-budget micro-batches.

A padded [B, T] batch spends compute on T − len(row) pad tokens per row; with long-tailed response
lengths the longest row sets T and most of the batch is padding. Packing keeps only attended tokens,
concatenated into one row of N = Σ len tokens, with position ids restarting at 0 for each sequence.
The executor's attention (executor/varlen_attention.py) splits a packed row at each restart and
attends within each sequence (flash attention's varlen kernels do the same from these positions),
so each sequence sees exactly what it sees padded. Per-token results (log-probs,
entropies, values) are scattered back to the padded layout, so losses and advantages stay in the
trainer's shifted [B, T-1] space and are computed by the same code as unpadded batches.

Positions follow `hetprof.generation.position_ids` (the count of attended tokens before a token),
so a left-padded row and its packed copy see the same RoPE phases.
"""

from __future__ import annotations

import dataclasses

import torch

from hetprof.tokenbudget import micro_batch_count, micro_batches_by_tokens

__all__ = ["PackedRows", "micro_batch_count", "micro_batches_by_tokens", "pack", "packed_sequence_scores",
           "packed_values", "shifted_targets", "unpack"]


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


def packed_values(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  max_tokens: int | None = None) -> torch.Tensor:
    """A scalar-head model's per-position outputs [B, T] through packed forwards (0 at pad positions).

    `model` is called as `model(ids, None, positions=...)` (modeling.ScalarHeadModel, possibly
    wrapped by DDP); at most `max_tokens` tokens per forward, one forward when None.
    """
    n = input_ids.shape[0]
    groups = [list(range(n))] if max_tokens is None else micro_batches_by_tokens(
        attention_mask.sum(1).tolist(), max_tokens)
    parts = []
    for group in groups:
        rows = torch.tensor(group, dtype=torch.long, device=input_ids.device)
        packed = pack(input_ids[rows], attention_mask[rows])
        values = model(packed.input_ids, None, positions=packed.position_ids)[0]
        parts.append((rows, unpack(values, packed)))
    if len(parts) == 1:
        return parts[0][1]
    out = parts[0][1].new_zeros(input_ids.shape)
    return out.index_put((torch.cat([p[0] for p in parts]),), torch.cat([p[1] for p in parts]))


def packed_sequence_scores(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                           max_tokens: int | None = None) -> torch.Tensor:
    """One scalar per sequence read at its last attended token, as `ScalarHeadModel.sequence_scores`."""
    values = packed_values(model, input_ids, attention_mask, max_tokens)
    t = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    last = (attention_mask.bool() * t).amax(dim=1)
    return values.gather(1, last[:, None]).squeeze(1)


# A packed batch whose mean length is within this fraction of the plan's is recorded at the plan's:
# batch-to-batch spread of a few tokens is not other work, and the plan's length is the shape the
# profiler measured (a row a few tokens off would be compared with the smooth fit, not that point).
PRICED_LENGTH_TOLERANCE = 0.1


def priced_pass(attention_mask: torch.Tensor, budget: int | None, groups: int = 1,
                passes: float | None = None, priced_length: float | None = None) -> tuple[int, int, float]:
    """(sequences, tokens, packs): the shape one of `groups` equal parts (a learner's mini-batches)
    of these rows is priced at (planner/taskcosts.py), and how many of that shape its time holds.

    Padded: the part's rows at the batch's width, once. Packed: `passes` micro-batches (default: as
    many as the budget fills for a part) are priced as one pack of ceil(part / passes) sequences at
    their mean length, times part / pack sequences; so a run's time over `packs` is one pack's time,
    the very quantity the plan multiplied (the learner's real pass count would leave out the pack
    fraction the plan scales by). The length is the plan's mean, `priced_length`, when the rows' mean
    is within PRICED_LENGTH_TOLERANCE of it, else the rows' own.
    """
    rows, width = attention_mask.shape
    part = -(-rows // max(1, groups))
    if budget is None:
        return part, width, 1.0
    lengths = attention_mask.sum(1)
    if passes is None:
        passes = micro_batch_count(lengths[:part].tolist(), budget)
    per = -(-part // max(1, round(float(passes))))
    mean = float(lengths.float().mean())
    if priced_length is not None and abs(mean - priced_length) <= PRICED_LENGTH_TOLERANCE * priced_length:
        mean = priced_length
    return per, max(1, round(mean)), part / per
