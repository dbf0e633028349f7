"""Uneven data-parallel batch shares turned into whole sequences per replica.

The planner balances a task's batch across unequal devices with fractional shares (0.6 / 0.4); the
runtime needs integer counts that add up to the batch exactly. Largest-remainder rounding keeps
every count within one of its exact share, and a floor (e.g. one sequence per mini-batch) keeps a
replica from receiving nothing, which would leave its DDP all-reduce waiting for gradients.
"""

from __future__ import annotations

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
