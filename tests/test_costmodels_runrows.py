"""`hetprof fit` learns from what real runs recorded, not only from the profiler's microbenchmarks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from costmodels_synth import add_rows, true_seconds

from hetprof.costmodels import fitting
from hetprof.costmodels.data import Phase
from hetprof.costmodels.runrows import run_task_rows
from hetprof.executor.records import db_rows, write_db
from hetprof.models import PRESETS
from hetprof.profiles import ProfileDB

TINY = PRESETS["tiny"]
MODEL = {k: getattr(TINY, k) for k in ("name", "layers", "hidden", "ffn", "heads", "kv_heads", "head_dim", "vocab")}
HETPROF = str(Path(sys.executable).with_name("hetprof"))


def phase(kind: str, batch: int, tokens: int, seconds: float, **extra) -> dict:
    return {"kind": kind, "batch": batch, "tokens": tokens, "seconds": seconds, "device": "h:0",
            "device_type": "cpu", "dtype": "fp32", "threads": 1, "with_head": True, **extra}


def record(i: int, gen: list[dict], train: list[dict], pp: int = 1) -> dict:
    """An iteration record as the runtime writes it (see executor/records.py)."""
    return {"run": "r1", "plan_hash": "h", "iteration": i, "version": i + 1, "mode": "sync", "iteration_s": 1.0,
            "stages": {"actor_gen": 0.4, "actor_train": 0.5}, "replicas": {}, "predicted": {},
            "predicted_iteration_s": 1.0, "devices": {"actor_gen": ["h:0"], "actor_train": ["h:0"]},
            "layouts": {}, "reward_mean": 0.0, "kl": 0.0, "clip_frac": 0.0, "tokens_per_s": 1.0,
            "staleness_max": 0,
            "work": {"actor_gen": {"kind": "generation", "role": "actor", "model": MODEL, "tp": 1, "pp": 1, "dp": 1},
                     "actor_train": {"kind": "training", "role": "actor", "model": MODEL, "tp": 1, "pp": pp,
                                     "dp": 1}},
            "phase_times": {"actor_gen": gen, "actor_train": train}}


def test_recorded_phases_become_task_rows_and_what_cannot_be_one_is_counted(tmp_path):
    gen = [phase("prefill", 8, 70, 0.012), phase("decode", 8, 71, 0.002), phase("decode", 8, 72, 0.0021),
           phase("decode", 0, 73, 0.002), phase("warp", 8, 70, 0.1)]  # a bad batch and an unknown kind
    recs = [record(0, gen, [phase("train", 4, 72, 0.05, steps=8)]),
            record(1, gen[:1], [phase("train", 4, 72, 0.05)], pp=2)]  # a pipeline stage: layers unknown
    rows = db_rows(recs[0])
    assert rows[0]["extra"]["work"]["model"]["hidden"] == TINY.hidden and len(rows[0]["extra"]["phases"]) == 5
    write_db(tmp_path / "db.sqlite", recs)
    skipped: list[str] = []
    with ProfileDB(tmp_path / "db.sqlite") as db:
        df = run_task_rows(db, skipped)
    assert sorted(df["benchmark"].value_counts().items()) == [("task.decode", 2), ("task.prefill", 2),
                                                              ("task.train", 1)]
    prefill = df[df["benchmark"] == "task.prefill"].iloc[0]
    assert (prefill["seq_len"], prefill["batch"], prefill["layers_run"], prefill["source"]) == (70, 8, 2, "run")
    assert set(df[df["benchmark"] == "task.decode"]["context_len"]) == {71, 72}
    assert skipped and "3 recorded run phases" in skipped[0]


def test_fit_learns_run_rows_next_to_profiler_rows_and_can_leave_them_out(tmp_path):
    db_file = tmp_path / "db.sqlite"
    with ProfileDB(db_file) as db:
        add_rows(db, tasks=("decode",), repeats=3)
    # A run's decode steps are slower than the microbenchmark (sampling, a busy host): 1.5×.
    steps = []
    for ctx in (40, 60, 80, 100):
        for batch in (3, 6):
            t = 1.5 * true_seconds(Phase("decode", TINY, TINY.layers, batch, ctx, with_head=True, dtype="fp32"))
            steps.append(phase("decode", batch, ctx, t))
    write_db(db_file, [record(i, steps, []) for i in range(3)])
    with ProfileDB(db_file) as db:
        with_runs = fitting.fit_database(db, task="task.decode")
        without = fitting.fit_database(db, task="task.decode", runs=False)
        (fit_runs,), (fit_plain,) = with_runs, without
        assert fit_runs.n_run_rows == 8 and fit_plain.n_run_rows == 0
        assert fit_runs.n_rows == fit_plain.n_rows + 8
        ids = fitting.store(db, with_runs)
        assert db.get_cost_model(ids[0])["metrics"]["n_run_rows"] == 8
    done = subprocess.run([HETPROF, "--db", str(db_file), "fit", "--task", "task.decode", "--no-store"],
                          capture_output=True, text=True, env={**os.environ, "COLUMNS": "250"})
    assert done.returncode == 0, done.stderr
    header = next(line for line in done.stdout.splitlines() if "family" in line)
    row = next(line for line in done.stdout.splitlines() if "task.decode" in line)
    assert "from runs" in header and " 8 " in row


def test_a_microbenchmark_never_caps_a_runs_own_measurement():
    small = Phase("decode", TINY, TINY.layers, 2, 40, with_head=True, dtype="fp32")
    large = Phase("decode", TINY, TINY.layers, 4, 80, with_head=True, dtype="fp32")
    seconds = np.array([0.005, 0.002, 0.006])  # run: small 5 ms; profile: large 2 ms; run: large 6 ms
    out = fitting.monotone_envelope([small, large, large], seconds, ["run", "profile", "run"])
    assert out.tolist() == [0.005, 0.002, 0.006]
    out = fitting.monotone_envelope([small, large], np.array([0.005, 0.002]), ["profile", "profile"])
    assert out.tolist() == [0.002, 0.002]


@pytest.mark.parametrize("bad", ["not a list", [1, 2], [{"kind": "decode"}]])
def test_malformed_phase_lists_are_skipped_not_fatal(tmp_path, bad):
    rec = record(0, [], [])
    rec["phase_times"] = {"actor_gen": bad}
    write_db(tmp_path / "db.sqlite", [rec])
    with ProfileDB(tmp_path / "db.sqlite") as db:
        assert run_task_rows(db).empty
    json.dumps(rec)  # still plain data
