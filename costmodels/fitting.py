"""`hetprof fit`'s engine: task rows → per (task type, device type, dtype) fitted models in the DB.

Task rows come from the profiler and, unless turned off, from the phases real runs recorded
(costmodels/runrows.py), so a model learns the shapes and conditions runs really have.

Each profiled shape's samples are summarised by their median (the raw samples stay in the
database), turned into a Phase and its features, and fitted by the family that range-fold cross-
validation prefers. The stored entry is plain JSON that re-creates the model (see fitted.py), with
the profile snapshot it was fitted on and its honest held-out error next to the analytical model's
error on the same rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from hetprof.costmodels import calloverhead, enginereload, pointcorrections
from hetprof.costmodels.analytical import AnalyticalCostModel
from hetprof.costmodels.base import generation_phases
from hetprof.costmodels.data import Phase
from hetprof.costmodels.families import get_family
from hetprof.costmodels.features import FEATURES, TASK_PHASE, RowError, phase_features, phase_from_row
from hetprof.costmodels.heldout import FitSummary, choose_family, nested_heldout
from hetprof.costmodels.runcalibration import MIN_PROFILE_SHAPES, RunCalibration, calibrate, compute_targets
from hetprof.costmodels.runrows import SOURCE, packs_of, run_call_rows, run_task_rows
from hetprof.errors import ProfileDBError
from hetprof.specs.catalog import canonical_name

FORMAT = 1
MODEL_NAME = "fitted"
# How a shape's repeats become one training target. Interference on a shared host only ever adds
# time, so the minimum estimates the kernel's own time best there; the median suits quiet GPUs.
STATS = {"min": lambda s: float(s.min()), "median": lambda s: float(s.median()),
         "p25": lambda s: float(s.quantile(0.25))}
DEFAULT_STAT = "min"
_NON_SHAPE = {"sample_id", "run_id", "benchmark", "device_id", "device_name", "catalog_type", "host", "seq",
              "seconds"}


@dataclasses.dataclass
class TaskFit(FitSummary):
    """One fitted task model and everything `hetprof fit` reports about it."""

    task_type: str
    shape_range: dict[str, list[float]]
    phases: list[Phase] = dataclasses.field(default_factory=list, repr=False)
    noise: float = float("nan")
    stat: str = DEFAULT_STAT
    n_run_rows: int = 0  # shapes that came from run records rather than the profiler
    runs: RunCalibration | None = None  # what the runs taught (None: no usable run rows, or runs fitted as rows)
    notes: list[str] = dataclasses.field(default_factory=list)
    points: list[list[float]] = dataclasses.field(default_factory=list, repr=False)  # pointcorrections.py
    call: calloverhead.CallOverhead | None = None  # decode fits: whole generation calls beyond the phases
    engine_calls: dict[str, calloverhead.CallOverhead] = dataclasses.field(default_factory=dict)  # other engines'
    engine_reloads: dict[str, enginereload.EngineReload] = dataclasses.field(default_factory=dict)  # decode fits

    @property
    def run_factor(self) -> float:
        return self.runs.factor if self.runs is not None else 1.0

    def entry(self) -> dict[str, Any]:
        """The data stored in the database: enough to re-create the model, nothing executable."""
        return {"format": FORMAT, "task_type": self.task_type, "phase": TASK_PHASE[self.task_type],
                "device_type": self.device_type, "dtype": self.dtype, "threads": self.threads,
                "features": list(FEATURES), "family": self.family, "model": self.params,
                "range": self.shape_range, "target": self.stat, "run_factor": self.run_factor,
                "points": self.points, **({"call_overhead": self.call.to_json()} if self.call is not None else {}),
                **({"engine_call_overhead": {e: c.to_json() for e, c in self.engine_calls.items()}}
                   if self.engine_calls else {}),
                **({"engine_reload": {e: r.to_json() for e, r in self.engine_reloads.items()}}
                   if self.engine_reloads else {})}

    def metrics(self) -> dict[str, float]:
        m = {"n_rows": self.n_rows, "n_run_rows": self.n_run_rows, "n_samples": self.n_samples, "heldout_mape": self.heldout.mape,
             "heldout_folds": self.heldout.n_folds, "analytical_mape": self.analytical_mape,
             "train_mape": self.train_mape, "repeat_noise": self.noise, "profiled_points": len(self.points),
             **{f"cv_mape_{k}": v for k, v in self.family_cv.items()},
             **(self.runs.metrics() if self.runs is not None else {}),
             **({"call_overhead_ms": self.call.default_s * 1e3, "call_points": len(self.call.points),
                 "call_run_calls": self.call.runs}
                if self.call is not None else {})}
        return {k: float(v) for k, v in m.items() if np.isfinite(v)}


@dataclasses.dataclass
class Group:
    """The rows of one (task type, device type, dtype[, threads]) with their phases."""

    task_type: str
    device_type: str
    dtype: str
    threads: int | None
    phases: list[Phase]
    seconds: np.ndarray
    n_samples: int
    shapes: pd.DataFrame  # model, batch, length, layers per row (for the range folds)
    noise: float = float("nan")  # mean relative difference of the target between halves of the repeats
    sources: list[str] = dataclasses.field(default_factory=list)  # "profile" or "run", per row
    runs: list[str] = dataclasses.field(default_factory=list)     # the run a run row came from ("" otherwise)
    dp: list[int] = dataclasses.field(default_factory=list)       # data-parallel degree of a run's training step
    hosts: list[int] = dataclasses.field(default_factory=list)    # hosts that run's replicas spanned
    packs: list[float] = dataclasses.field(default_factory=list)  # packed passes sharing a run row's step

    @property
    def n_run_rows(self) -> int:
        return sum(s == SOURCE for s in self.sources)

    def subset(self, keep: np.ndarray) -> Group:
        """The same group restricted to the rows where `keep` is true."""
        idx = np.flatnonzero(keep)
        return dataclasses.replace(
            self, phases=[self.phases[i] for i in idx], seconds=self.seconds[idx],
            shapes=self.shapes.iloc[idx].reset_index(drop=True), sources=[self.sources[i] for i in idx],
            runs=[self.runs[i] for i in idx], dp=[self.dp[i] for i in idx], hosts=[self.hosts[i] for i in idx],
            packs=[self.packs[i] for i in idx])


def timed_on_catalog_devices(df: pd.DataFrame, device: str | None, skipped: list[str] | None, why: str,
                             required: pd.Series | None = None) -> pd.DataFrame:
    """Samples with positive seconds on a catalog device type (`device_type` added), of `device`'s type
    when one is asked for; those without a type (or not in the `required` mask) are dropped and counted
    in `skipped` as "<n> <why>"."""
    df = df[pd.to_numeric(df["seconds"], errors="coerce") > 0].copy()
    df["device_type"] = df["catalog_type"].map(lambda c: canonical_name(c) if isinstance(c, str) else None)
    unknown = df["device_type"].isna()
    if required is not None:
        unknown |= ~required.reindex(df.index, fill_value=False)
    if unknown.any() and skipped is not None:
        skipped.append(f"{int(unknown.sum())} {why}")
    df = df[~unknown]
    if device:
        want = canonical_name(device)
        if want is None:
            raise ProfileDBError(f"--device {device!r} is not a catalog device type")
        df = df[df["device_type"] == want]
    return df


def task_groups(db: Any, task: str | None = None, device: str | None = None,
                skipped: list[str] | None = None, stat: str = DEFAULT_STAT, envelope: bool = True,
                runs: bool = True) -> list[Group]:
    """Task rows of the database grouped for fitting, one row per profiled (or run) shape."""
    df = db.samples(benchmark="task.")
    if runs:
        from_runs = run_task_rows(db, skipped)
        if len(from_runs):
            df = pd.concat([df, from_runs], ignore_index=True) if len(df) else from_runs
    if not len(df):
        return []
    if task:
        df = df[df["benchmark"] == task]
    df = df[df["benchmark"].isin(list(TASK_PHASE))]
    if "seconds" not in df or not len(df):
        return []
    df = timed_on_catalog_devices(df, device, skipped, "task samples on devices without a catalog type")
    if "dtype" not in df:
        df["dtype"] = "bf16"
    df["dtype"] = df["dtype"].fillna("bf16")
    groups: list[Group] = []
    for (bench, dev, dtype), part in df.groupby(["benchmark", "device_type", "dtype"], sort=True):
        threads = None
        if "threads" in part and part["threads"].notna().any():
            counts = part["threads"].dropna().astype(int)
            threads = 1 if (counts == 1).any() else int(counts.mode().iloc[0])
            part = part[part["threads"].fillna(threads).astype(int) == threads]
        group = _group(str(bench), str(dev), str(dtype), threads, part, skipped, stat, envelope)
        if group is not None:
            groups.append(group)
    return groups


def _by_shape(part: pd.DataFrame):
    """The rows of each distinct shape (every column but identities and the measurement), in order."""
    keys = [c for c in part.columns if c not in _NON_SHAPE and c != "device_type" and part[c].notna().any()]
    shaped = part[keys].map(str).agg("|".join, axis=1) if keys else pd.Series("", index=part.index)
    return (rows for _, rows in part.groupby(shaped.to_numpy(), sort=True))


def _group(bench: str, dev: str, dtype: str, threads: int | None, part: pd.DataFrame,
           skipped: list[str] | None, stat: str, envelope: bool) -> Group | None:
    phases_, secs, shapes, noise, sources, bad = [], [], [], [], [], 0
    runs, dps, hosts, packs = [], [], [], []
    for rows in _by_shape(part):
        first = rows.iloc[0].to_dict()
        try:
            ph = phase_from_row(bench, first)
        except (RowError, ValueError) as exc:
            bad += len(rows)
            if skipped is not None and bad == len(rows):
                skipped.append(f"{bench} on {dev}: {exc}")
            continue
        phases_.append(ph)
        source = first.get("source") if isinstance(first.get("source"), str) else "profile"
        sources.append(source)
        runs.append(str(first.get("run_key")) if source == SOURCE else "")
        dps.append(_count(first.get("dp")))
        hosts.append(_count(first.get("dp_hosts")))
        packs.append(packs_of(first))
        secs.append(STATS[stat](rows["seconds"].astype(float)))
        noise.append(repeat_noise(rows, STATS[stat]))
        shapes.append({"model": str(first.get("model", "")), "batch": ph.batch, "length": ph.tokens,
                       "layers": ph.layers})
    if not phases_:
        return None
    secs_arr = np.asarray(secs)
    if envelope:  # each run bounds only its own shapes, as the profile bounds its own
        capped = monotone_envelope(phases_, secs_arr, [f"{s}:{r}" for s, r in zip(sources, runs, strict=True)])
        # ...and only where its rows are fitted as rows: a run that calibrates the profile's fit is
        # measured for its conditions (interference included), which a lower envelope over a few
        # noisy medians of nearly the same work would bias low
        from_run = np.asarray([s == SOURCE for s in sources], bool)
        calibrating = (~from_run).sum() >= MIN_PROFILE_SHAPES
        secs_arr = np.where(from_run & calibrating, secs_arr, capped)
    return Group(bench, dev, dtype, threads, phases_, secs_arr, len(part) - bad, pd.DataFrame(shapes),
                 float(np.nanmean(noise)) if not np.isnan(noise).all() else float("nan"),
                 sources, runs, dps, hosts, packs)


def _count(value: Any) -> int:
    """A positive count from a row's optional column (missing or NaN: 1)."""
    try:
        n = int(value)
    except (TypeError, ValueError):
        return 1
    return max(1, n)


