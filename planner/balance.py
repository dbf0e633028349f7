"""Batch shares balanced to replica speed: the min-max split of a step's sequences over replicas.

Pure arithmetic on each replica kind's time-versus-batch function, kept apart from the layouts
that use it so the searches and the tests can call it on plain functions.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Sequence


def largest_batch_within(seconds_at, limit: float, total: int) -> int:
    """Most sequences (0..total) a replica finishes within `limit` (its time grows with batch)."""
    lo, hi = 0, total
    while lo < hi:
        mid = (lo + hi + 1) // 2
        t = seconds_at(mid)
        if t <= limit and math.isfinite(t):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _most_fitting(fits, total: int) -> int:
    """Largest batch in 0..total that fits (memory grows with the batch)."""
    lo, hi = 0, total
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


class Curve:
    """A replica kind's time against its batch, from a geometric sample of batches.

    The cost model is exact but not free, and balancing asks for many batch sizes; sampling
    1, 2, 4, … up to the most that fits in memory and interpolating (kept monotone) costs a
    dozen calls per kind instead of hundreds. The simulator judges the final shares exactly.
    """

    def __init__(self, seconds_at, total: int) -> None:
        fits = getattr(seconds_at, "fits", None)
        self.most = _most_fitting(fits, total) if fits else largest_batch_within(seconds_at, math.inf, total)
        points = sorted({min(self.most, 1 << i) for i in range(total.bit_length() + 1)} | {self.most}) \
            if self.most else []
        self.b = [0] + points
        self.t = [0.0]
        for b in points:
            self.t.append(max(self.t[-1], seconds_at(b)))

    def at(self, b: float) -> float:
        if b <= 0:
            return 0.0
        if b > self.most:
            return math.inf
        i = bisect.bisect_left(self.b, b)
        if self.b[i] == b:
            return self.t[i]
        b0, b1, t0, t1 = self.b[i - 1], self.b[i], self.t[i - 1], self.t[i]
        return t0 + (t1 - t0) * (b - b0) / (b1 - b0)

    def capacity(self, limit: float) -> int:
        """Most sequences finished within `limit` on the interpolated curve."""
        if not self.most or limit < self.t[1] - 1e-15:
            return 0
        i = bisect.bisect_right(self.t, limit) - 1
        if i >= len(self.b) - 1:
            return self.most
        b0, b1, t0, t1 = self.b[i], self.b[i + 1], self.t[i], self.t[i + 1]
        return int(b0 + (b1 - b0) * (limit - t0) / (t1 - t0)) if t1 > t0 else b1


def balance_shares(seconds_at: Sequence, total: int, iterations: int = 60) -> list[int] | None:
    """Sequences per replica minimising the slowest replica's time (min-max, integer).

    `seconds_at[i](b)` is replica i's time for b sequences; replicas passing the same function
    are one kind and are balanced together. Generation time is far from linear in the batch
    (decode is bandwidth-bound and the longest response sets the pace), so shares are not
    proportional to speed: the finishing time T is bisected and each replica takes as many
    sequences as it can finish by T. A replica too slow for even one sequence by the optimal T
    gets none (the caller drops it rather than let it straggle). Times are infinite where a
    batch does not fit in memory; None if the replicas cannot hold the batch at all.
    """
    n = len(seconds_at)
    if n == 0:
        return []
    kinds: dict[int, Curve] = {}
    for f in seconds_at:
        if id(f) not in kinds:
            kinds[id(f)] = f if isinstance(f, Curve) else Curve(f, total)
    curves = [kinds[id(f)] for f in seconds_at]
    copies: dict[int, int] = {}
    for f in seconds_at:
        copies[id(f)] = copies.get(id(f), 0) + 1
    distinct = [(kinds[k], m) for k, m in copies.items()]
    if sum(c.most * m for c, m in distinct) < total:
        return None
    lo, hi = 0.0, max(c.at(c.most) for c, _ in distinct if c.most)
    for _ in range(iterations):
        mid = (lo + hi) / 2
        if sum(c.capacity(mid) * m for c, m in distinct) >= total:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-9 * hi:
            break
    counts = [c.capacity(hi) for c in curves]
    _settle(curves, counts, total)
    return counts


def _settle(curves: Sequence[Curve], counts: list[int], total: int) -> None:
    """Round `counts` to sum to `total` in place, one sequence at a time: a shortfall goes to the
    replica finishing its next sequence first, a surplus comes from the one slowest at its current
    load (ties to the lowest index). Heaps keep each step O(log n) on replica-rich layouts."""
    short = total - sum(counts)
    if short > 0:                       # rounding on the interpolated curve: top up the fastest finisher
        heap = [(c.at(k + 1), j) for j, (c, k) in enumerate(zip(curves, counts, strict=True))]
        heapq.heapify(heap)
        for _ in range(short):
            _, i = heapq.heappop(heap)
            counts[i] += 1
            heapq.heappush(heap, (curves[i].at(counts[i] + 1), i))
    surplus = -short
    if surplus > 0:                     # take the surplus from whoever is slowest at its current load
        heap = [(-c.at(k), j) for j, (c, k) in enumerate(zip(curves, counts, strict=True)) if k > 0]
        heapq.heapify(heap)
        for _ in range(surplus):
            _, i = heapq.heappop(heap)
            counts[i] -= 1
            if counts[i] > 0:
                heapq.heappush(heap, (-curves[i].at(counts[i]), i))
