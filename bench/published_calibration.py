"""One set of catalog constants for every published case: the knobs, the fit, leave-one-source-out.

The knobs are a few global constants of the GPU catalog (hetprof/data/gpus.yaml), each a factor on
what the catalog holds now, applied to every GPU type alike — never to one case:

  compute             matmul and attention efficiency curves (the microbenchmark kernels' rates
                      against what a whole RL training or prefill step sustains around them)
  decode              decode-step memory (HBM) efficiency
  decode_small_batch  decode efficiency below batch 256 only (a small batch's step is latency-bound:
                      launches, scheduling and sampling that a big batch amortises)
  collective          intra-node collective bus bandwidth

The inter-host goodput and the per-step controller cost are not knobs: they are cited figures (the
catalog's `network.inter_host` and `step:`), so a fit cannot use them to soak up a term
the simulator does not price.

Every efficiency stays in (0, 1] (a scaled point is capped at 1) and a curve keeps its shape, so
what rises with size still rises. The fit minimises the median |ln(predicted / published)| over
the cases (plus a small pull of each factor towards 1) with optuna's seeded TPE sampler, starting
from the committed values (all factors 1).
Leave-one-source-out fits without one source's cases and scores the fit on them: how far the
constants carry to a framework they never saw.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import statistics
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path

from published_cases import Case, Priced, price

from hetprof.costmodels import get_cost_model
from hetprof.specs.catalog import Catalog, parse
from hetprof.specs.loader import read_file

INFEASIBLE_LN = 3.0  # |ln ratio| charged for a published layout the model calls infeasible (a 20× miss)
# Weight of the pull towards the committed catalog (mean squared ln factor): a knob the cases barely
# feel stays where the physics put it instead of wandering to a bound (it steadies leave-one-out fits).
PRIOR_WEIGHT = 0.02


@dataclasses.dataclass(frozen=True)
class Knob:
    name: str
    low: float
    high: float
    curves: tuple[str, ...]        # efficiency curves (catalog keys) the factor multiplies
    help: str
    below: float = math.inf        # only the points of x below this (a curve's small-size end)
    neutral: float = 1.0           # the factor that leaves the catalog as committed

    def pull(self, value: float) -> float:
        """Squared ln distance from the committed catalog (the prior's term)."""
        return math.log(value) ** 2


KNOBS = (
    Knob("compute", 0.3, 1.5, ("matmul", "attention"), "factor on matmul and attention efficiency"),
    Knob("decode", 0.3, 1.2, ("decode_memory",), "factor on decode-step HBM efficiency"),
    Knob("decode_small_batch", 0.05, 1.0, ("decode_memory",),
         "further factor on decode HBM efficiency below batch 256 (never above 1: efficiency rises with batch)",
         below=256),
    Knob("collective", 0.3, 1.5, ("collective",), "factor on intra-node collective bandwidth"),
)
NEUTRAL = {k.name: k.neutral for k in KNOBS}


def builtin_data() -> dict:
    """The package's catalog file as plain data (what the knobs rescale)."""
    return read_file(Path(str(resources.files("hetprof") / "data" / "gpus.yaml")))


def scaled_data(data: dict, factors: dict[str, float]) -> dict:
    """The catalog data with each knob's curves multiplied by its factor (capped at efficiency 1)."""
    out = copy.deepcopy(data)
    blocks = [out.get("defaults") or {}]
    # Every GPU type alike; the CPU pseudo-device's nominal placeholder is not a GPU to calibrate.
    blocks += [(entry or {}).get("efficiency") or {} for entry in (out.get("gpus") or {}).values()
               if (entry or {}).get("vendor") != "generic"]
    for knob in KNOBS:
        factor = factors.get(knob.name, knob.neutral)
        if factor == knob.neutral:
            continue
        for spec in (block.get(curve) for block in blocks for curve in knob.curves):
            if not spec:
                continue
            if spec.get("points") is not None:
                spec["points"] = [[x, min(1.0, y * factor) if x < knob.below else y] for x, y in spec["points"]]
            if spec.get("ceiling") is not None and math.isinf(knob.below):
                spec["ceiling"] = min(1.0, spec["ceiling"] * factor)
    return out


def catalog_with(factors: dict[str, float], data: dict | None = None) -> Catalog:
    """The runtime catalog of the package's file rescaled by `factors`."""
    spec = parse(scaled_data(data if data is not None else builtin_data(), factors), "gpus.yaml (calibrating)")
    return Catalog({}, {}, None, None).extended(spec, "gpus.yaml (calibrating)")  # type: ignore[arg-type]


def price_all(cases: Sequence[Case], catalog: Catalog) -> list[Priced]:
    """Every case priced with one cost model over one catalog."""
    return [price(case, get_cost_model("analytical", catalog=catalog)) for case in cases]


def abs_ln(priced: Priced) -> float:
    return abs(math.log(priced.ratio)) if priced.feasible and priced.ratio > 0 else INFEASIBLE_LN


def median_abs_ln(priced: Sequence[Priced]) -> float:
    return statistics.median(abs_ln(p) for p in priced) if priced else math.nan


def fit(cases: Sequence[Case], trials: int, seed: int = 0, data: dict | None = None) -> dict[str, float]:
    """The knob factors minimising median |ln ratio| over `cases` (seeded, reproducible)."""
    import optuna

    data = data if data is not None else builtin_data()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=seed))
    study.enqueue_trial(dict(NEUTRAL))

    def objective(trial) -> float:
        factors = {k.name: trial.suggest_float(k.name, k.low, k.high, log=True) for k in KNOBS}
        prior = statistics.fmean(k.pull(factors[k.name]) for k in KNOBS)
        return median_abs_ln(price_all(cases, catalog_with(factors, data))) + PRIOR_WEIGHT * prior

    study.optimize(objective, n_trials=max(1, trials))
    return {k.name: float(study.best_params[k.name]) for k in KNOBS}


@dataclasses.dataclass(frozen=True)
class HeldOut:
    """One fold of leave-one-source-out: the factors fitted without `source`, scored on its cases."""

    source: str
    factors: dict[str, float]
    priced: tuple[Priced, ...]
    train_committed: float = math.nan  # median |ln ratio| of the fitted-on cases at the committed catalog
    train_fitted: float = math.nan     # ... and at the fold's fit
    held_committed: float = math.nan   # the held-out cases' median at the committed catalog

    @property
    def median_abs_ln(self) -> float:
        return median_abs_ln(self.priced)


def leave_one_source_out(cases: Sequence[Case], trials: int, seed: int = 0,
                         progress: Callable[[str], None] | None = None) -> list[HeldOut]:
    """For each source: fit on the other sources' cases, price the held-out source's cases."""
    data = builtin_data()
    folds = []
    for source in sorted({c.source.id for c in cases}):
        if progress:
            progress(source)
        train = [c for c in cases if c.source.id != source]
        held = [c for c in cases if c.source.id == source]
        factors = fit(train, trials, seed, data)
        fitted, committed = catalog_with(factors, data), catalog_with(dict(NEUTRAL), data)
        folds.append(HeldOut(source, factors, tuple(price_all(held, fitted)),
                             median_abs_ln(price_all(train, committed)), median_abs_ln(price_all(train, fitted)),
                             median_abs_ln(price_all(held, committed))))
    return folds


def pooled_median(folds: Sequence[HeldOut]) -> float:
    """Median |ln ratio| over every held-out case of every fold: the leave-one-source-out figure."""
    return median_abs_ln([p for f in folds for p in f.priced])