def repeat_noise(rows: pd.DataFrame, stat: Callable[[pd.Series], float]) -> float:
    """How far the target statistic moves between two independent halves of a shape's repeats.

    The halves are two profiler runs when the shape was profiled more than once (interference on a
    busy host comes in bursts longer than one shape's repeats), odd and even repeats otherwise.
    It is the floor under any model's error: a target that moves 20% between halves cannot be
    predicted to better than about that.
    """
    seconds = rows["seconds"].astype(float)
    runs = rows["run_id"].to_numpy() if "run_id" in rows else np.zeros(len(rows))
    first = runs == runs[0]
    if (~first).any():
        a, b = stat(seconds[first]), stat(seconds[~first])
    elif len(seconds) >= 4:
        a, b = stat(seconds.iloc[0::2]), stat(seconds.iloc[1::2])
    else:
        return float("nan")
    return abs(a - b) / max(min(a, b), 1e-30)


def monotone_envelope(phases_: list[Phase], seconds: np.ndarray, sources: list[str] | None = None) -> np.ndarray:
    """Each shape's time, capped by the fastest time of any shape that does at least its work.

    Physics says more work is never cheaper; on a shared host interference only adds time. So
    when a shape with the same model and settings but a batch and length at least as large was
    measured faster, that time is a tighter upper bound on this shape's own time. Only shapes of
    the same source bound each other: a microbenchmark does not bound what a run's phase costs.
    """
    out = seconds.copy()
    src = sources or ["profile"] * len(phases_)
    for i, p in enumerate(phases_):
        for j, q in enumerate(phases_):
            if (j != i and src[j] == src[i] and q.batch >= p.batch and q.tokens >= p.tokens and q.layers == p.layers
                    and q.model == p.model and q.recompute == p.recompute and q.with_head == p.with_head
                    and q.tp == p.tp):
                out[i] = min(out[i], seconds[j])
    return out


