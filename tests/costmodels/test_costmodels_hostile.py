"""A shared database can carry only numbers: hostile or odd cost-model entries are refused, never run."""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import pickle
import sqlite3
import time

import pytest
from helpers.costmodels_synth import add_rows

from hetprof.costmodels import Phase, get_cost_model
from hetprof.costmodels.features import FEATURES
from hetprof.costmodels.fitting import fit_database, store
from hetprof.profiles import ProfileDB
from hetprof.specs.models import PRESETS


class Payload:
    """Runs a command when unpickled: what a pickled 'model' from a stranger can do."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def _entry(family="nnls", model=None, **over):
    params = {"format": 1, "task_type": "task.decode", "phase": "decode", "device_type": "cpu", "dtype": "fp32",
              "threads": 1, "features": list(FEATURES), "family": family,
              "model": model if model is not None else {"coef": [1.0] * len(FEATURES)}, "range": {}}
    params.update(over)
    return params


def _tree(**over):
    tree = {"feature": [0, 0, 0], "threshold": [0.0, 0.0, 0.0], "left": [1, 0, 0], "right": [2, 0, 0],
            "leaf": [False, True, True], "value": [0.0, -1.0, 1.0]}
    tree.update(over)
    return {"baseline": -5.0, "trees": [tree]}


def hostile_rows(sentinel):
    cmd = f"__import__('os').system('touch {sentinel}')"
    blob = pickle.dumps(Payload(sentinel)).hex()
    return [
        # (family column, params text)
        (cmd, json.dumps(_entry(family=cmd))),
        ("nnls", json.dumps(_entry(model={"coef": cmd}))),
        ("nnls", json.dumps(_entry(model={"coef": [cmd] * len(FEATURES)}))),
        ("nnls", json.dumps({"py/reduce": [{"py/function": "os.system"}, {"py/tuple": [f"touch {sentinel}"]}]})),
        ("nnls", json.dumps(blob)),  # a pickle, hex-encoded, as the whole parameter object
        ("nnls", json.dumps(_entry(model={"coef": [1.0] * len(FEATURES), "pickle": blob}, family="pickle"))),
        ("nnls", pickle.dumps(Payload(sentinel), protocol=0).decode("latin-1")),  # raw pickle text
        ("nnls", json.dumps(_entry(model={"coef": [-1.0] + [1.0] * (len(FEATURES) - 1)}))),  # not monotone
        ("nnls", json.dumps(_entry(model={"coef": [1.0] * 3}))),  # wrong length
        ("nnls", json.dumps(_entry(model={"coef": [1e999] * len(FEATURES)}))),  # inf (json writes Infinity)
        ("nnls", '{"format": 1, "coef": [NaN]}'),
        ("nnls", json.dumps(_entry(features=["compute_s", "os.system"]))),
        ("nnls", json.dumps(_entry(device_type="../../etc/passwd"))),
        ("hgb", json.dumps(_entry(family="hgb", model=_tree(left=[0, 0, 0])))),  # a cycle: must not hang
        ("hgb", json.dumps(_entry(family="hgb", model=_tree(value=[0.0, 1.0, -1.0])))),  # decreasing
        ("hgb", json.dumps(_entry(family="hgb", model=_tree(feature=[99, 0, 0])))),
        ("hgb", json.dumps(_entry(family="hgb", model={"baseline": 0.0, "trees": [_tree()["trees"][0]] * 5000}))),
        ("hgb", json.dumps(_entry(family="hgb", model=_tree(leaf=["False", True, True])))),
        ("nnls_hgb", json.dumps(_entry(family="nnls_hgb", model=_tree()))),  # coef missing
        ("gbr", json.dumps(_entry(family="gbr"))),
        ("nnls", json.dumps(_entry(task_type="task.train"))),  # disagrees with its row
        ("nnls", json.dumps(_entry(format=2))),
        ("nnls", json.dumps(_entry(run_factor=1e9))),  # a "calibration" that makes a device unusable
        ("nnls", json.dumps(_entry(run_factor=-1.0))),
        ("nnls", json.dumps(_entry(run_factor=cmd))),
        ("nnls", json.dumps(_entry(run_factor=True))),
        ("nnls", json.dumps(_entry(points=[[1.0] * len(FEATURES) + [1e6]]))),  # a "measured" shape 10^6x off
        ("nnls", json.dumps(_entry(points=[[cmd] * (len(FEATURES) + 1)]))),
        ("nnls", json.dumps(_entry(points=[[1.0] * 3]))),  # wrong length
        ("nnls", json.dumps(_entry(points=[[-1.0] * len(FEATURES) + [1.0]]))),
        ("nnls", json.dumps(_entry(points=[[1.0] * (len(FEATURES) + 1)] * 20_001))),  # unbounded table
        ("nnls", json.dumps(_entry(points={"x": 1}))),
        ("nnls", json.dumps(_entry(call_overhead={"default_s": 1e9}))),  # a "call" that makes generation unusable
        ("nnls", json.dumps(_entry(call_overhead={"default_s": cmd}))),
        ("nnls", json.dumps(_entry(call_overhead={"default_s": 0.001, "points": [[0, 16, 0.001]]}))),  # batch 0
        ("nnls", json.dumps(_entry(call_overhead={"default_s": 0.001, "points": [[1.5, 16, 0.001]]}))),
        ("nnls", json.dumps(_entry(call_overhead={"default_s": 0.001, "points": [[1, 16, 0.001]] * 5001}))),
        ("nnls", json.dumps(_entry(call_overhead=[0.001]))),
    ]


@contextlib.contextmanager
def guarded():
    """Fail loudly if loading reaches for anything that runs code (modules are imported beforehand)."""
    import hetprof.costmodels.families  # noqa: F401
    import hetprof.costmodels.fitted  # noqa: F401

    def refuse(*_a, **_k):
        raise AssertionError("loading a cost model tried to run code")

    with pytest.MonkeyPatch.context() as mp:
        for mod, name in ((builtins, "eval"), (builtins, "exec"), (pickle, "loads"), (pickle, "load"),
                          (os, "system")):
            mp.setattr(mod, name, refuse)
        yield


def test_hostile_entries_are_refused_and_never_executed(tmp_path):
    sentinel = tmp_path / "pwned"
    path = tmp_path / "shared.db"
    with ProfileDB(path) as db:
        add_rows(db, models=("tiny",), batches=(1, 2, 4), lengths=(16, 48, 128), tasks=("decode",))
        (good,) = store(db, fit_database(db))
    rows = hostile_rows(sentinel)
    conn = sqlite3.connect(path)  # a stranger's database need not have gone through our validation
    now = time.time() + 10  # newer than the good entry: each would win if it were accepted
    for i, (family, params) in enumerate(rows):
        conn.execute("INSERT INTO cost_models VALUES (?,?,?,?,?,?,?,?,?,?)",
                     (f"{i:064x}", "fitted", "task.decode", family, params, "{}", "", "0", now + i, "fitted"))
    conn.commit()
    conn.close()
    with ProfileDB(path) as db:
        db.cost_models()  # pandas and friends imported before the guard goes up
        with guarded(), pytest.warns(UserWarning, match="ignored"):
            cm = get_cost_model("fitted", db=db)
            t = cm.phase_time(Phase("decode", PRESETS["tiny"], 2, 4, 64, with_head=True, dtype="fp32"), "cpu")
    assert len(cm.rejected) == len(rows), cm.rejected
    assert not sentinel.exists()
    # the valid older entry still answers
    (model,) = cm.models.values()
    assert model.id == good
    assert t.source == "fitted" and 0 < t.seconds < 1


def test_every_rejection_names_the_problem(tmp_path):
    from hetprof.costmodels.fitted import validate_entry

    for family, params in hostile_rows(tmp_path / "x"):
        try:
            parsed = json.loads(params)
        except ValueError:
            continue  # not JSON at all: the database layer raises before validation
        with guarded(), pytest.raises(ValueError) as err:
            validate_entry({"id": "x", "task_type": "task.decode", "family": family, "params": parsed})
        assert str(err.value)
