"""The runtime's pure parts: batch splitting, the async schedule, plan checks, failure naming, records."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from hetprof.errors import ExecutionError, HetprofError, SpecError
from hetprof.executor.checkpoints import checkpoint
from hetprof.executor.launch.checks import check_supported, host_devices, planned_hosts
from hetprof.executor.launch.elastic import describe_failures, node_host
from hetprof.executor.launch.handwritten_plan import handwritten_plan
from hetprof.executor.loop.messages import concat_padded
from hetprof.executor.loop.staleness import VersionCounter, generation_version, schedule
from hetprof.executor.options import RunOptions
from hetprof.executor.parallel.batch_split import row_slices, split_counts
from hetprof.executor.parallel.topology import Topology
from hetprof.executor.records.predicted_vs_measured import summary
from hetprof.executor.records.run_log import db_rows, plan_hash, read_db, read_log, write_db

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = ROOT / "examples" / "workloads" / "grpo-tiny.yaml"


def cluster(hosts: dict[str, int]) -> dict:
    return {"name": "c", "hosts": [{"name": h, "gpus": {"type": "cpu", "count": n}} for h, n in hosts.items()]}


def workload(**kw) -> dict:
    from hetprof.specs import WorkloadSpec

    return {**WorkloadSpec.load(WORKLOAD).to_dict(), **kw}


# ---- shares ---------------------------------------------------------------------------------
@given(st.integers(4, 500), st.lists(st.floats(0.01, 1.0), min_size=1, max_size=4), st.integers(0, 1))
def test_split_counts_sum_exactly_and_stay_within_one_of_the_share(total, shares, minimum):
    counts = split_counts(total, shares, minimum)
    assert sum(counts) == total and all(c >= minimum for c in counts)
    spare = total - minimum * len(shares)
    for c, s in zip(counts, shares, strict=True):
        assert abs((c - minimum) - spare * s / sum(shares)) < 1 + 1e-9


def test_split_counts_refuses_impossible_batches():
    with pytest.raises(ExecutionError, match="at least 2"):
        split_counts(3, [0.5, 0.5], minimum=2)
    with pytest.raises(ExecutionError):
        split_counts(3, [0.0, 0.0])
    assert [s.stop - s.start for s in row_slices([3, 1, 2])] == [3, 1, 2]


# ---- async schedule -------------------------------------------------------------------------
@pytest.mark.parametrize("k", [0, 1, 2, 3])
@pytest.mark.parametrize("start", [0, 3])
def test_schedule_generates_every_batch_once_and_trains_it_at_most_k_versions_later(k, start):
    iterations = 9
    steps = list(schedule(start, iterations, k))
    generated = [s.generate for s in steps if s.generate is not None]
    consumed = [s.consume for s in steps if s.consume is not None]
    assert generated == consumed == list(range(start, iterations))
    version = start  # the generators' weights: one sync per consumed batch
    held = {}
    for s in steps:
        if s.generate is not None:
            held[s.generate] = version
            assert version == generation_version(s.generate, start, k)
        if s.consume is not None:
            assert s.consume - held[s.consume] <= k  # trained at version s.consume
            version += 1


def test_version_counter_raises_on_a_sample_older_than_the_bound():
    vc = VersionCounter(5, bound=1)
    assert vc.staleness([4, 5]) == [1, 0]
    with pytest.raises(ExecutionError, match="bound k = 1"):
        vc.staleness([3])


# ---- plans → ranks --------------------------------------------------------------------------
def test_manual_plan_groups_tasks_that_share_devices_and_normalises_shares():
    plan = handwritten_plan(cluster({"h": 4}), workload(), {"actor_gen": ["h:0", "h:1"], "ref_infer": ["h:2"],
                                                       "actor_train": ["h:2", "h:3"]},
                       shares={"actor_gen": [3, 1]})
    groups = {tuple(g.tasks): g.devices for g in plan.groups}
    # the log-prob pass goes where actor_train goes
    assert groups == {("actor_gen",): ["h:0", "h:1"], ("actor_logprob", "ref_infer", "actor_train"): ["h:2", "h:3"]}
    assert list(plan.task("actor_gen").layout.shares) == [0.75, 0.25]
    with pytest.raises(SpecError, match="placement.ref_infer"):
        handwritten_plan(cluster({"h": 2}), workload(), {"actor_gen": ["h:0"], "actor_train": ["h:1"]})


def test_topology_leads_training_and_builds_sync_edges():
    plan = handwritten_plan(cluster({"a": 2, "b": 2}), workload(), {"actor_gen": ["a:0", "b:1"], "ref_infer": ["a:1"],
                                                                "actor_train": ["b:0", "a:1"]})
    assert planned_hosts(plan) == ["a", "b"] and host_devices(plan, "b") == ["b:0", "b:1"]
    topo = Topology(plan, {"a:0": 0, "a:1": 1, "b:0": 2, "b:1": 3})
    assert topo.leader == 2  # actor_train replica 0
    assert topo.sync_members("weight_sync") == [0, 2, 3]
    assert topo.sync_members("critic_sync") == []
    assert "rank 1 (device a:1; tasks actor_logprob, ref_infer, actor_train)" == topo.describe(1)
    with pytest.raises(ExecutionError, match="no worker runs"):
        Topology(plan, {"a:0": 0, "a:1": 1, "b:0": 2})


def test_check_supported_refuses_gpus_without_cuda_and_layouts_it_cannot_run_naming_the_task():
    from hetprof.specs import Plan

    gpu = {"name": "g", "hosts": [{"name": "n", "gpus": {"type": "A100-40GB", "count": 2}}]}
    plan = handwritten_plan(gpu, workload(), {"actor_gen": [["n:0", "n:1"]], "ref_infer": ["n:1"], "actor_train": ["n:1"]})
    with pytest.raises(ExecutionError, match="no CUDA device"):
        check_supported(plan, cuda_available=False)
    assert check_supported(plan, cuda_available=True) == "nccl"  # TP2 generation is carried out
    data = plan.to_dict()
    for train in (t for t in data["tasks"] if t["task"] in ("actor_train", "actor_logprob")):  # the pass follows
        train["layout"]["tp"] = 2
        train["tasklets"][0]["devices"] = ["n:0", "n:1"]
    for g in data["groups"]:
        g["devices"] = ["n:0", "n:1"]
    assert check_supported(Plan.from_dict(data), cuda_available=True) == "nccl"  # TP2 training is carried out too
    tp4 = handwritten_plan(cluster({"h": 4}), workload(), {"actor_gen": [["h:0", "h:1", "h:2", "h:3"]],
                                                      "ref_infer": ["h:1"], "actor_train": ["h:1"]})
    with pytest.raises(ExecutionError, match=r"actor_gen.*TP4 must divide.*KV heads \(2\)"):
        check_supported(tp4)


def test_tensor_parallel_topology_counts_every_rank_of_a_replica():
    plan = handwritten_plan(cluster({"h": 3}), workload(), {"actor_gen": [["h:0", "h:1"]], "ref_infer": [["h:1", "h:2"]],
                                                       "actor_train": ["h:2"]})
    topo = Topology(plan, {"h:0": 0, "h:1": 1, "h:2": 2})
    gen = topo.tasks["actor_gen"]
    assert gen.ranks == (0,) and gen.all_ranks == (0, 1) and gen.tp == 2 and gen.replica_of(1) == 0
    assert topo.generators == (0, 1) and topo.sync_members("weight_sync") == [0, 1, 2]
    assert topo.tasks_on(1) == ["actor_gen", "ref_infer"]


def test_node_host_refuses_a_node_count_the_plan_does_not_have():
    plan = handwritten_plan(cluster({"a": 1, "b": 1}), workload(), {"actor_gen": ["a:0"], "ref_infer": ["b:0"],
                                                                "actor_train": ["b:0"]})
    assert node_host(plan, 2, 1) == "b"
    with pytest.raises(HetprofError, match="--nnodes 2") as err:
        node_host(plan, 1, 0)
    assert err.value.exit_code == 2  # a bad option, not a failed run
    with pytest.raises(HetprofError, match="node-rank"):
        node_host(plan, 2, 2)


def test_resume_without_a_checkpoint_is_refused_up_front(tmp_path):
    from hetprof.executor.launch.checks import check_resumable

    plan = handwritten_plan(cluster({"h": 2}), workload(), {"actor_gen": ["h:0"], "ref_infer": ["h:1"],
                                                       "actor_train": ["h:1"]})
    with pytest.raises(HetprofError, match="no complete checkpoint") as err:
        check_resumable(tmp_path, plan)
    assert err.value.exit_code == 2  # nothing to resume from: a missing file, bad input
    checkpoint.save(checkpoint.task_dir(tmp_path, "actor_train"), 4, {"w": torch.zeros(1), "learner": {"steps": 4}},
                    {"plan_hash": plan_hash(plan), "run": "r"})  # the launcher checks the state it resumes from
    checkpoint.commit(tmp_path, 4, {"plan_hash": plan_hash(plan), "run": "r"})
    assert check_resumable(tmp_path, plan) == 4


def test_resume_from_a_checkpoint_without_learner_progress_is_refused_up_front(tmp_path):
    """An older hetprof saved a trainer's model and optimizer only: resumed, the run would restart its
    learning-rate schedule and shuffle, so the launcher refuses it in one line naming the file."""
    from hetprof.executor.launch.checks import check_resumable

    plan = handwritten_plan(cluster({"h": 2}), workload(), {"actor_gen": ["h:0"], "ref_infer": ["h:1"],
                                                       "actor_train": ["h:1"]})
    meta = {"plan_hash": plan_hash(plan), "run": "r"}
    checkpoint.save(checkpoint.task_dir(tmp_path, "ranks/rank-00000"), 4, {"rng": {}, "runners": {}}, meta)
    checkpoint.save(checkpoint.task_dir(tmp_path, "actor_train"), 4,
                    {"model": {"w": torch.zeros(1)}, "optimizer": {"state": {}}}, meta)
    checkpoint.commit(tmp_path, 4, meta)
    with pytest.raises(HetprofError, match="no learner progress") as err:
        check_resumable(tmp_path, plan)
    text = str(err.value)
    assert err.value.exit_code == 2 and "actor_train/iter-000004/state.pt" in text and "\n" not in text
    # with the learner's progress, a rank's state from before replicas kept their own shufflers
    checkpoint.save(checkpoint.task_dir(tmp_path, "actor_train"), 4,
                    {"model": {"w": torch.zeros(1)}, "optimizer": {"state": {}}, "learner": {}}, meta)
    checkpoint.save(checkpoint.task_dir(tmp_path, "ranks/rank-00001"), 4, {"rng": {}}, meta)
    checkpoint.commit(tmp_path, 4, meta)
    with pytest.raises(HetprofError, match="no state of this rank's own") as err:
        check_resumable(tmp_path, plan)
    assert err.value.exit_code == 2 and "ranks/rank-00001/iter-000004/state.pt" in str(err.value)


def test_run_options_refuse_bad_values():
    for bad, match in [({"iterations": 0}, "--iterations"), ({"checkpoint_every": 0}, "--checkpoint-every"),
                       ({"resume": True}, "--resume needs"), ({"timeout_s": 0}, "--timeout")]:
        with pytest.raises(HetprofError, match=match) as err:  # bad options: exit 2, as the README's table says
            RunOptions(plan_path="p.json", **bad).validate()
        assert err.value.exit_code == 2


def test_failures_are_named_by_device_and_task_killed_one_first():
    plan = handwritten_plan(cluster({"h": 2}), workload(), {"actor_gen": ["h:0"], "ref_infer": ["h:1"],
                                                       "actor_train": ["h:1"]})
    fail = lambda rank, code, msg, ts: SimpleNamespace(  # noqa: E731
        exitcode=code, pid=100 + rank, message=msg, timestamp=ts,
        signal_name=lambda: "SIGKILL" if code == -9 else "")
    exc = SimpleNamespace(failures={1: fail(1, 1, "RuntimeError: Connection closed by peer", 5),
                                    0: fail(0, -9, "Signal 9 (SIGKILL) received by PID 100", 9)})
    text = describe_failures(exc, plan, "h")
    assert text.index("worker h:0 (tasks actor_gen; pid 100) killed by signal 9 (SIGKILL)") < text.index("h:1")
    assert "Connection closed by peer" in text


# ---- batches, records, checkpoints ----------------------------------------------------------
def test_pad_cat_right_pads_rows_of_different_widths():
    a = {"input_ids": torch.ones(2, 3, dtype=torch.long), "response_mask": torch.ones(2, 3, dtype=torch.long),
         "version": torch.tensor([1, 1])}
    b = {"input_ids": torch.full((1, 5), 7), "response_mask": torch.ones(1, 5, dtype=torch.long),
         "version": torch.tensor([2])}
    out = concat_padded([a, b], pad_id=9)
    assert out["input_ids"].shape == (3, 5) and out["input_ids"][0, 3:].tolist() == [9, 9]
    assert out["response_mask"][:2, 3:].sum() == 0 and out["version"].tolist() == [1, 1, 2]


def record(i: int, secs: float) -> dict:
    return {"type": "iteration", "run": "r1", "plan_hash": "h", "iteration": i, "version": i + 1, "mode": "sync",
            "iteration_s": secs, "stages": {"actor_gen": secs / 2, "actor_train": secs / 2},
            "replicas": {"actor_gen": [secs / 2]}, "predicted": {"actor_gen": 0.5, "actor_train": 0.5},
            "predicted_iteration_s": 1.0, "devices": {"actor_gen": ["h:0"], "actor_train": ["h:1"]},
            "layouts": {"actor_gen": "DP1×TP1×PP1"}, "reward_mean": 0.1, "kl": 0.0, "clip_frac": 0.0,
            "tokens_per_s": 10.0, "staleness_max": 0}


def test_log_and_db_round_trip_and_validation_summary(tmp_path):
    log = tmp_path / "run.jsonl"
    lines = [record(0, 3.0), record(1, 1.2), record(2, 0.8), record(1, 1.0)]  # iteration 1 re-run after a resume
    log.write_text("".join(json.dumps(r) + "\n" for r in lines))
    recs = read_log(log)
    assert [r["iteration_s"] for r in recs] == [3.0, 1.0, 0.8]
    assert len(db_rows(recs[0])) == 3
    write_db(tmp_path / "db.sqlite", recs)
    back = read_db(tmp_path / "db.sqlite", "r1")
    assert [r["iteration_s"] for r in back] == [3.0, 1.0, 0.8] and back[0]["predicted"]["actor_gen"] == 0.5
    s = summary(recs, skip=1)
    assert s["iteration"]["measured"] == pytest.approx(0.9) and s["iteration"]["ratio"] == pytest.approx(0.9)
    assert s["actor_gen"]["ratio"] == pytest.approx(0.9)
    log.write_text("not json\n")
    with pytest.raises(HetprofError, match="line 1") as err:  # `hetprof validate` of a bad log or run: exit 2
        read_log(log)
    assert err.value.exit_code == 2
    with pytest.raises(HetprofError, match="no records") as err:
        read_db(tmp_path / "db.sqlite", "nope")
    assert err.value.exit_code == 2


def test_checkpoints_are_atomic_tensor_only_and_committed_separately(tmp_path):
    state = {"model": {"w": torch.arange(4.0)}, "optimizer": {"state": {}, "param_groups": [{"lr": 0.1}]}}
    for it in (2, 4, 6):
        checkpoint.save(checkpoint.task_dir(tmp_path, "actor_train"), it, state, {"plan_hash": "h"})
    kept = sorted(p.name for p in (tmp_path / "actor_train").glob("iter-*"))
    assert kept == ["iter-000004", "iter-000006"]
    assert checkpoint.committed(tmp_path) is None  # saved is not committed
    checkpoint.commit(tmp_path, 6, {"plan_hash": "h", "run": "r"})
    assert checkpoint.committed(tmp_path)["iteration"] == 6
    loaded, meta = checkpoint.load(checkpoint.latest(tmp_path / "actor_train"))
    assert torch.equal(loaded["model"]["w"], torch.arange(4.0)) and meta["iteration"] == 6
    (tmp_path / "COMMITTED.json").write_text("{broken")
    with pytest.raises(HetprofError, match="COMMITTED.json: not valid JSON"):
        checkpoint.committed(tmp_path)


def test_plan_hash_changes_with_the_plan():
    a = handwritten_plan(cluster({"h": 2}), workload(), {"actor_gen": ["h:0"], "ref_infer": ["h:1"], "actor_train": ["h:1"]})
    b = handwritten_plan(cluster({"h": 2}), workload(), {"actor_gen": ["h:1"], "ref_infer": ["h:0"], "actor_train": ["h:0"]})
    assert plan_hash(a) != plan_hash(b) and plan_hash(a) == plan_hash(handwritten_plan(
        cluster({"h": 2}), workload(), {"actor_gen": ["h:0"], "ref_infer": ["h:1"], "actor_train": ["h:1"]}))
