"""Where the profiler measured a shape, the fitted model answers with that measurement.

A regression over a few hundred shapes trades accuracy at each for smoothness across all: on the
tiny CPU job the fit read the job's own training step (16 × 73 tokens, profiled 20 times with
`--workload`) 9% below its measured median, and its reference forward 6% below. Those are exactly
the shapes the planner then asks about, so a fitted entry also stores, per profiled shape, the
ratio of its target to the fit, and a query with the same features is answered by fit × ratio.
Shapes the profiler never ran still get the plain fit, so the held-out error `hetprof fit` reports
(on shapes kept out of the fit) is still the error for those.

Keys are feature vectors rounded to 9 significant digits: the features are a pure function of the
phase and the device type, so the same shape gives the same key on any machine, and a stored entry
holds only numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from hetprof.costmodels.runcalibration import FACTOR_RANGE

MAX_POINTS = 20_000  # a shared entry may not carry an unbounded table
DIGITS = 9


def point_key(x: Sequence[float]) -> tuple[float, ...]:
    """A feature vector as a hashable key that survives a JSON round trip."""
    return tuple(float(f"{float(v):.{DIGITS}g}") for v in x)


def corrections(x: np.ndarray, targets: np.ndarray, predicted: np.ndarray) -> list[list[float]]:
    """[features..., target / predicted] per profiled shape (ratios outside the run-factor range dropped:
    a fit that far off a shape it was trained on is not corrected by patching one point)."""
    out = []
    for row, y, p in zip(np.asarray(x, float), np.asarray(targets, float), np.asarray(predicted, float), strict=True):
        if p > 0 and math.isfinite(p) and math.isfinite(y) and FACTOR_RANGE[0] <= y / p <= FACTOR_RANGE[1]:
            out.append([*point_key(row), float(y / p)])
    return out


def ratio(table: dict[tuple[float, ...], float], x: Sequence[float]) -> float:
    """The stored ratio of a profiled shape's features, 1 for a shape the profiler never ran."""
    return table.get(point_key(x), 1.0) if table else 1.0


def apply(predicted: np.ndarray, x: np.ndarray, table: dict[tuple[float, ...], float]) -> np.ndarray:
    """`predicted` with each row that is a profiled shape multiplied by its stored ratio."""
    return np.asarray([p * ratio(table, row) for p, row in zip(predicted, x, strict=True)], float)


def as_table(rows: list[list[float]]) -> dict[tuple[float, ...], float]:
    """Rows as `corrections` makes them (or `load` has checked them) → the lookup table."""
    return {point_key(row[:-1]): float(row[-1]) for row in rows}


def load(raw: Any, n_features: int) -> dict[tuple[float, ...], float]:
    """The stored table, checked: a list of at most MAX_POINTS rows of n_features finite numbers ≥ 0
    and a ratio in the run-factor range. Raises ValueError naming what is wrong."""
    if raw is None:
        return {}
    if not isinstance(raw, list) or len(raw) > MAX_POINTS:
        raise ValueError(f"points must be a list of at most {MAX_POINTS} rows")
    for row in raw:
        if not isinstance(row, list) or len(row) != n_features + 1 or any(
                isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) for v in row):
            raise ValueError(f"each point must be {n_features + 1} finite numbers")
        if min(row[:-1]) < 0 or not FACTOR_RANGE[0] <= row[-1] <= FACTOR_RANGE[1]:
            raise ValueError(f"a point has a negative feature or a ratio outside {list(FACTOR_RANGE)}")
    return as_table(raw)
