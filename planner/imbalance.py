"""The rank holding a mini-batch's longest sequence decides its optimizer step.

Token-balanced micro-batches (verl's dynamic batch size, packed training) give every data-parallel
group about the same tokens, but a sequence is never split across groups (within one, Ulysses
sequence parallelism splits it over its ranks): a group holding one sequence longer than a group's
fair share of the mini-batch takes that long, and the others wait for it at the gradient sync.
"""

from __future__ import annotations

import math

import numpy as np


def longest_sequence_factor(lengths: np.ndarray, mini_batches: int, groups: int) -> float:
    """How much longer a pass over `lengths` (each sequence's tokens) takes than its mean tokens per
    group say, in `mini_batches` optimizer steps whose sequences are balanced over `groups` groups:
    a step takes max(its tokens / groups, its longest sequence), where the replicas are priced at
    its sequences per group (rounded up to whole sequences) of its mean length. The step's longest sequences are
    spread one per mini-batch (a shuffled batch rarely draws two into one); 1.0 when nothing waits."""
    tokens = np.sort(np.asarray(lengths, dtype=float))[::-1]
    if groups <= 1 or not len(tokens) or tokens.sum() <= 0:
        return 1.0
    steps = [tokens[i::max(1, mini_batches)] for i in range(max(1, mini_batches))]
    # what the replicas are priced at: whole sequences of the mean length, at least one per group
    fair = [math.ceil(len(step) / groups) * step.mean() for step in steps if len(step)]
    actual = sum(max(share, step[0]) for share, step in zip(fair, (s for s in steps if len(s)), strict=True))
    return actual / sum(fair)
