"""Packed sequences beyond the log-prob pass: per-position values and sequence scores through packed
forwards, and the shape a packed pass is recorded at.

A padded [B, T] batch spends compute on T − len(row) pad tokens per row; with long-tailed response
lengths the longest row sets T and most of the batch is padding. Packing keeps only attended tokens
in one row with position ids restarting per sequence (`hetprof.runtime.packedpass`, which the profiler's
packed inference rows time as well), the attention keeps each sequence to itself
(hetprof/runtime/varlen_attention.py), and per-token results go back to the padded layout, so losses and
advantages stay in the trainer's shifted [B, T-1] space.
"""

from __future__ import annotations

import torch

from hetprof.runtime.packedpass import pack, unpack
from hetprof.runtime.tokenbudget import mean_pack, micro_batch_count, micro_batches_by_tokens
from hetprof.runtime.ulysses import SequenceParallel, shard_row


def packed_values(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  max_tokens: int | None = None, sequence_parallel: SequenceParallel | None = None) -> torch.Tensor:
    """A scalar-head model's per-position outputs [B, T] through packed forwards (0 at pad positions).

    `model` is called as `model(ids, None, positions=...)` (modeling.ScalarHeadModel, possibly
    wrapped by DDP); at most `max_tokens` tokens per forward, one forward when None. With
    `sequence_parallel` each forward runs on this rank's slice of the packed row and the values of
    every slice are gathered (hetprof/runtime/ulysses.py): every rank of the group returns the whole.
    """
    n = input_ids.shape[0]
    groups = [list(range(n))] if max_tokens is None else micro_batches_by_tokens(
        attention_mask.sum(1).tolist(), max_tokens)
    parts = []
    for group in groups:
        rows = torch.tensor(group, dtype=torch.long, device=input_ids.device)
        packed = pack(input_ids[rows], attention_mask[rows])
        if sequence_parallel is None:
            values = model(packed.input_ids, None, positions=packed.position_ids)[0]
        else:
            shard = shard_row(packed.input_ids, packed.position_ids, sequence_parallel)
            values = shard.gather(model(shard.input_ids, None, positions=shard.position_ids, sequence_shard=shard)[0])
        parts.append((rows, unpack(values, packed)))
    if len(parts) == 1:
        return parts[0][1]
    out = parts[0][1].new_zeros(input_ids.shape)
    return out.index_put((torch.cat([p[0] for p in parts]),), torch.cat([p[1] for p in parts]))


def packed_sequence_scores(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                           max_tokens: int | None = None, sequence_parallel: SequenceParallel | None = None
                           ) -> torch.Tensor:
    """One scalar per sequence read at its last attended token, as `ScalarHeadModel.sequence_scores`."""
    values = packed_values(model, input_ids, attention_mask, max_tokens, sequence_parallel)
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
    of these rows is recorded at, and how many passes of that shape its time holds.

    Padded: the part's rows at the batch's width, once. Packed: the `passes` packs the part really
    ran (default: as many as the budget fills for it), recorded as their average pack
    (hetprof.runtime.tokenbudget.mean_pack), so a run's time over `packs` is one pack's time at one pack's
    tokens: the unit the planner prices each of its whole packs at (planner/taskcosts.py). The
    length is the plan's mean, `priced_length`, when the rows' mean is within
    PRICED_LENGTH_TOLERANCE of it, else the rows' own.
    """
    rows, width = attention_mask.shape
    part = -(-rows // max(1, groups))
    if budget is None:
        return part, width, 1.0
    lengths = attention_mask.sum(1)
    if passes is None:
        passes = micro_batch_count(lengths[:part].tolist(), budget)
    mean = float(lengths.float().mean())
    if priced_length is not None and abs(mean - priced_length) <= PRICED_LENGTH_TOLERANCE * priced_length:
        mean = priced_length
    per, tokens = mean_pack(part, passes, mean)
    return per, tokens, max(1.0, float(passes))