def fit_group(group: Group, analytical: AnalyticalCostModel, seed: int = 0,
              progress: Callable[[str], None] | None = None) -> TaskFit:
    """Choose a family, measure its nested held-out error, and fit it on the profiler's rows; then
    learn the run factor from the run rows (runcalibration.py says why not fit them as rows).
    A device type the profiler has (almost) no rows for is fitted on its run rows as rows."""
    from_run = np.asarray([s == SOURCE for s in group.sources], bool)
    split = from_run.any() and (~from_run).sum() >= MIN_PROFILE_SHAPES
    base = group.subset(~from_run) if split else group
    x = np.asarray([phase_features(p, base.device_type) for p in base.phases])
    y = base.seconds
    heldout = nested_heldout(x, y, base.shapes, seed, progress)
    family, scores = choose_family(x, y, base.shapes, seed)
    params = family.fit(x, y, seed)
    family.check(params, len(FEATURES))  # what we store must pass what loading demands
    analytic = np.asarray([analytical.phase_time(p, base.device_type).seconds for p in base.phases])
    rng = {c: [float(base.shapes[c].min()), float(base.shapes[c].max())] for c in ("batch", "length", "layers")}
    smooth = family.predict(params, x)
    fit = TaskFit(device_type=group.device_type, dtype=group.dtype, threads=group.threads, n_rows=len(y),
                  n_samples=group.n_samples, family=family.name, params=params, family_cv=scores, heldout=heldout,
                  measured=y, analytical=analytic, fitted_train=smooth, task_type=group.task_type,
                  shape_range=rng, phases=list(base.phases), noise=group.noise, n_run_rows=group.n_run_rows)
    if split or not from_run.any():  # profiled shapes only: a run's phase is calibrated, not looked up
        fit.points = pointcorrections.corrections(x, y, smooth)
    if split:
        fit.runs = _run_calibration(group.subset(from_run), family, params, pointcorrections.as_table(fit.points),
                                    analytical, fit.notes)
    return fit


