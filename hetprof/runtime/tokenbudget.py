"""Token-budget micro-batches: which sequences share one packed forward of at most N tokens.

The executor packs by these groups (executor/algorithms/learner.py, hetprof/runtime/packedpass.py) and the planner
packs a sample of the workload's lengths with them to price a packed step (planner/taskcosts.py);
both call this one function so the packs priced are the packs run.
The profiler's workload grid (profiler/workloadgrid.py) measures the shapes that count implies.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from hetprof.specs.workload import LengthDist


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


# Pairs a pass's prompt quantiles with its response quantiles: a step draws the two independently,
# and pairing both in sorted order would make the longest prompts carry the longest responses.
PAIRING_SEED = 0


def step_prompts(prompt_len: LengthDist, prompts: int, seed: int = 0) -> np.ndarray:
    """A step's `prompts` prompt lengths drawn from `prompt_len` (seeded), sorted: the sample the
    planner packs and the profiler's workload grid measures, so both see the same packs."""
    return np.sort(prompt_len.sample(max(1, int(prompts)), np.random.default_rng(seed))).astype(float)


def sample_lengths(prompts: float | np.ndarray, sorted_responses: np.ndarray, sequences: int) -> list[int]:
    """Whole-token lengths of `sequences` sequences whose prompts follow the sorted sample `prompts`
    (or are all `prompts` tokens) and whose responses follow the sorted sample `sorted_responses`,
    paired by a fixed shuffle: the deterministic stand-in for a step's real lengths."""
    k = max(1, int(sequences))
    if np.ndim(prompts) == 0:
        lead = np.full(k, float(prompts))
    else:
        lead = spread(np.asarray(prompts, dtype=float), k)[np.random.default_rng(PAIRING_SEED).permutation(k)]
    return np.rint(lead + spread(sorted_responses, k)).astype(int).tolist()


def pack_groups(prompt: float | np.ndarray, sorted_responses: np.ndarray, sequences: int,
                budget: int) -> tuple[tuple[int, float, int], ...]:
    """The packs `micro_batches_by_tokens` makes of `sample_lengths`, grouped by how many sequences
    they hold: (sequences per pack, mean tokens per sequence in those packs, packs), most sequences
    first. A packed pass runs whole packs, so the planner prices each group's packs at their own
    tokens: the per-pass cost is paid as many times as the executor runs a pass."""
    lengths = sample_lengths(prompt, sorted_responses, sequences)
    tokens: dict[int, list[int]] = {}
    for group in micro_batches_by_tokens(lengths, budget):
        tokens.setdefault(len(group), []).append(sum(lengths[i] for i in group))
    return tuple((n, sum(t) / (n * len(t)), len(t)) for n, t in sorted(tokens.items(), reverse=True))


def packed_shape(prompt: float | np.ndarray, sorted_responses: np.ndarray, sequences: int, budget: int) -> tuple[int, int]:
    """(packs, sequences in the fullest pack) of a packed pass over `sequences` sequences whose
    responses follow `sorted_responses` after a `prompt`-token prompt (see `pack_groups`)."""
    return groups_shape(pack_groups(prompt, sorted_responses, sequences, budget), sequences)


def groups_shape(groups: tuple[tuple[int, float, int], ...], sequences: int) -> tuple[int, int]:
    """(packs, sequences in the fullest pack) of `sequences` sequences packed into `groups`
    (`pack_groups`): every pack holds the same share when padded to the fullest."""
    m = sum(count for _, _, count in groups)
    return m, math.ceil(max(1, int(sequences)) / m)


def mean_pack(sequences: int, packs: float, length: float) -> tuple[int, int]:
    """(sequences, tokens per sequence) of the average of `packs` packs holding `sequences` sequences
    of mean `length` tokens: a whole sequence count, and the length that gives it the average pack's
    tokens. A run records a packed pass's time over its packs at this shape, so the row is one pack's
    time at one pack's tokens, the unit the planner prices each pack at."""
    packs = max(1.0, float(packs))
    per = max(1, round(sequences / packs))
    return per, max(1, round(length * sequences / (packs * per)))
