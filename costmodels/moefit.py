"""`hetprof fit` for the grouped expert GEMM: `moe.experts` rows → a time model per (device type, dtype).

The profiler's `moe` suite times a rank's routed experts as grouped SwiGLU GEMMs at a sweep of rows
per expert, forward and backward (profiler/suites/moe.py). Each profiled shape's repeats become one
target (the same statistic and monotone envelope as the task rows: interference only adds time, and
more rows are never cheaper), its features are `moe.expert_features`, and the family is chosen and
scored by the same range folds as the task models (heldout.py): the largest and smallest rows per
expert, each expert shape, are held out in turn. The entry stored is plain numbers
(`moe.validate_expert_entry` loads it) and the analytical model prices routed experts with it
(`AnalyticalCostModel._grouped_rate`). Its "analytical" error is the catalog curve's at the same rows.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pandas as pd

from hetprof.costmodels import moe
from hetprof.costmodels.calibration import Calibration
from hetprof.costmodels.fitting import DEFAULT_STAT, STATS, repeat_noise, timed_on_catalog_devices
from hetprof.costmodels.heldout import FitSummary, choose_family, nested_heldout

SHAPE_KEYS = ("hidden", "expert_ffn", "groups", "rows", "pass")


@dataclasses.dataclass
class ExpertFit(FitSummary):
    """One fitted grouped-GEMM model and what `hetprof fit` reports about it (the columns a task fit has)."""

    rows_range: list[float]
    noise: float = float("nan")
    stat: str = DEFAULT_STAT
    task_type: str = moe.EXPERT_MODEL
    n_run_rows: int = 0  # runs record phases, not expert GEMMs
    runs: None = None
    call: None = None

    def entry(self) -> dict[str, Any]:
        """The data stored in the database: enough to re-create the model, nothing executable."""
        return {"format": moe.EXPERT_FORMAT, "device_type": self.device_type, "dtype": self.dtype,
                "threads": self.threads, "features": list(moe.EXPERT_FEATURES), "family": self.family,
                "model": self.params, "rows": self.rows_range, "target": self.stat}

    def metrics(self) -> dict[str, float]:
        m = {"n_rows": self.n_rows, "n_samples": self.n_samples, "heldout_mape": self.heldout.mape,
             "heldout_folds": self.heldout.n_folds, "analytical_mape": self.analytical_mape,
             "train_mape": self.train_mape, "repeat_noise": self.noise,
             **{f"cv_mape_{k}": v for k, v in self.family_cv.items()}}
        return {k: float(v) for k, v in m.items() if np.isfinite(v)}


def expert_rows(db: Any, device: str | None = None, skipped: list[str] | None = None) -> pd.DataFrame:
    """The `moe.experts` samples with a catalog device type (one thread count per device type and
    dtype: one thread where there are such rows, as the task fits choose)."""
    df = db.samples(benchmark=moe.EXPERT_MODEL)
    needed = {"seconds", "catalog_type", *SHAPE_KEYS}
    if not len(df) or not needed <= set(df.columns):
        return pd.DataFrame()
    df = timed_on_catalog_devices(df, device, skipped,
                                  f"{moe.EXPERT_MODEL} samples without a catalog device type or pass",
                                  required=df["pass"].isin(list(moe.PASS_WORK)))
    df["dtype"] = df["dtype"].fillna("bf16") if "dtype" in df else "bf16"
    df["threads"] = pd.to_numeric(df["threads"], errors="coerce") if "threads" in df else np.nan
    return df


def fit_experts(db: Any, device: str | None = None, seed: int = 0, stat: str = DEFAULT_STAT,
                envelope: bool = True, skipped: list[str] | None = None, catalog: Any | None = None) -> list[ExpertFit]:
    """One grouped-GEMM model per (device type, dtype) the database has `moe.experts` rows of."""
    df = expert_rows(db, device, skipped)
    if not len(df):
        return []
    calibration = Calibration(db, catalog)
    fits = []
    for (dev, dtype), part in df.groupby(["device_type", "dtype"], sort=True):
        threads = None
        if part["threads"].notna().any():
            counts = part["threads"].dropna().astype(int)
            threads = 1 if (counts == 1).any() else int(counts.mode().iloc[0])
            part = part[part["threads"].fillna(threads).astype(int) == threads]
        fit = _fit(str(dev), str(dtype), threads, part, calibration, seed, stat, envelope)
        if fit is not None:
            fits.append(fit)
        elif skipped is not None:
            skipped.append(f"{moe.EXPERT_MODEL} on {dev} ({dtype}): fewer than 3 profiled shapes to fit")
    return fits


def _targets(part: pd.DataFrame, stat: str, envelope: bool) -> tuple[pd.DataFrame, list[float]]:
    """One row per profiled shape with its target seconds; with `envelope`, each capped by the fastest
    shape of the same experts and pass with at least its rows (fitting.monotone_envelope's rule)."""
    summary, noise = [], []
    for key, rows in part.groupby(list(SHAPE_KEYS), sort=True):
        summary.append({**dict(zip(SHAPE_KEYS, key, strict=True)), "seconds": STATS[stat](rows["seconds"].astype(float))})
        noise.append(repeat_noise(rows, STATS[stat]))
    shapes = pd.DataFrame(summary).sort_values(list(SHAPE_KEYS)).reset_index(drop=True)
    if envelope:  # a reverse running minimum over rows within each (hidden, ffn, groups, pass)
        same = ["hidden", "expert_ffn", "groups", "pass"]
        shapes["seconds"] = shapes.iloc[::-1].groupby(same, sort=False)["seconds"].cummin().iloc[::-1]
    return shapes, noise


def _fit(dev: str, dtype: str, threads: int | None, part: pd.DataFrame, calibration: Calibration, seed: int,
         stat: str, envelope: bool) -> ExpertFit | None:
    shapes, noise = _targets(part, stat, envelope)
    if len(shapes) < 3:
        return None
    x = np.asarray([moe.expert_features(int(r.hidden), int(r.expert_ffn), float(r.groups), float(r.rows), r.pass_,
                                        dtype, dev) for r in shapes.rename(columns={"pass": "pass_"}).itertuples()])
    y = shapes["seconds"].to_numpy(float)
    folds = pd.DataFrame({"model": shapes["hidden"].astype(str) + "x" + shapes["expert_ffn"].astype(str),
                          "batch": shapes["rows"], "length": shapes["groups"],
                          "layers": shapes["pass"].map(moe.PASS_WORK)})
    heldout = nested_heldout(x, y, folds, seed)
    family, scores = choose_family(x, y, folds, seed)
    params = family.fit(x, y, seed)
    family.check(params, len(moe.EXPERT_FEATURES))  # what we store must pass what loading demands
    analytical = np.asarray([
        moe.expert_flops(int(r.hidden), int(r.expert_ffn), float(r.groups), float(r.rows)) * moe.PASS_WORK[r.pass_]
        / (calibration.compute_rate(dev, dtype, "matmul", float(r.rows)).value * moe.GROUPED_GEMM_FACTOR)
        for r in shapes.rename(columns={"pass": "pass_"}).itertuples()])
    finite = [v for v in noise if np.isfinite(v)]
    return ExpertFit(device_type=dev, dtype=dtype, threads=threads, n_rows=len(shapes), n_samples=len(part),
                     family=family.name, params=params, family_cv=scores, heldout=heldout, measured=y,
                     analytical=analytical, fitted_train=family.predict(params, x),
                     rows_range=[float(shapes["rows"].min()), float(shapes["rows"].max())],
                     noise=float(np.mean(finite)) if finite else float("nan"),
                     stat=f"{stat}+envelope" if envelope else stat)


def store(db: Any, fits: list[ExpertFit]) -> list[str]:
    """Write each fit as a `moe.experts` cost-model entry tied to the database's current snapshot."""
    snapshot = db.snapshot_hash()
    return [db.add_cost_model(name=moe.EXPERT_MODEL, task_type=moe.EXPERT_MODEL, family=f.family, params=f.entry(),
                              metrics=f.metrics(), snapshot=snapshot) for f in fits]

