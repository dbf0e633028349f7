"""Uneven data-parallel batch shares turned into whole sequences per replica.

The planner balances a task's batch across unequal devices with fractional shares (0.6 / 0.4); the
runtime needs integer counts that add up to the batch exactly. Largest-remainder rounding keeps
every count within one of its exact share, and a floor (e.g. one sequence per mini-batch) keeps a
replica from receiving nothing, which would leave its DDP all-reduce waiting for gradients.
Packed passes (executor/models/packing.py) cost their tokens, not their rows: `token_share_slices` cuts
the same consecutive slices where the running token count meets each replica's share.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

from hetprof.errors import ExecutionError


def split_counts(total: int, shares: Sequence[float], minimum: int = 0) -> list[int]:
    """Integer counts summing to `total`, proportional to `shares`, each at least `minimum`."""
    n = len(shares)
    if n == 0:
        raise ExecutionError("cannot split a batch over zero replicas")
    if total < minimum * n:
        raise ExecutionError(f"a batch of {total} cannot give each of {n} replicas at least {minimum}")
    weight = sum(shares)
    if weight <= 0 or any(s < 0 for s in shares):
        raise ExecutionError(f"batch shares must be non-negative and not all zero, got {list(shares)}")
    spare = total - minimum * n
    exact = [spare * s / weight for s in shares]
    counts = [math.floor(x) for x in exact]
    order = sorted(range(n), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[: spare - sum(counts)]:
        counts[i] += 1
    return [c + minimum for c in counts]


def row_slices(counts: Sequence[int]) -> list[slice]:
    """Consecutive slices of a batch, one per replica."""
    out, start = [], 0
    for c in counts:
        out.append(slice(start, start + c))
        start += c
    return out


def share_slices(total: int, shares: Sequence[float], minimum: int = 1) -> list[slice]:
    """Each replica's rows of a batch of `total`: consecutive slices sized by `split_counts`."""
    return row_slices(split_counts(total, shares, minimum=minimum))


def token_share_slices(lengths: Sequence[int], shares: Sequence[float], minimum: int = 1) -> list[slice]:
    """Consecutive slices of a batch whose token counts (`lengths` per row) follow `shares`, each of at
    least `minimum` rows: each cut goes where the running token count comes closest to its target."""
    n, replicas = len(lengths), len(shares)
    split_counts(n, shares, minimum)  # the same refusals as a split by rows
    weight = sum(shares)
    running = [0]
    for length in lengths:
        running.append(running[-1] + max(0, int(length)))
    total, cuts, target = running[-1], [0], 0.0
    for k, share in enumerate(shares[:-1]):
        target += total * share / weight
        lo, hi = cuts[-1] + minimum, n - minimum * (replicas - k - 1)
        cut = bisect.bisect_left(running, target, lo, hi + 1)
        if cut > lo and (cut > hi or target - running[cut - 1] <= running[cut] - target):
            cut -= 1
        cuts.append(min(max(cut, lo), hi))
    cuts.append(n)
    return [slice(a, b) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
