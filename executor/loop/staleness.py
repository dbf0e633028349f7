"""Staleness control for async RL: generation may run at most k weight versions ahead of training.

Every rank walks the same static schedule, which is what keeps the collectives of separate roles
matched without a coordinator: at loop step s a generator produces batch s, and the rest of the
pipeline (inference, training, weight sync) works on batch s - k. Batch s is therefore generated
with weight version max(0, s - k) — the weights after s - k optimizer steps — and trained at
version s, so no trained sample is more than k versions old. k = 0 is the synchronous mode.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from hetprof.errors import ExecutionError


@dataclasses.dataclass(frozen=True)
class Step:
    generate: int | None  # batch index generated at this step, if any
    consume: int | None  # batch index inferred/trained/synced at this step, if any


def schedule(start: int, iterations: int, k: int) -> Iterator[Step]:
    """The loop every rank walks for batches [start, iterations) with staleness bound k."""
    if k < 0:
        raise ValueError("staleness bound must be >= 0")
    for s in range(start, iterations + k):
        gen = s if s < iterations else None
        use = s - k if s - k >= start else None
        yield Step(gen, use)


def generation_version(batch: int, start: int, k: int) -> int:
    """The weight version a generator holds when it generates `batch` under this schedule.

    After a resume at `start` the generators receive version `start` first, so early batches are
    never older than the checkpoint they resumed from.
    """
    return max(start, batch - k)


class VersionCounter:
    """The trainer's weight version (optimizer steps applied), with the invariant check per batch."""

    def __init__(self, version: int = 0, bound: int = 0):
        self.version = version
        self.bound = bound

    def staleness(self, sample_versions: list[int]) -> list[int]:
        """Per-sample staleness at training time; raises if any exceeds the bound (a runtime bug)."""
        ages = [self.version - v for v in sample_versions]
        too_old = [a for a in ages if a > self.bound or a < 0]
        if too_old:
            raise ExecutionError(f"staleness bound violated: samples {max(too_old)} versions old at trainer "
                                 f"version {self.version} (bound k = {self.bound})")
        return ages

    def advance(self) -> int:
        self.version += 1
        return self.version