def _run_calibration(runs: Group, family, params: dict[str, Any], points: dict, analytical: AnalyticalCostModel,
                     notes: list[str]) -> RunCalibration | None:
    targets, usable = compute_targets(runs.phases, runs.seconds, runs.dp, runs.hosts, runs.device_type, analytical,
                                      runs.packs)
    left_out = int((~usable).sum())
    if left_out:
        notes.append(f"{runs.task_type} on {runs.device_type}: {left_out} run shape(s) left out of the run factor "
                     "(replicas across hosts, or nothing left once the data-parallel term is taken out)")
    if not usable.any():
        return None
    x = np.asarray([phase_features(p, runs.device_type) for p, ok in zip(runs.phases, usable, strict=True) if ok])
    # the factor is relative to what the profile-only model answers, profiled-point corrections included
    predicted = pointcorrections.apply(family.predict(params, x), x, points)
    cal = calibrate(predicted, targets[usable], [r for r, ok in zip(runs.runs, usable, strict=True) if ok])
    if cal is None:
        notes.append(f"{runs.task_type} on {runs.device_type}: runs and profile disagree beyond a run factor "
                     "(another machine or model build?); the runs were not applied")
        return None
    return dataclasses.replace(cal, left_out=left_out)


def fit_database(db: Any, task: str | None = None, device: str | None = None, seed: int = 0,
                 progress: Callable[[str], None] | None = None, skipped: list[str] | None = None,
                 stat: str = DEFAULT_STAT, envelope: bool = True, runs: bool = True,
                 catalog: Any | None = None) -> list[TaskFit]:
    """Fit every task group the database has rows for (optionally one task type / device type);
    `runs` adds the phases recorded by real runs to the profiler's rows; `catalog` (a --catalog
    file's) prices the analytical baseline."""
    analytical = AnalyticalCostModel(db, catalog)
    fits = []
    if stat not in STATS:
        raise ValueError(f"unknown statistic {stat!r} (one of {', '.join(STATS)})")
    for group in task_groups(db, task, device, skipped, stat, envelope, runs):
        if progress:
            progress(f"fitting {group.task_type} on {group.device_type} ({group.dtype}): {len(group.seconds)} shapes")
        fit = fit_group(group, analytical, seed, progress)
        fit.stat = f"{stat}+envelope" if envelope else stat
        if skipped is not None:
            skipped.extend(fit.notes)
        fits.append(fit)
    learn_call_overheads(db, fits, stat, skipped, runs)
    learn_engine_reloads(db, fits)
    return fits


