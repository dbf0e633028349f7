"""End to end on this machine: the real profiler's task rows, `hetprof fit`, and the fitted model in use."""

from __future__ import annotations

import math

import pytest
from helpers.inprocess import hetprof_here

from hetprof.costmodels import Placement, Work, get_cost_model
from hetprof.profiles import ProfileDB
from hetprof.specs.models import PRESETS


@pytest.mark.slow
def test_profile_tiny_then_fit(tmp_path):
    db = tmp_path / "here.db"
    # in this process (helpers/inprocess.py): the same commands without two more interpreters importing torch
    prof = hetprof_here(["--db", str(db), "profile", "--quick", "--suite", "tasks", "--models", "tiny"], tmp_path, 240)
    assert prof.returncode == 0, prof.stderr[-2000:]
    png = tmp_path / "fit.png"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COLUMNS", "200")
        fit = hetprof_here(["--db", str(db), "fit", "--report", str(png)], tmp_path, 240)
    assert fit.returncode == 0, fit.stderr[-2000:]
    for task in ("task.prefill", "task.decode", "task.train"):
        assert task in fit.stdout
    assert png.stat().st_size > 10_000
    with ProfileDB(db) as handle:
        models = handle.cost_models()
        assert set(models["task_type"]) == {"task.prefill", "task.decode", "task.train"}
        for metrics in models["metrics"]:
            # timings on a shared CPU are noisy, so no accuracy bar here (the benchmark reports it);
            # the error must be a real held-out number, computed on folds
            assert metrics["heldout_folds"] >= 2 and math.isfinite(metrics["heldout_mape"])
        cm = get_cost_model("fitted", db=handle)
    tiny = PRESETS["tiny"]
    # the profiler measures fp32 on CPU; the planner's question about the same dtype is answered from the fit
    est = cm.task_time(Work("generation", tiny, 8, 32, 32, dtype="fp32"), Placement("cpu"))
    assert est.source == "fitted" and 0 < est.seconds < 60
    longer = cm.task_time(Work("generation", tiny, 8, 32, 64, dtype="fp32"), Placement("cpu"))
    assert longer.seconds >= est.seconds
