"""Arithmetic that turns cost-model answers for one call into a task's time: a packed mini-batch's
packs sharing one optimizer step, a pipeline stage's share of a call priced with the LM head, and a
generation task's finish curve. Pure functions of numbers, so planner/taskcosts.py stays the place
where layouts meet the cost model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from hetprof.specs.models import ModelShape
from hetprof.specs.vocabulary import TaskKind


def packed_seconds(packs: Sequence[tuple[float, float]], step_in_pass: float = 0.0) -> float:
    """One optimizer step's packed passes from (one pack's time, how many such packs) pairs: a
    training pass's time holds one optimizer step (`step_in_pass`), and the learner steps once per
    mini-batch, not once per pack, so every pack's step but one comes off."""
    count = sum(n for _, n in packs)
    if not count:
        return 0.0
    total = sum(seconds * n for seconds, n in packs)
    return total - (count - 1) * min(step_in_pass, min(seconds for seconds, _ in packs))


def layer_fraction(model: ModelShape, layers: int, last: bool) -> float:
    """Share of a stage's cost-model time that is its own: the LM head runs only on the last stage.

    The cost model prices every call with the head included; a middle stage's share is its layers'
    share of the per-token FLOPs.
    """
    if last:
        return 1.0
    body = layers * model.matmul_flops_per_token_per_layer()
    head = 2.0 * model.vocab * model.hidden
    return body / (body + head)


def finish_curve(kind: str, seconds: float, finish: list[tuple[float, ...]], chunks: int) -> tuple[float, ...]:
    """When each of `chunks` equal parts of a task's output is done: a generation task's from its replicas'
    `finish` times (samples leave in order, which lets the next stage start early), others evenly."""
    k = chunks
    if kind != TaskKind.GENERATION or not math.isfinite(seconds) or not any(finish):
        return tuple(seconds * (j + 1) / k for j in range(k))
    merged = np.sort(np.concatenate([np.asarray(f) for f in finish if f]))
    n = len(merged)
    points = [float(merged[min(n - 1, math.ceil((j + 1) * n / k) - 1)]) for j in range(k)]
    points[-1] = seconds
    return tuple(points)
