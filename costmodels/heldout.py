"""Held-out error that tests extrapolation: folds that hold out whole shape ranges.

A random k-fold over profiled shapes mostly tests interpolation between neighbours; the planner
asks about shapes bigger than anything profiled. So each fold holds out a *range*: every row with
the largest batch, the longest sequence/context, the most layers, the smallest batch or length,
or a whole model. The model is fitted on the rest and scored on what it never saw. The family is
chosen inside each outer fold by the same scheme on its training rows (nested), so the reported
held-out error is not the error of a choice made on the held-out rows themselves.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from hetprof.costmodels.families import CANDIDATES, FAMILIES, Family

MIN_TRAIN_ROWS = 6


@dataclasses.dataclass(frozen=True)
class Fold:
    name: str
    test: np.ndarray  # boolean mask over rows


def mape(pred: np.ndarray, true: np.ndarray) -> float:
    """Mean absolute percentage error, as a fraction (0.07 = 7%)."""
    return float(np.mean(np.abs(pred - true) / true)) if len(true) else float("nan")


def range_folds(shapes: pd.DataFrame) -> list[Fold]:
    """Folds holding out the extremes of each varied shape column, and each model in turn.

    `shapes` has columns model, batch, length, layers (one row per shape). A fold is kept only
    when both sides are non-empty, the training side has at least MIN_TRAIN_ROWS rows, and it still
    varies along the held-out direction (see `_identifiable`).
    """
    folds: list[Fold] = []
    n = len(shapes)
    for col in ("batch", "length", "model", "layers"):  # a model fold is named before its layers twin
        values = shapes[col].to_numpy() if col != "model" else shapes[col].astype(str).to_numpy()
        if len(np.unique(values)) < 2:
            continue
        if col == "model":
            folds.extend(Fold(f"model {m}", values == m) for m in np.unique(values))
        else:
            folds.append(Fold(f"largest {col}", values == values.max()))
            folds.append(Fold(f"smallest {col}", values == values.min()))
    kept, seen = [], set()
    for f in folds:  # e.g. "most layers" and "model X" are the same rows when models differ in depth
        key = f.test.tobytes()
        if key in seen or not 0 < f.test.sum() < n or n - f.test.sum() < MIN_TRAIN_ROWS:
            continue
        if not _identifiable(shapes[~f.test], f.name):
            continue
        seen.add(key)
        kept.append(f)
    return kept


def _identifiable(train: pd.DataFrame, name: str) -> bool:
    """Whether the training side still shows a trend in the direction the fold extrapolates.

    Holding out the largest batch when only two batch sizes exist leaves one batch size to learn
    from: no fit can tell per-sequence from fixed cost then, so the fold would measure luck, not
    extrapolation. Likewise a model fold needs at least two other models (of different depth).
    """
    column = "model" if name.startswith("model ") else name.split()[-1]
    if train[column].nunique() < 2:
        return False
    return column != "model" or train["layers"].nunique() >= 2 or train["model"].nunique() >= 3


def _eligible(n: int, candidates: tuple[str, ...] = CANDIDATES) -> list[Family]:
    return [FAMILIES[c] for c in candidates if n >= FAMILIES[c].min_rows]


def cv_mape(family: Family, x: np.ndarray, y: np.ndarray, folds: list[Fold], seed: int = 0) -> float:
    """Pooled held-out MAPE of one family over the folds."""
    pred, true = [], []
    for fold in folds:
        train = ~fold.test
        params = family.fit(x[train], y[train], seed)
        pred.append(family.predict(params, x[fold.test]))
        true.append(y[fold.test])
    if not pred:
        return float("nan")
    return mape(np.concatenate(pred), np.concatenate(true))


def choose_family(x: np.ndarray, y: np.ndarray, shapes: pd.DataFrame, seed: int = 0
                  ) -> tuple[Family, dict[str, float]]:
    """The family with the lowest range-fold MAPE (nnls when no fold can be formed)."""
    folds = range_folds(shapes)
    scores = {f.name: cv_mape(f, x, y, folds, seed) for f in _eligible(len(y))} if folds else {}
    finite = {k: v for k, v in scores.items() if np.isfinite(v)}
    best = min(finite, key=finite.get) if finite else "nnls"
    return FAMILIES[best], scores


@dataclasses.dataclass
class HeldOut:
    mape: float
    n_folds: int
    predicted: np.ndarray  # one held-out prediction per row (NaN where never held out)
    per_fold: dict[str, float]
    chosen: dict[str, str]


def nested_heldout(x: np.ndarray, y: np.ndarray, shapes: pd.DataFrame, seed: int = 0,
                   progress: Callable[[str], None] | None = None) -> HeldOut:
    """Outer range folds; in each, the family is chosen on the training rows only."""
    folds = range_folds(shapes)
    predicted = np.full(len(y), np.nan)
    preds, trues, per_fold, chosen = [], [], {}, {}
    for fold in folds:
        train = ~fold.test
        family, _ = choose_family(x[train], y[train], shapes[train].reset_index(drop=True), seed)
        params = family.fit(x[train], y[train], seed)
        p = family.predict(params, x[fold.test])
        preds.append(p)
        trues.append(y[fold.test])
        per_fold[fold.name] = mape(p, y[fold.test])
        chosen[fold.name] = family.name
        predicted[fold.test] = np.where(np.isnan(predicted[fold.test]), p, predicted[fold.test])
        if progress:
            progress(f"{fold.name}: {family.name} {per_fold[fold.name]:.1%}")
    if not preds:
        return HeldOut(float("nan"), 0, predicted, {}, {})
    return HeldOut(mape(np.concatenate(preds), np.concatenate(trues)), len(folds), predicted, per_fold, chosen)


@dataclasses.dataclass
class FitSummary:
    """What `hetprof fit` reports about any fitted model, a task's or the grouped experts': where it
    applies, the family chosen and its held-out error, and the error columns of its table from the
    measured, catalog and fitted seconds."""

    device_type: str
    dtype: str
    threads: int | None
    n_rows: int
    n_samples: int
    family: str
    params: dict[str, Any]
    family_cv: dict[str, float]
    heldout: HeldOut
    measured: np.ndarray
    analytical: np.ndarray
    fitted_train: np.ndarray

    @property
    def analytical_mape(self) -> float:
        return mape(self.analytical, self.measured)

    @property
    def train_mape(self) -> float:
        return mape(self.fitted_train, self.measured)
