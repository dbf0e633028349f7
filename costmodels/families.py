"""Regressor families for the fitted cost model, each exported as plain numbers.

A family fits on (features, seconds) and returns JSON-able parameters; prediction re-creates the
model from those numbers alone, and `check` validates them before anything is computed — so a
database shared by strangers can carry only numbers, never code. Every family is monotone
non-decreasing in every feature *by construction*, and `check` refuses parameters that are not:

- nnls: t = Σ cᵢ·xᵢ with cᵢ ≥ 0 (scikit-learn's positive least squares, weighted by 1/t² so the
  fit minimises relative error). Extrapolates linearly along the physics features.
- hgb: a histogram gradient-boosting model with monotone constraints on log features, predicting
  log t; trees exported as arrays (feature, threshold, children, leaf value). Flat outside the data.
- nnls_hgb: nnls times exp(monotone boosted correction of its log residual): the linear physics
  trend outside the data, learned curvature inside. A product of positive non-decreasing factors
  is non-decreasing.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

LOG_EPS = 1e-12
MAX_TREES = 1000
MAX_NODES = 4096
MONOTONE_TOL = 1e-9
HUBER_K = 1.345
HUBER_ITERATIONS = 6


class Family:
    name = ""
    min_rows = 3

    def predict_one(self, params: dict[str, Any], x: list[float]) -> float:
        """One row, in plain Python: the planner asks one phase at a time, where numpy's set-up dominates."""
        return float(self.predict(params, np.asarray([x], float))[0])

    def fit(self, x: np.ndarray, y: np.ndarray, seed: int = 0) -> dict[str, Any]:
        raise NotImplementedError

    def predict(self, params: dict[str, Any], x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def check(self, params: dict[str, Any], n_features: int) -> None:
        """Raise ValueError unless `params` are well-formed, bounded and monotone."""
        raise NotImplementedError


# ---- non-negative least squares -------------------------------------------------------------

def _fit_nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares on relative error, made robust by Huber reweighting.

    A profiled shape whose repeats were all disturbed (a busy host) is an outlier in relative
    terms; iteratively reweighted least squares with Huber weights (scale from the median absolute
    residual) keeps it from bending the fit for every other shape.
    """
    from sklearn.linear_model import LinearRegression

    scale = np.maximum(x.max(axis=0), 1e-30)  # conditioning only; folded back into the coefficients
    xs = x / scale
    base = 1.0 / np.square(y)
    weights = base
    reg = LinearRegression(positive=True, fit_intercept=False)
    for _ in range(HUBER_ITERATIONS):
        reg.fit(xs, y, sample_weight=weights)
        rel = (xs @ reg.coef_ - y) / y
        spread = 1.4826 * np.median(np.abs(rel - np.median(rel)))
        if not spread > 0:
            break
        k = HUBER_K * spread
        weights = base * np.minimum(1.0, k / np.maximum(np.abs(rel), 1e-30))
    return np.maximum(reg.coef_, 0.0) / scale


def _check_coef(params: dict[str, Any], n_features: int) -> None:
    coef = params.get("coef")
    if not isinstance(coef, list) or len(coef) != n_features:
        raise ValueError(f"coef must be a list of {n_features} numbers")
    for c in coef:
        if isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c) or c < 0:
            raise ValueError(f"coef entries must be finite numbers >= 0 (monotone), got {c!r}")


class NNLS(Family):
    name = "nnls"

    def fit(self, x: np.ndarray, y: np.ndarray, seed: int = 0) -> dict[str, Any]:
        return {"coef": [float(c) for c in _fit_nnls(x, y)]}

    def predict(self, params: dict[str, Any], x: np.ndarray) -> np.ndarray:
        return x @ np.asarray(params["coef"], float)

    def predict_one(self, params: dict[str, Any], x: list[float]) -> float:
        return float(sum(c * v for c, v in zip(params["coef"], x, strict=True)))

    def check(self, params: dict[str, Any], n_features: int) -> None:
        _check_coef(params, n_features)


# ---- monotone boosted trees as arrays -------------------------------------------------------

def _log_features(x: np.ndarray) -> np.ndarray:
    return np.log(np.maximum(x, 0.0) + LOG_EPS)


def _fit_trees(z: np.ndarray, target: np.ndarray, seed: int) -> dict[str, Any]:
    from sklearn.ensemble import HistGradientBoostingRegressor
    from threadpoolctl import threadpool_limits

    n = len(target)
    reg = HistGradientBoostingRegressor(
        max_iter=40, learning_rate=0.2, max_leaf_nodes=8, min_samples_leaf=max(3, n // 15),
        l2_regularization=1.0, monotonic_cst=[1] * z.shape[1], early_stopping=False, random_state=seed)
    with threadpool_limits(1):  # tiny data: OpenMP workers only add synchronisation on a busy host
        reg.fit(z, target)
    return export_trees(reg)


def export_trees(reg: Any) -> dict[str, Any]:
    """A fitted HistGradientBoostingRegressor as plain arrays (its private predictor nodes)."""
    trees = []
    for (pred,) in reg._predictors:  # one tree per iteration for a single-output regressor
        nodes = pred.nodes
        trees.append({
            "feature": [int(v) for v in nodes["feature_idx"]],
            "threshold": [float(v) for v in nodes["num_threshold"]],
            "left": [int(v) for v in nodes["left"]],
            "right": [int(v) for v in nodes["right"]],
            "leaf": [bool(v) for v in nodes["is_leaf"]],
            "value": [float(v) for v in nodes["value"]],  # shrinkage already applied by sklearn
        })
    return {"baseline": float(np.ravel(reg._baseline_prediction)[0]), "trees": trees}


def _tree_predict(tree: dict[str, Any], z: np.ndarray) -> np.ndarray:
    feature = np.asarray(tree["feature"], int)
    threshold = np.asarray(tree["threshold"], float)
    left = np.asarray(tree["left"], int)
    right = np.asarray(tree["right"], int)
    leaf = np.asarray(tree["leaf"], bool)
    value = np.asarray(tree["value"], float)
    node = np.zeros(len(z), int)
    rows = np.arange(len(z))
    for _ in range(len(feature)):  # children always have larger indices (checked), so this ends
        active = ~leaf[node]
        if not active.any():
            break
        go_left = z[rows, feature[node]] <= threshold[node]
        node = np.where(active, np.where(go_left, left[node], right[node]), node)
    return value[node]


def _trees_predict(params: dict[str, Any], z: np.ndarray) -> np.ndarray:
    out = np.full(len(z), float(params["baseline"]))
    for tree in params["trees"]:
        out += _tree_predict(tree, z)
    return out


def _trees_predict_one(params: dict[str, Any], z: list[float]) -> float:
    out = float(params["baseline"])
    for tree in params["trees"]:
        feature, threshold, left, right, leaf = (tree["feature"], tree["threshold"], tree["left"],
                                                 tree["right"], tree["leaf"])
        node = 0
        while not leaf[node]:  # children have larger indices (checked on load): the walk ends
            node = left[node] if z[feature[node]] <= threshold[node] else right[node]
        out += tree["value"][node]
    return out


def _log_one(x: list[float]) -> list[float]:
    return [math.log(max(v, 0.0) + LOG_EPS) for v in x]


def _check_trees(params: dict[str, Any], n_features: int) -> None:
    base = params.get("baseline")
    if isinstance(base, bool) or not isinstance(base, (int, float)) or not math.isfinite(base):
        raise ValueError("baseline must be a finite number")
    trees = params.get("trees")
    if not isinstance(trees, list) or len(trees) > MAX_TREES:
        raise ValueError(f"trees must be a list of at most {MAX_TREES}")
    for t, tree in enumerate(trees):
        if not isinstance(tree, dict):
            raise ValueError(f"tree {t} is not an object")
        keys = ("feature", "threshold", "left", "right", "leaf", "value")
        arrays = [tree.get(k) for k in keys]
        if not all(isinstance(a, list) for a in arrays) or len({len(a) for a in arrays}) != 1:
            raise ValueError(f"tree {t}: {', '.join(keys)} must be lists of one length")
        n = len(arrays[0])
        if not 1 <= n <= MAX_NODES:
            raise ValueError(f"tree {t}: 1..{MAX_NODES} nodes")
        feature, threshold, left, right, leaf, value = arrays
        for i in range(n):
            if not isinstance(leaf[i], bool):
                raise ValueError(f"tree {t} node {i}: leaf must be true/false")
            for name, v in (("threshold", threshold[i]), ("value", value[i])):
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                    raise ValueError(f"tree {t} node {i}: {name} must be a finite number")
            if leaf[i]:
                continue
            for name, v, lo, hi in (("feature", feature[i], 0, n_features - 1), ("left", left[i], i + 1, n - 1),
                                    ("right", right[i], i + 1, n - 1)):
                if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                    raise ValueError(f"tree {t} node {i}: {name} must be an integer in {lo}..{hi}")
        _check_monotone(tree, t)


def _check_monotone(tree: dict[str, Any], t: int) -> None:
    """Every leaf left of a split is <= every leaf right of it: non-decreasing in every feature."""
    left, right, leaf, value = tree["left"], tree["right"], tree["leaf"], tree["value"]
    lo = list(value)
    hi = list(value)
    for i in range(len(leaf) - 1, -1, -1):  # children first (they have larger indices)
        if leaf[i]:
            continue
        if hi[left[i]] > lo[right[i]] + MONOTONE_TOL:
            raise ValueError(f"tree {t} node {i}: left leaves exceed right leaves (not monotone)")
        lo[i] = min(lo[left[i]], lo[right[i]])
        hi[i] = max(hi[left[i]], hi[right[i]])


class HGB(Family):
    name = "hgb"
    min_rows = 30

    def fit(self, x: np.ndarray, y: np.ndarray, seed: int = 0) -> dict[str, Any]:
        return _fit_trees(_log_features(x), np.log(y), seed)

    def predict(self, params: dict[str, Any], x: np.ndarray) -> np.ndarray:
        return np.exp(_trees_predict(params, _log_features(x)))

    def predict_one(self, params: dict[str, Any], x: list[float]) -> float:
        return math.exp(_trees_predict_one(params, _log_one(x)))

    def check(self, params: dict[str, Any], n_features: int) -> None:
        _check_trees(params, n_features)


class NNLSxHGB(Family):
    name = "nnls_hgb"
    min_rows = 30

    def fit(self, x: np.ndarray, y: np.ndarray, seed: int = 0) -> dict[str, Any]:
        coef = _fit_nnls(x, y)
        base = np.maximum(x @ coef, 1e-30)
        trees = _fit_trees(_log_features(x), np.log(y / base), seed)
        return {"coef": [float(c) for c in coef], **trees}

    def predict(self, params: dict[str, Any], x: np.ndarray) -> np.ndarray:
        base = x @ np.asarray(params["coef"], float)
        return base * np.exp(_trees_predict(params, _log_features(x)))

    def predict_one(self, params: dict[str, Any], x: list[float]) -> float:
        base = sum(c * v for c, v in zip(params["coef"], x, strict=True))
        return base * math.exp(_trees_predict_one(params, _log_one(x)))

    def check(self, params: dict[str, Any], n_features: int) -> None:
        _check_coef(params, n_features)
        _check_trees(params, n_features)


FAMILIES: dict[str, Family] = {f.name: f for f in (NNLS(), HGB(), NNLSxHGB())}
# What cross-validation chooses among by default: pure trees cannot extrapolate beyond the profiled
# shapes, so they lose every range fold; they stay loadable and can be asked for explicitly.
CANDIDATES = ("nnls", "nnls_hgb")


def get_family(name: str) -> Family:
    """A family by name; names come from data, so an unknown one is refused, never imported."""
    if not isinstance(name, str) or name not in FAMILIES:
        raise ValueError(f"unknown model family {str(name)[:40]!r} (known: {', '.join(FAMILIES)})")
    return FAMILIES[name]
