"""Profiled shapes are answered with their measurement; shapes never profiled get the plain fit."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.costmodels_synth import add_rows, true_seconds

from hetprof.costmodels import fitting, pointcorrections
from hetprof.costmodels.data import Phase
from hetprof.costmodels.features import FEATURES, phase_features
from hetprof.costmodels.fitted import FittedCostModel
from hetprof.profiles import DeviceInfo, ProfileDB
from hetprof.specs.models import PRESETS

TINY = PRESETS["tiny"]


def _add_shape(db: ProfileDB, batch: int, seq: int, seconds: float, repeats: int = 5) -> None:
    """One extra training shape measured at `seconds` (a shape the fit's smooth curve misses)."""
    dev = db.add_device(DeviceInfo(name="synthetic cpu", kind="cpu", catalog_type="cpu", host="synth"))
    params = {"model": "tiny", "layers_run": TINY.layers, "dtype": "fp32", "threads": 1}
    shape = {**params, **{k: getattr(TINY, k) for k in ("hidden", "ffn", "heads", "kv_heads", "head_dim", "vocab")},
             "with_head": True, "recompute": False, "batch": batch, "seq_len": seq}
    db.add_benchmark("task.train", dev, "synth", {"model": "tiny"},
                     [{"params": shape, "metrics": {"seconds": seconds}}] * repeats)


def test_a_profiled_shape_is_predicted_as_measured_and_others_by_the_fit(tmp_path):
    odd = Phase("train", TINY, TINY.layers, 3, 73, with_head=True, dtype="fp32")
    measured = 1.3 * true_seconds(odd)  # this shape ran 30% slower than the smooth device model says
    with ProfileDB(tmp_path / "db.sqlite") as db:
        add_rows(db, tasks=("train",), repeats=3)
        _add_shape(db, 3, 73, measured)
        (fit,) = fitting.fit_database(db, task="task.train", stat="median", envelope=False)
        assert len(fit.points) == fit.n_rows and fit.metrics()["profiled_points"] == fit.n_rows
        fitting.store(db, [fit])
        cm = FittedCostModel(db)
    assert cm.phase_time(odd, "cpu").seconds == pytest.approx(measured, rel=1e-6)
    smooth = fit.fitted_train[[(p.batch, p.tokens, p.model.name) for p in fit.phases].index((3, 73, "tiny"))]
    assert abs(smooth / measured - 1) > 0.05  # the fit alone would have missed it
    # a neighbour the profiler never ran: the fit's answer, no correction borrowed from the odd shape
    near = Phase("train", TINY, TINY.layers, 3, 74, with_head=True, dtype="fp32")
    plain = FittedCostModel(models=[m for m in cm.models.values()])
    entry = next(iter(plain.models.values()))
    assert pointcorrections.point_key(phase_features(near, "cpu")) not in entry.points
    assert cm.phase_time(near, "cpu").seconds == pytest.approx(
        entry.family.predict_one(entry.params, phase_features(near, "cpu")), rel=1e-9)


def test_keys_survive_a_json_round_trip_and_bad_tables_are_refused():
    x = np.asarray([[1.234567891234e-3, 0.1, 2.0, 0.0, 3.0, 4.0, 5.0, 1.0]])
    rows = pointcorrections.corrections(x, np.asarray([2.0]), np.asarray([1.6]))
    import json

    table = pointcorrections.load(json.loads(json.dumps(rows)), len(FEATURES))
    assert table == {pointcorrections.point_key(x[0]): pytest.approx(1.25)}
    # a ratio beyond what any fit of its own rows could be off by is dropped, not stored
    assert pointcorrections.corrections(x, np.asarray([100.0]), np.asarray([1.0])) == []
    for bad in ([[1.0] * 3], [[float("nan")] * 9], "x", [[True] * 9]):
        with pytest.raises(ValueError):
            pointcorrections.load(bad, len(FEATURES))
