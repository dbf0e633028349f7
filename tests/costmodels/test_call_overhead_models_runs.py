"""What a generation call costs beyond its phases is each model's own, and once runs calibrate the
phases it is learned from the runs' calls rather than counted twice."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.costmodels_synth import MODELS, add_rows, true_seconds

from hetprof.costmodels import Placement, Work, calloverhead, fitting
from hetprof.costmodels.base import generation_phases
from hetprof.costmodels.data import Phase
from hetprof.costmodels.fitted import FittedCostModel
from hetprof.costmodels.runrows import run_call_rows
from hetprof.executor.records.run_log import write_db
from hetprof.profiles import DeviceInfo, ProfileDB

TINY, WIDE = MODELS["tiny"], MODELS["tiny-2x"]
SHAPES = ((2, 16), (4, 48), (8, 70))
STEPS = 4


def _true_call(model, batch: int, prompt: int, steps: int = STEPS) -> float:
    def phase(kind, b, tokens, head):
        return true_seconds(Phase(kind, model, model.layers, b, tokens, with_head=head, dtype="fp32"))

    return sum(generation_phases(phase, batch, prompt, steps))


def _add_calls(db: ProfileDB, model, extra: float) -> None:
    dev = db.add_device(DeviceInfo(name="synthetic cpu", kind="cpu", catalog_type="cpu", host="synth"))
    shape = {k: getattr(model, k) for k in calloverhead.MODEL_FIELDS}
    samples = [{"params": {"model": model.name, "layers_run": model.layers, **shape, "dtype": "fp32",
                           "with_head": True, "threads": 1, "batch": b, "seq_len": p, "new_tokens": STEPS},
                "metrics": {"seconds": _true_call(model, b, p) + extra}} for b, p in SHAPES for _ in range(3)]
    db.add_benchmark(calloverhead.BENCHMARK, dev, "synth", {"model": model.name}, samples)


def _generation(cm: FittedCostModel, model, batch: int, prompt: int, steps: int = STEPS) -> tuple[float, dict]:
    est = cm.task_time(Work(kind="generation", model=model, batch=batch, prompt_len=float(prompt),
                            response_len=float(steps), dtype="fp32"), Placement("cpu", 1))
    return est.seconds, est.breakdown


def test_a_larger_models_calls_do_not_price_the_jobs_model(tmp_path):
    with ProfileDB(tmp_path / "db.sqlite") as db:
        add_rows(db, models=("tiny", "tiny-2x"), tasks=("prefill", "decode"), repeats=3)
        _add_calls(db, TINY, 0.002)
        _add_calls(db, WIDE, 0.030)  # profiled at the same (batch, prompt) shapes
        fits = fitting.fit_database(db, stat="median", envelope=False)
        fitting.store(db, fits)
        cm = FittedCostModel(db)
    (dec,) = [f for f in fits if f.task_type == "task.decode"]
    assert set(dec.call.models) == {calloverhead.model_key(TINY), calloverhead.model_key(WIDE)}
    for model in (TINY, WIDE):
        key = calloverhead.model_key(model)
        for batch, prompt in SHAPES:  # each profiled shape answers with its own model's difference
            assert _generation(cm, model, batch, prompt)[1]["call"] == pytest.approx(dec.call.points[key, batch, prompt])
        _, parts = _generation(cm, model, 3, 40)  # elsewhere: that model's median, not the pooled one
        assert parts["call"] == pytest.approx(dec.call.models[key])
    # the two models' terms are their own calls' (2 ms and 30 ms beyond, up to the fits' error)
    tiny = [_generation(cm, TINY, b, p)[1]["call"] for b, p in SHAPES]
    wide = [_generation(cm, WIDE, b, p)[1]["call"] for b, p in SHAPES]
    assert max(tiny) < 0.010 < 0.020 < min(wide)


def _run_record(i: int, slow: float, beyond: float) -> dict:
    """One iteration of a one-replica generator whose phases take `slow` × the microbenchmark's and
    whose call `beyond` more than its laps (what the loop does around them)."""
    batch, prompt = 8, 70
    laps = [("prefill", prompt, False)] + [("decode", prompt + k, True) for k in range(1, STEPS)]
    phases = [{"kind": kind, "batch": batch, "tokens": tokens, "device": "h:0", "device_type": "cpu",
               "dtype": "fp32", "threads": 1,
               "seconds": slow * true_seconds(Phase(kind, TINY, TINY.layers, batch, tokens, with_head=head,
                                                    dtype="fp32"))} for kind, tokens, head in laps]
    model = {k: getattr(TINY, k) for k in ("name", "layers", *calloverhead.MODEL_FIELDS)}
    return {"run": "r1", "plan_hash": "h", "iteration": i, "version": i + 1, "mode": "sync", "iteration_s": 1.0,
            "stages": {"actor_gen": 0.1}, "replicas": {"actor_gen": [sum(p["seconds"] for p in phases) + beyond]},
            "predicted": {}, "predicted_iteration_s": 1.0, "devices": {"actor_gen": ["h:0"]}, "layouts": {},
            "reward_mean": 0.0, "kl": 0.0, "clip_frac": 0.0, "tokens_per_s": 1.0, "staleness_max": 0,
            "work": {"actor_gen": {"kind": "generation", "role": "actor", "model": model, "tp": 1, "pp": 1, "dp": 1}},
            "phase_times": {"actor_gen": phases}}


def test_runs_that_calibrate_the_phases_teach_the_call_term_instead_of_adding_it_again(tmp_path):
    db_file = tmp_path / "db.sqlite"
    with ProfileDB(db_file) as db:
        add_rows(db, models=("tiny",), tasks=("prefill", "decode"), repeats=3)
        _add_calls(db, TINY, 0.020)  # the microbenchmark's calls: 20 ms beyond the profiled phases
    records = [_run_record(i, slow=1.5, beyond=0.0005) for i in range(3)]
    write_db(db_file, records)
    measured = records[0]["replicas"]["actor_gen"][0]
    with ProfileDB(db_file) as db:
        calls = run_call_rows(db)
        assert len(calls) == 3 and set(calls["new_tokens"]) == {STEPS} and set(calls["seq_len"]) == {70}
        profile_only = fitting.fit_database(db, stat="median", runs=False)
        fits = fitting.fit_database(db, stat="median")
        (dec,) = [f for f in fits if f.task_type == "task.decode"]
        assert dec.runs is not None and dec.call.runs == 3 and not dec.call.points
        fitting.store(db, fits)
        cm = FittedCostModel(db)
    (plain,) = [f for f in profile_only if f.task_type == "task.decode"]
    assert plain.call.runs == 0 and plain.call.default_s == pytest.approx(0.020, abs=0.2 * _true_call(TINY, 8, 70))
    seconds, parts = _generation(cm, TINY, 8, 70)
    # in sample: the run's call as it took it; the profile's 20 ms would have come on top
    assert seconds == pytest.approx(measured, rel=0.05)
    assert abs(parts["call"]) < 0.25 * measured < 0.020


def test_a_calibrating_runs_rows_are_its_own_medians_but_runs_fitted_as_rows_are_enveloped(tmp_path):
    db_file = tmp_path / "db.sqlite"
    # a run's longer prompt measured faster than its shorter one (a quiet moment): not physics, conditions
    slow = [_run_record(i, slow=1.5, beyond=0.0) for i in range(2)]
    for rec in slow:
        for p in rec["phase_times"]["actor_gen"]:
            p["tokens"] -= 1 if p["kind"] == "prefill" else 0
    fast = [_run_record(i + 2, slow=1.0, beyond=0.0) for i in range(2)]
    write_db(db_file, slow + fast)

    def run_prefill_seconds(db) -> list[float]:
        (group,) = fitting.task_groups(db, task="task.prefill", stat="median")
        return sorted(s for s, src in zip(group.seconds, group.sources, strict=True) if src == "run")

    with ProfileDB(db_file) as db:
        alone = run_prefill_seconds(db)  # no profile: the runs are the rows, and bound each other
        assert alone[0] == alone[1]
        add_rows(db, models=("tiny",), tasks=("prefill",), repeats=3)
        calibrating = run_prefill_seconds(db)
    assert calibrating[0] < calibrating[1] and np.isclose(calibrating[1] / calibrating[0], 1.5 * 70 / 69, rtol=0.2)
