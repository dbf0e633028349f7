"""What real runs teach a fitted model: one factor between a microbenchmark and the same phase in a run.

Fitted together with the profiler's rows, a run's few shapes were a handful of rows among dozens —
and ones that disagree with their neighbours, which the robust fit down-weighs as outliers; two runs
moved the prediction of their own shapes by 5%. But a run's phase differs from the profiler's in
*conditions* (the executor's loop around each step, the other workers on the host, the real padded
inputs), not in the physics the features describe. So the model is fitted on the profiler's rows
and runs calibrate it: the run factor is the median over run shapes of measured / predicted, a
positive constant, which keeps the model monotone and applies to every shape the planner asks about.

A training step recorded in a data-parallel run also holds its gradient all-reduce and the measured
data-parallel extra, which the planner adds on its own (`CostModel.dp_grad_sync_time`); that term is
taken out before comparing, so it is not counted twice. Run rows whose replicas spanned hosts (an
unknown link) are left out of the factor.

Error is reported held out by run: each run's shapes are predicted with the factor learned from the
other runs (in-sample, and said so, when there is only one run).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from hetprof.costmodels.data import Phase, Placement, Work
from hetprof.costmodels.heldout import mape
from hetprof.specs.vocabulary import TaskKind

# A factor outside this range means the run and the profile measured different things (another
# machine, another model build), not conditions: it is refused rather than applied.
FACTOR_RANGE = (0.2, 5.0)
# Below this many profiled shapes the profile cannot carry the model alone: runs are fitted as rows.
MIN_PROFILE_SHAPES = 8


@dataclasses.dataclass(frozen=True)
class RunCalibration:
    factor: float            # applied to the profile-fitted model's phase time
    n_rows: int              # run shapes the factor was learned from
    n_runs: int
    mape_before: float       # profile-only model on the run shapes
    mape_after: float        # calibrated, held out by run when n_runs >= 2
    heldout: bool
    left_out: int = 0        # run shapes not used (replicas across hosts, or nothing left after the DP term)

    def metrics(self) -> dict[str, float]:
        return {"run_factor": self.factor, "run_shapes": self.n_rows, "run_count": self.n_runs,
                "run_mape_before": self.mape_before, "run_mape_after": self.mape_after,
                "run_mape_heldout": float(self.heldout)}


def compute_targets(phases: list[Phase], seconds: np.ndarray, dp: list[int], hosts: list[int],
                    device_type: str, cost_model, packs: list[float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Each run shape's compute time (its data-parallel term taken out) and whether it is usable.

    A packed step's row is one of its `packs` passes with the step's one optimizer step shared
    among them, and so is the step's one all-reduce: a row holds 1/packs of it."""
    targets = np.asarray(seconds, float).copy()
    usable = np.ones(len(targets), bool)
    link, _ = cost_model.device_link(device_type)
    shares = [1.0] * len(targets) if not packs else [1.0 / max(1.0, float(k)) for k in packs]
    for i, (phase, d, h) in enumerate(zip(phases, dp, hosts, strict=True)):
        if phase.kind != "train" or d <= 1:
            continue
        if h > 1:
            usable[i] = False
            continue
        work = Work(TaskKind.TRAINING, phase.model, phase.batch, phase.tokens, 0.0, phase.dtype, recompute=phase.recompute)
        targets[i] -= cost_model.dp_grad_sync_time(work, Placement(device_type, phase.tp), d, link) * shares[i]
        if not targets[i] > 0.1 * seconds[i]:
            usable[i] = False
    return targets, usable


def calibrate(predicted: np.ndarray, targets: np.ndarray, runs: list[str]) -> RunCalibration | None:
    """The run factor for run shapes predicted `predicted` (profile-only model) that took `targets`."""
    predicted = np.asarray(predicted, float)
    targets = np.asarray(targets, float)
    if not len(targets):
        return None
    factor = _factor(targets / predicted)
    if factor is None:
        return None
    run_ids = np.asarray(runs)
    distinct = sorted(set(runs))
    if len(distinct) >= 2:
        out = np.empty_like(targets)
        for run in distinct:
            mine = run_ids == run
            others = _factor(targets[~mine] / predicted[~mine])
            out[mine] = predicted[mine] * (others if others is not None else 1.0)
        after, heldout = mape(out, targets), True
    else:
        after, heldout = mape(predicted * factor, targets), False
    return RunCalibration(factor, len(targets), len(distinct), mape(predicted, targets), after, heldout)


def _factor(ratios: np.ndarray) -> float | None:
    ratios = ratios[np.isfinite(ratios) & (ratios > 0)]
    if not len(ratios):
        return None
    factor = math.exp(float(np.median(np.log(ratios))))
    return factor if FACTOR_RANGE[0] <= factor <= FACTOR_RANGE[1] else None
