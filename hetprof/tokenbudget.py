"""Token-budget micro-batches: which sequences share one packed forward of at most N tokens.

The executor packs by these groups (executor/packing.py) and the planner counts them to price a
packed step (planner/taskcosts.py); both call this one function so the count priced is the count run.
The profiler's workload grid (profiler/workloadgrid.py) measures the shapes that count implies.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

import numpy as np


def micro_batches_by_tokens(lengths: Sequence[int], budget: int, count: int = 1) -> list[list[int]]:
    """Sequence indices grouped into micro-batches of at most `budget` tokens, at least `count` of them.

    First-fit decreasing fills as few micro-batches as the budget allows (a sequence longer than the
    budget gets one of its own); then the heaviest splittable group is halved until there are
    `count`, and groups stay empty only when there are fewer sequences than `count`. Data-parallel
    replicas pass the same `count` so every replica runs the same number of forward/backward passes.
    Indices inside a group keep their batch order.
    """
    if budget < 1:
        raise ValueError(f"a micro-batch token budget must be at least 1, got {budget}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    loads: list[int] = []
    for i in order:
        slot = next((g for g, load in enumerate(loads) if load + lengths[i] <= budget), None)
        if slot is None:
            groups.append([])
            loads.append(0)
            slot = len(groups) - 1
        groups[slot].append(i)
        loads[slot] += lengths[i]
    heap = [(-load, g) for g, load in enumerate(loads) if len(groups[g]) > 1]
    heapq.heapify(heap)
    while len(groups) < count and heap:
        _, g = heapq.heappop(heap)
        members = groups[g]
        half = _balanced_half(members, lengths)
        groups[g] = [i for i in members if i not in half]
        groups.append(sorted(half))
        for idx in (g, len(groups) - 1):
            if len(groups[idx]) > 1:
                heapq.heappush(heap, (-sum(lengths[i] for i in groups[idx]), idx))
    groups += [[] for _ in range(count - len(groups))]
    return [sorted(g) for g in groups]


def _balanced_half(members: list[int], lengths: Sequence[int]) -> set[int]:
    """About half the tokens of a group (greedy, longest first), never all of its sequences."""
    target = sum(lengths[i] for i in members) / 2
    half: set[int] = set()
    taken = 0
    for i in sorted(members, key=lambda i: (-lengths[i], i)):
        if len(half) == len(members) - 1:
            break
        if not half or taken + lengths[i] <= target:
            half.add(i)
            taken += lengths[i]
    return half


def micro_batch_count(lengths: Sequence[int], budget: int) -> int:
    """How many micro-batches of at most `budget` tokens `micro_batches_by_tokens` fills (at least one:
    an empty share still runs one zero-weight pass to meet its replicas' collectives)."""
    return len(micro_batches_by_tokens(lengths, budget))


def spread(sorted_lengths: np.ndarray, k: int, default: float = 0.0) -> np.ndarray:
    """`k` lengths that follow a sorted sample's distribution (evenly spaced quantiles of it)."""
    n = len(sorted_lengths)
    if n == 0:
        return np.full(k, default)
    idx = np.minimum(((np.arange(k) + 0.5) * n / k).astype(int), n - 1)
    return sorted_lengths[idx]


def packed_shape(prompt: float, sorted_responses: np.ndarray, sequences: int, budget: int) -> tuple[int, int]:
    """(micro-batches, sequences per micro-batch) of a packed pass over `sequences` sequences whose
    responses follow `sorted_responses` after a `prompt`-token prompt: how the planner prices it and
    the profiler measures it (each micro-batch as that many sequences at the mean lengths)."""
    k = max(1, int(sequences))
    lengths = np.rint(prompt + spread(sorted_responses, k)).astype(int).tolist()
    m = min(micro_batch_count(lengths, budget), k)
    return m, math.ceil(k / m)
