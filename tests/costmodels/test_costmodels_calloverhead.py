"""Whole generation calls teach the cost model what a call costs beyond its prefill and decode phases."""

from __future__ import annotations

import json

import pytest
from helpers.costmodels_synth import MODELS, add_rows, true_seconds

from hetprof.costmodels import Placement, Work, calloverhead, fitting
from hetprof.costmodels.base import generation_phases
from hetprof.costmodels.data import Phase
from hetprof.costmodels.fitted import FittedCostModel, validate_entry
from hetprof.profiles import DeviceInfo, ProfileDB

TINY = MODELS["tiny"]
KEY = calloverhead.model_key(TINY)
EXTRA = {(4, 48): 0.004, (2, 16): 0.002, (1, 128): 0.003, (4, 128): -0.0005}  # the synthetic calls' extra cost


def _true_call(batch: int, prompt: int, steps: int) -> float:
    def phase(kind, b, tokens, head):
        return true_seconds(Phase(kind, TINY, TINY.layers, b, tokens, with_head=head, dtype="fp32"))

    return sum(generation_phases(phase, batch, prompt, steps))


def _add_calls(db: ProfileDB, steps: int = 4, repeats: int = 5) -> None:
    dev = db.add_device(DeviceInfo(name="synthetic cpu", kind="cpu", catalog_type="cpu", host="synth"))
    shape = {k: getattr(TINY, k) for k in ("hidden", "ffn", "heads", "kv_heads", "head_dim", "vocab")}
    samples = [{"params": {"model": "tiny", "layers_run": TINY.layers, **shape, "dtype": "fp32", "with_head": True,
                           "threads": 1, "batch": b, "seq_len": p, "new_tokens": steps},
                "metrics": {"seconds": _true_call(b, p, steps) + extra}}
               for (b, p), extra in EXTRA.items() for _ in range(repeats)]
    db.add_benchmark(calloverhead.BENCHMARK, dev, "synth", {"model": "tiny"}, samples)


def test_a_profiled_call_is_predicted_as_measured_and_others_get_the_median(tmp_path):
    with ProfileDB(tmp_path / "db.sqlite") as db:
        add_rows(db, models=("tiny",), tasks=("prefill", "decode"), repeats=3)
        _add_calls(db)
        fits = fitting.fit_database(db, stat="median", envelope=False)
        (dec,) = [f for f in fits if f.task_type == "task.decode"]
        assert dec.call is not None and set(dec.call.points) == {(KEY, *shape) for shape in EXTRA}
        assert dec.metrics()["call_points"] == len(EXTRA)
        fitting.store(db, fits)
        cm = FittedCostModel(db)
    # what each profiled call took beyond the *fitted* phases: its extra cost, up to the fit's error
    for shape, extra in EXTRA.items():
        assert dec.call.points[(KEY, *shape)] == pytest.approx(extra, abs=0.2 * _true_call(*shape, 4))
    assert max(dec.call.points, key=dec.call.points.get) == (KEY, 4, 48)  # the largest extra stands out

    def generation(batch, prompt, steps=4):
        est = cm.task_time(Work(kind="generation", model=TINY, batch=batch, prompt_len=float(prompt),
                                response_len=float(steps), dtype="fp32"), Placement("cpu", 1))
        return est.seconds, est.breakdown

    measured = _true_call(4, 48, 4) + EXTRA[(4, 48)]  # every repeat identical: the median is the call
    seconds, parts = generation(4, 48)
    assert seconds == pytest.approx(measured, rel=1e-6)
    assert parts["call"] == pytest.approx(dec.call.points[KEY, 4, 48])
    # a shape no call was profiled at gets its model's median difference; a long response pays it once
    _, parts = generation(3, 40)
    assert parts["call"] == pytest.approx(dec.call.models[KEY]) == pytest.approx(dec.call.default_s)
    _, long = generation(3, 40, steps=200)
    assert long["call"] == parts["call"] and long["decode"] > 10 * parts["decode"]


def test_calls_need_the_prefill_fit_and_other_devices_ignore_them(tmp_path):
    with ProfileDB(tmp_path / "db.sqlite") as db:
        add_rows(db, models=("tiny",), tasks=("prefill", "decode"), repeats=3)
        _add_calls(db)
        skipped: list[str] = []
        (dec,) = fitting.fit_database(db, task="task.decode", stat="median", skipped=skipped)
        assert dec.call is None and any("fit task.prefill and task.decode together" in s for s in skipped)
        add_rows(db, models=("tiny",), tasks=("prefill", "decode"), repeats=3, catalog_type="A100-80GB")
        fits = fitting.fit_database(db, stat="median")
    by_device = {f.device_type: f.call for f in fits if f.task_type == "task.decode"}
    assert by_device["cpu"] is not None and by_device["A100-80GB"] is None


def test_stored_overheads_round_trip_and_bad_ones_are_refused():
    learned = calloverhead.learn([(KEY, 4, 48, 0.010, 0.008), (KEY, 1, 16, 0.002, 0.0025),
                                  (KEY, 2, 16, float("nan"), 0.001)])
    assert learned.points == {(KEY, 4, 48): pytest.approx(0.002), (KEY, 1, 16): pytest.approx(-0.0005)}
    again = calloverhead.load(json.loads(json.dumps(learned.to_json())))
    assert again == learned and again.seconds(9, 9, KEY) == learned.default_s
    # an entry stored before calls were told apart by model: its points price any model, as they did
    older = calloverhead.load({"default_s": 0.001, "points": [[4, 48, 0.003]]})
    assert older.seconds(4, 48, KEY) == 0.003 and older.seconds(4, 49, KEY) == 0.001
    assert calloverhead.learn([]) is None and calloverhead.load(None) is None
    for bad in ({"default_s": True}, {"default_s": float("inf")}, {"default_s": 0.0, "points": "x"},
                {"default_s": 0.0, "points": [[1, 2]]}, {"default_s": 0.0, "points": [[1, "2", 0.0]]},
                {"default_s": 0.0, "points": [[1, 2, 0.0, 64]]}, {"default_s": 0.0, "models": [[64, 0.0]]},
                {"default_s": 0.0, "runs": -1}, "x"):
        with pytest.raises(ValueError, match="call_overhead"):
            calloverhead.load(bad)
    entry = {"format": 1, "task_type": "task.prefill", "phase": "prefill", "device_type": "cpu", "dtype": "fp32",
             "features": list(fitting.FEATURES), "family": "nnls", "model": {"coef": [1.0] * len(fitting.FEATURES)},
             "call_overhead": {"default_s": 0.001}}
    with pytest.raises(ValueError, match="task.decode"):
        validate_entry({"id": "x", "task_type": "task.prefill", "family": "nnls", "params": entry})