def learn_engine_reloads(db: Any, fits: list[TaskFit]) -> None:
    """Give each decode fit what an engine's weight reload after a sync took on its device type,
    dtype and thread count (`task.weight_reload` rows, enginereload.py)."""
    rows = db.samples(benchmark=enginereload.BENCHMARK)
    if not len(rows) or "catalog_type" not in rows:
        return
    rows["device_type"] = rows["catalog_type"].map(lambda c: canonical_name(c) if isinstance(c, str) else None)
    for dec in (f for f in fits if f.task_type == "task.decode"):
        dec.engine_reloads = enginereload.learn_by_engine(rows, dec.device_type, dec.dtype, dec.threads)


def learn_call_overheads(db: Any, fits: list[TaskFit], stat: str = DEFAULT_STAT,
                         notes: list[str] | None = None, runs: bool = True) -> None:
    """Give each decode fit what whole generation calls (`task.generate` rows of its device type,
    dtype and thread count) took beyond that fit's prefill and decode phases, per engine that made
    the calls (calloverhead.py). A decode fit the runs calibrated takes the `hf` term from the runs'
    own calls instead, beyond the run-calibrated phases: those phases were timed inside calls."""
    engine = calloverhead.DEFAULT_ENGINE
    rows = db.samples(benchmark=calloverhead.BENCHMARK)
    from_runs = run_call_rows(db) if runs else rows.iloc[0:0]
    for dec in (f for f in fits if f.task_type == "task.decode"):
        pre = next((f for f in fits if f.task_type == "task.prefill" and (f.device_type, f.dtype, f.threads)
                    == (dec.device_type, dec.dtype, dec.threads)), None)
        part, in_runs = _calls_of(rows, dec), _calls_of(from_runs, dec)
        if not len(part) and not (dec.runs is not None and len(in_runs)):
            continue
        if pre is None:
            if notes is not None:
                notes.append(f"{calloverhead.BENCHMARK} on {dec.device_type}: fit task.prefill and task.decode "
                             "together to learn what a generation call costs beyond them")
            continue
        for name, calls in part.groupby("backend", sort=True):
            learned = calloverhead.learn(_call_rows(calls.drop(columns="backend"), pre, dec, stat, notes))
            if name == engine:
                dec.call = learned
            elif learned is not None:
                dec.engine_calls[str(name)] = learned
        if dec.runs is not None and len(in_runs):
            # the run's phases are calibrated on laps timed inside its calls: its calls say the rest
            shapes = _call_rows(in_runs.drop(columns="backend"), pre, dec, stat, notes, calibrated=True)
            dec.call = calloverhead.learn(shapes, runs=len(in_runs)) or dec.call


