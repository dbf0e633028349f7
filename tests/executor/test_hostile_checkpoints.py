"""Hostile checkpoint folders (issue 37): markers, run names, planted folders, damaged state files.

Each case is refused in one line naming the file (exit 2), fast and in bounded memory, or handled
without losing a checkpoint this run wrote.
"""

from __future__ import annotations

import json
import os
import pickle
import time
import tracemalloc

import pytest
import torch

from hetprof.errors import HetprofError
from hetprof.executor.checkpoints import checkpoint
from hetprof.executor.records.tensorboard_log import run_folder

STATE = {"model": {"w": torch.arange(4.0)}}


def _save(root, unit, it, run="run-a", plan="h"):
    return checkpoint.save(checkpoint.task_dir(root, unit), it, STATE, {"plan_hash": plan, "run": run})


@pytest.mark.parametrize("text, match", [
    ('{"iteration": Infinity, "run": "r"}', "not valid JSON"),
    ('{"iteration": 1e999, "run": "r"}', "finite"),
    ('{"iteration": true, "run": "r"}', "'iteration'"),
    ('{"iteration": 4, "run": "../ESCAPED_TB"}', "'run'"),
    ('{"iteration": 4, "run": "/abs/path"}', "'run'"),
    ('{"iteration": 4}', "'run'"),
    ("[" * 100_000 + "]" * 100_000, "COMMITTED.json"),
    ('{"a":' * 200 + "1" + "}" * 200, "nested"),
    ('{"iteration": ' + "9" * 5000 + ', "run": "r"}', "not valid JSON"),
    ("\xff\xfe", "not valid JSON"),
])
def test_bad_committed_markers_are_refused_in_one_line(tmp_path, text, match):
    (tmp_path / checkpoint.COMMIT).write_bytes(text.encode("utf-8", "surrogateescape") if text != "\xff\xfe"
                                                else b"\xff\xfe")
    with pytest.raises(HetprofError, match=match) as err:
        checkpoint.committed(tmp_path)
    assert err.value.exit_code == 2 and "\n" not in str(err.value) and "COMMITTED.json" in str(err.value)