def _calls_of(rows: pd.DataFrame, dec: TaskFit) -> pd.DataFrame:
    """The `task.generate` rows of the decode fit's device type, dtype and thread count, each with its engine."""
    if not len(rows) or "seconds" not in rows or "catalog_type" not in rows:
        return pd.DataFrame(columns=["seconds", "backend"])
    device = rows["catalog_type"].map(lambda c: canonical_name(c) if isinstance(c, str) else None)
    dtype = rows["dtype"].fillna("bf16") if "dtype" in rows else pd.Series("bf16", index=rows.index)
    rows = rows[(pd.to_numeric(rows["seconds"], errors="coerce") > 0) & (device == dec.device_type)
                & (dtype == dec.dtype)].assign(dtype=dec.dtype)
    if dec.threads is not None and "threads" in rows:
        rows = rows[pd.to_numeric(rows["threads"], errors="coerce").fillna(dec.threads).astype(int) == dec.threads]
    engine = calloverhead.DEFAULT_ENGINE
    return rows.assign(backend=rows["backend"].fillna(engine) if "backend" in rows else engine)


def _call_rows(part: pd.DataFrame, pre: TaskFit, dec: TaskFit, stat: str, notes: list[str] | None,
               calibrated: bool = False) -> list[tuple[tuple[int, ...], int, int, float, float]]:
    """(model, batch, prompt, measured call, fitted phases) per call shape; `calibrated`: the phases
    with the fits' run factors (calls in runs)."""
    tables = {id(f): pointcorrections.as_table(f.points) for f in (pre, dec)}

    def predict(f: TaskFit, ph: Phase) -> float:
        x = phase_features(ph, f.device_type)
        seconds = get_family(f.family).predict_one(f.params, x) * pointcorrections.ratio(tables[id(f)], x)
        return seconds * (f.run_factor if calibrated else 1.0)

    out = []
    for group in _by_shape(part):
        first = group.iloc[0].to_dict()
        try:
            base = phase_from_row("task.prefill", first)
            steps = int(first.get("new_tokens"))
        except (RowError, ValueError, TypeError) as exc:
            if notes is not None:
                notes.append(f"{calloverhead.BENCHMARK} on {dec.device_type}: {exc}")
            continue

        def phase(kind: str, batch: int, tokens: int, head: bool, base: Phase = base) -> float:
            ph = dataclasses.replace(base, kind=kind, batch=batch, tokens=tokens, with_head=head)
            return predict(pre if kind == "prefill" else dec, ph)

        fitted = sum(generation_phases(phase, base.batch, base.tokens, steps))
        out.append((calloverhead.model_key(base.model), base.batch, base.tokens,
                    STATS[stat](group["seconds"].astype(float)), fitted))
    return out


def store(db: Any, fits: list[TaskFit]) -> list[str]:
    """Write each fit as a cost-model entry tied to the database's current snapshot."""
    snapshot = db.snapshot_hash()
    return [db.add_cost_model(name=MODEL_NAME, task_type=f.task_type, family=f.family, params=f.entry(),
                              metrics=f.metrics(), snapshot=snapshot) for f in fits]