def test_fifo_and_sparse_markers_are_refused_fast_in_bounded_memory(tmp_path):
    os.mkfifo(tmp_path / checkpoint.COMMIT)
    with pytest.raises(HetprofError, match="FIFO"):
        checkpoint.committed(tmp_path)  # would wait for a writer forever if opened blocking
    os.unlink(tmp_path / checkpoint.COMMIT)
    with open(tmp_path / checkpoint.COMMIT, "wb") as f:
        f.truncate(1 << 30)  # a sparse 1 GB marker
    tracemalloc.start()
    started = time.process_time()
    with pytest.raises(HetprofError, match="larger than"):
        checkpoint.committed(tmp_path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 16 << 20 and time.process_time() - started < 10


def test_run_name_is_never_a_path_under_the_tensorboard_dir(tmp_path):
    assert run_folder(tmp_path, "run-1a2b3c4d-20260101T000000") == tmp_path / "run-1a2b3c4d-20260101T000000"
    for bad in ("../ESCAPED_TB", "/tmp/x", "..", "a/b", ""):
        with pytest.raises(ValueError):
            run_folder(tmp_path, bad)


def test_planted_later_folders_never_make_the_run_prune_its_own_checkpoint(tmp_path):
    unit = checkpoint.task_dir(tmp_path, "actor_train")
    for planted in (999998, 999999):  # another person's folders
        (unit / checkpoint.iteration_folder(planted)).mkdir(parents=True)
    _save(tmp_path, "actor_train", 9, run="old-run")  # a previous run's later iteration
    for it in (2, 4, 6):
        _save(tmp_path, "actor_train", it)
    kept = sorted(p.name for p in unit.glob("iter-*"))
    assert kept == ["iter-000004", "iter-000006", "iter-000009", "iter-999998", "iter-999999"]
    checkpoint.commit(tmp_path, 6, {"plan_hash": "h", "run": "run-a"})
    assert checkpoint.resume_point(tmp_path, "h")[:2] == (6, "run-a")


def test_saves_running_ahead_of_the_commit_never_prune_the_committed_checkpoint(tmp_path):
    """The leader commits from its record thread, which can trail the saves: a run that saved 4 and 6
    while COMMITTED.json still named 2 pruned 2 (keep=2), and --resume then found no state to load."""
    unit = checkpoint.task_dir(tmp_path, "actor_train")
    meta = {"plan_hash": "h", "run": "run-a", "task": "actor_train"}

    def save(it: int) -> None:
        protect = [name] if (name := checkpoint.committed_folder(tmp_path)) else ()
        checkpoint.save(unit, it, {"w": torch.ones(2) * it}, meta, protect=protect)

    save(2)
    checkpoint.commit(tmp_path, 2, {"plan_hash": "h", "run": "run-a"})
    save(4)
    save(6)  # the record thread has not committed 4 yet
    assert sorted(p.name for p in unit.glob("iter-*")) == ["iter-000002", "iter-000004", "iter-000006"]
    assert checkpoint.resume_point(tmp_path, "h")[:2] == (2, "run-a")
    checkpoint.commit(tmp_path, 6, {"plan_hash": "h", "run": "run-a"})
    save(8)  # 2 is no longer the resume point: pruned now, with 4 (keep=2)
    assert sorted(p.name for p in unit.glob("iter-*")) == ["iter-000006", "iter-000008"]


def test_a_planted_record_cannot_name_folders_outside(tmp_path):
    unit = checkpoint.task_dir(tmp_path, "actor_train")
    unit.mkdir(parents=True)
    (tmp_path / "keep-me").mkdir()
    (unit / checkpoint.WRITTEN).write_text(json.dumps({"run": "run-a", "written": ["../../keep-me", "iter-000001"]}))
    for it in (2, 4):
        _save(tmp_path, "actor_train", it)
    assert (tmp_path / "keep-me").is_dir()


def test_latest_pointer_is_a_name_not_a_path(tmp_path):
    unit = checkpoint.task_dir(tmp_path, "actor_train")
    _save(tmp_path, "actor_train", 2)
    assert checkpoint.latest(unit) == unit / "iter-000002"
    (unit / checkpoint.LATEST).write_text("../../elsewhere\n")
    assert checkpoint.latest(unit) is None


@pytest.mark.parametrize("damage", ["pickle", "empty", "fifo", "object"])
def test_a_damaged_state_is_refused_naming_it_and_resume_falls_back(tmp_path, damage):
    for it in (2, 4):
        _save(tmp_path, "actor_train", it)
    checkpoint.commit(tmp_path, 4, {"plan_hash": "h", "run": "run-a"})
    state = tmp_path / "actor_train" / "iter-000004" / checkpoint.STATE
    state.unlink()
    if damage == "pickle":
        state.write_bytes(pickle.dumps({"x": os.system}))
    elif damage == "empty":
        state.write_bytes(b"")
    elif damage == "fifo":
        os.mkfifo(state)
    else:
        torch.save({"x": os.getcwd}, state)
    with pytest.raises(HetprofError) as err:
        checkpoint.load(state.parent)
    text = str(err.value)
    assert err.value.exit_code == 2 and str(state) in text and "\n" not in text and "weights_only=False" not in text
    start, run, warnings = checkpoint.resume_point(tmp_path, "h")
    assert (start, run) == (2, "run-a") and len(warnings) == 1 and "iter-000004" in warnings[0]


def test_no_intact_checkpoint_is_refused(tmp_path):
    _save(tmp_path, "actor_train", 2)
    checkpoint.commit(tmp_path, 2, {"plan_hash": "h", "run": "run-a"})
    (tmp_path / "actor_train" / "iter-000002" / checkpoint.STATE).write_bytes(b"junk")
    with pytest.raises(HetprofError, match="no intact checkpoint") as err:
        checkpoint.resume_point(tmp_path, "h")
    assert err.value.exit_code == 2


def test_folders_that_hold_no_checkpoint_are_not_units(tmp_path):
    _save(tmp_path, "actor_train", 2)
    (tmp_path / "hf" / "iter-000002" / "actor").mkdir(parents=True)  # hf_export's model folders
    checkpoint.commit(tmp_path, 2, {"plan_hash": "h", "run": "run-a"})
    assert checkpoint.resume_point(tmp_path, "h") == (2, "run-a", [])


def test_planted_export_folders_never_make_the_export_prune_itself(tmp_path):
    from hetprof.executor.checkpoints.hf_export import _prune, export_folder

    export_folder(tmp_path, 999999, "actor").mkdir(parents=True)  # planted
    for it in (2, 4, 6):
        export_folder(tmp_path, it, "actor").mkdir(parents=True)
        _prune(tmp_path / "hf", "actor", keep=2, iteration=it)
    assert sorted(p.name for p in (tmp_path / "hf").glob("iter-*")) == ["iter-000004", "iter-000006", "iter-999999"]


def test_a_host_holding_no_unit_resumes_from_the_committed_iteration(tmp_path):
    checkpoint.commit(tmp_path, 4, {"plan_hash": "h", "run": "run-a"})  # the units live on other hosts
    assert checkpoint.resume_point(tmp_path, "h") == (4, "run-a", [])


def _resume_without_workers(tmp_path, monkeypatch, write_checkpoint):
    """`hetprof run --resume` of a small CPU plan whose checkpoint folder `write_checkpoint(folder,
    plan)` filled, with the worker launch replaced by a failure: (exit code, non-empty output lines)."""
    from pathlib import Path

    import torch.distributed.launcher.api as api
    from click.testing import CliRunner

    from hetprof.cli import cli
    from hetprof.executor.launch.handwritten_plan import handwritten_plan
    from hetprof.specs import ClusterSpec, WorkloadSpec

    def refuse(*_a, **_k):
        raise AssertionError("a worker was started")

    monkeypatch.setattr(api, "elastic_launch", refuse)
    root = Path(__file__).resolve().parents[2]
    cluster = ClusterSpec.from_dict({"name": "cpu", "hosts": [{"name": "localhost", "gpus": {"type": "cpu", "count": 2}}]})
    base = WorkloadSpec.load(root / "examples" / "workloads" / "grpo-tiny.yaml").to_dict()
    base.update({"prompts_per_step": 4, "responses_per_prompt": 4, "ppo_epochs": 1, "mini_batches": 1})
    plan = handwritten_plan(cluster, base, {"actor_gen": ["localhost:0"], "ref_infer": ["localhost:1"],
                                            "actor_train": ["localhost:1"]})
    plan.save(tmp_path / "plan.json")
    (tmp_path / "ckpt").mkdir()
    write_checkpoint(tmp_path / "ckpt", plan)
    result = CliRunner().invoke(cli, ["--db", str(tmp_path / "db.sqlite"), "run", str(tmp_path / "plan.json"),
                                      "--checkpoint-dir", str(tmp_path / "ckpt"), "--resume",
                                      "--tensorboard-dir", str(tmp_path / "tb")])
    return result.exit_code, [ln for ln in result.output.splitlines() if ln.strip()]


@pytest.mark.parametrize("marker", ['{"iteration": 1e999, "run": "r"}', '{"iteration": 2, "run": "../ESCAPED_TB"}',
                                    "[" * 100_000])
def test_hetprof_run_resume_refuses_a_hostile_marker_in_one_line_before_any_worker(tmp_path, monkeypatch, marker):
    code, lines = _resume_without_workers(tmp_path, monkeypatch,
                                          lambda folder, plan: (folder / checkpoint.COMMIT).write_text(marker))
    assert code == 2 and len(lines) == 1 and "COMMITTED.json" in lines[0], lines
    assert not (tmp_path / "ESCAPED_TB").exists()


def test_hetprof_run_resume_refuses_an_older_checkpoint_without_learner_progress_before_any_worker(
        tmp_path, monkeypatch):
    """A trainer's state.pt of an older hetprof (model and optimizer only) is refused by the launcher in
    one line naming the file, not by a worker after every rank has started."""
    from hetprof.executor.records.run_log import plan_hash

    def older(folder, plan):
        meta = {"plan_hash": plan_hash(plan), "run": "run-a"}
        checkpoint.save(checkpoint.task_dir(folder, "actor_train"), 2,
                        {"model": {"w": torch.zeros(1)}, "optimizer": {"state": {}, "param_groups": []}}, meta)
        checkpoint.commit(folder, 2, meta)

    code, lines = _resume_without_workers(tmp_path, monkeypatch, older)
    assert code == 2 and len(lines) == 1, lines
    assert "no learner progress" in lines[0] and "actor_train/iter-000002/state.pt" in lines[0]


# ---- the state a resume continues from: refused naming its file when it is not what the run saved ----

def _rank_state(tmp_path, rollouts=None, rng=None, data=None):
    from hetprof.executor.checkpoints.resume import rank_unit

    state = {"rng": checkpoint.rng_state() if rng is None else rng, "rollouts": rollouts or {}, "runners": {}}
    meta = {"plan_hash": "h", "run": "run-a", "rank": 0, "data": {"cursor": 2} if data is None else data}
    return checkpoint.save(checkpoint.task_dir(tmp_path, rank_unit(0)), 2, state, meta)


def test_a_rank_state_round_trips_its_generators_and_rollouts(tmp_path):
    import random

    from hetprof.executor.checkpoints.resume import load_rank, save_rank

    rollout = {"input_ids": torch.arange(6).reshape(2, 3)}
    saved, loaded = _Shuffled(torch.Generator().manual_seed(5)), _Shuffled(torch.Generator().manual_seed(9))
    torch.randperm(7, generator=saved.rng)  # advanced as a replica's own share advances it
    save_rank(str(tmp_path), 0, 2, "h", "run-a", {"cursor": 2}, {1: rollout, 2: rollout, 3: rollout},
              {"actor_train": saved, "actor_gen": _Shuffled(None)})
    drawn = (random.random(), torch.rand(1))
    own = load_rank(str(tmp_path), 0, 2, torch.device("cpu"), {"actor_train": loaded, "actor_gen": _Shuffled(None)})
    assert sorted(own.rollouts) == [2, 3] and torch.equal(own.rollouts[2]["input_ids"], rollout["input_ids"])
    assert own.data == {"cursor": 2} and (random.random(), torch.rand(1)) == drawn  # generators put back
    assert torch.equal(loaded.rng.get_state(), saved.rng.get_state())  # the replica's own shuffler


class _Shuffled:
    """A runner whose own state is a shuffler (a trainer's replica), or nothing (rng None)."""

    def __init__(self, rng: torch.Generator | None) -> None:
        self.rng = rng

    def own_state(self) -> dict:
        return {} if self.rng is None else {"shuffler": self.rng.get_state()}

    def load_own_state(self, state: dict) -> None:
        if self.rng is not None:
            if "shuffler" not in state:
                raise ValueError("no shuffler in it")
            self.rng.set_state(state["shuffler"])


def test_a_rank_state_without_its_trainers_shuffler_is_refused_naming_it(tmp_path):
    from hetprof.executor.checkpoints.resume import load_rank, save_rank

    save_rank(str(tmp_path), 0, 2, "h", "run-a", {"cursor": 2}, {}, {"actor_train": _Shuffled(None)})
    with pytest.raises(HetprofError) as err:
        load_rank(str(tmp_path), 0, 2, torch.device("cpu"), {"actor_train": _Shuffled(torch.Generator())})
    assert err.value.exit_code == 2 and "rank-00000" in str(err.value) and "shuffler" in str(err.value)


@pytest.mark.parametrize("damage", ["missing", "rng", "rollout-key", "rollout-value", "data"])
def test_a_malformed_rank_state_is_refused_naming_it_and_changes_no_generator(tmp_path, damage):
    import random

    from hetprof.executor.checkpoints.resume import load_rank

    good = checkpoint.rng_state()
    if damage == "rng":
        _rank_state(tmp_path, rng={**good, "python": {**good["python"], "words": torch.zeros(3, dtype=torch.int64)}})
    elif damage == "rollout-key":
        _rank_state(tmp_path, rollouts={"../1": {"x": torch.zeros(1)}})
    elif damage == "rollout-value":
        _rank_state(tmp_path, rollouts={"2": {"x": [1, 2]}})
    elif damage == "data":
        _rank_state(tmp_path, data=[1])
    before = random.getstate()
    with pytest.raises(HetprofError) as err:
        load_rank(str(tmp_path), 0, 2, torch.device("cpu"), {})
    text = str(err.value)
    assert err.value.exit_code == 2 and "rank-00000" in text and "\n" not in text, text
    assert random.getstate() == before


def test_a_trained_unit_without_its_learner_progress_is_refused_naming_it(tmp_path):
    from hetprof.executor.algorithms import get_algorithm
    from hetprof.executor.algorithms.learner import Learner
    from hetprof.executor.checkpoints.resume import load_units

    model = torch.nn.Linear(2, 2)
    learner = Learner(model, torch.optim.SGD(model.parameters(), lr=0.1), get_algorithm("grpo")())

    class Runner:
        def units(self, lead_only):
            return ["actor_train"]

        def load_state(self, state):
            learner.load_progress_state(state["learner"])

    good = learner.progress_state()
    for bad in ({}, {**good, "steps": -1}, {**good, "rng": good["rng"][:10]},
                {**good, "lr_scheduler": {"last_epoch": 3}}):
        checkpoint.save(checkpoint.task_dir(tmp_path, "actor_train"), 2, {"learner": bad}, {"plan_hash": "h"})
        with pytest.raises(HetprofError) as err:
            load_units({"actor_train": Runner()}, str(tmp_path), 2, torch.device("cpu"))
        assert err.value.exit_code == 2 and "actor_train/iter-000002" in str(err.value), bad
    assert learner.steps == 0
