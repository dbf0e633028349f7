"""The run record as a pure function of the ranks' reports, and the contract it keeps with `hetprof fit`."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetprof.costmodels.runrows import run_task_rows
from hetprof.errors import ExecutionError
from hetprof.executor.launch.handwritten_plan import handwritten_plan
from hetprof.executor.loop.recorder import record_context
from hetprof.executor.parallel.topology import Topology
from hetprof.executor.records.iteration_report import (
    BatchStats,
    IterationReport,
    RankInfo,
    SyncStats,
    prefill_timing,
    train_timing,
)
from hetprof.executor.records.mfu import training_peaks, update_flops
from hetprof.executor.records.run_log import db_rows, read_db, work_description, write_db
from hetprof.executor.records.run_record import RecordContext, build_record
from hetprof.profiles import ProfileDB
from hetprof.specs import Prediction, WorkloadSpec
from hetprof.specs.catalog import lookup

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = ROOT / "examples" / "workloads" / "grpo-tiny.yaml"
DEVICES = {"h:0": 0, "h:1": 1, "h:2": 2}


def plan(gpu: str = "cpu"):
    cluster = {"name": "c", "hosts": [{"name": "h", "gpus": {"type": gpu, "count": 3}}]}
    return handwritten_plan(cluster, WorkloadSpec.load(WORKLOAD).to_dict(),
                            {"actor_gen": ["h:0"], "ref_infer": ["h:1"], "actor_train": ["h:1", "h:2"]},
                            shares={"actor_train": [0.75, 0.25]},
                            predicted=Prediction(iteration_s=2.0, breakdown={"weights:actor_train->actor_gen": 0.1}),
                            task_seconds={"actor_gen": 1.0, "actor_train": 0.5})


def context(verify: bool = False) -> RecordContext:
    p = plan()
    return record_context(p, Topology(p, DEVICES), "run-x", "abc123", work_description(p), verify)


def reports(digests: tuple[str, str] = ("d", "d")) -> list[IterationReport]:
    info = RankInfo(device_type="cpu", threads=1, dtypes={"actor_gen": "fp32", "ref_infer": "fp32",
                                                          "actor_train": "fp32"})
    gen = IterationReport(rank=0, device="h:0", pid=10, rank_info=info, gen_version=3,
                          task_seconds={"actor_gen": 1.2, "weight_sync": 0.4},
                          work_timings={"actor_gen": [{"kind": "prefill", "batch": 8, "tokens": 70, "seconds": 0.02,
                                                       "with_head": True},
                                                      {"kind": "decode", "batch": 8, "tokens": 71, "seconds": 0.004,
                                                       "with_head": True}]},
                          digests={"weight_sync": [digests[1]]})
    leader = IterationReport(rank=1, device="h:1", pid=11, rank_info=info,
                             task_seconds={"ref_infer": 0.2, "actor_train": 0.6, "reward": 0.01, "advantage": 0.002,
                                           "weight_sync": 0.05},
                             laps={"generate": 0.0, "train": 0.7},
                             work_timings={"ref_infer": [prefill_timing(16, 141, 0.2)],
                                           "actor_train": [train_timing(12, 141, 0.6, ppo_epochs=1, mini_batches=2)]},
                             train_stats={"actor_train": {"n": 12, "kl": 0.1, "clip_frac": 0.2, "entropy": 1.0,
                                                          "policy_loss": -0.5, "model_flops": 3e9}},
                             sync={"weight_sync": SyncStats(bytes=1000, seconds=0.05)},
                             digests={"weight_sync": [digests[0]]}, checkpoint_saved=True,
                             batch=BatchStats(tokens=96, prompt_tokens_mean=67.0, response_tokens_mean=6.0,
                                              staleness_max=0, staleness_mean=0.0, reward_mean=0.25, sequences=16))
    other = IterationReport(rank=2, device="h:2", pid=12, rank_info=info, task_seconds={"actor_train": 0.9},
                            train_stats={"actor_train": {"n": 4, "kl": 0.5, "clip_frac": 0.0, "entropy": 2.0,
                                                         "policy_loss": 0.5, "model_flops": 1e9}})
    return [gen, leader, other]


def test_record_takes_the_slowest_replica_the_senders_sync_time_and_row_weighted_statistics():
    rec = build_record(context(), 4, 2.5, reports(), leader_rank=1, now=123.0)
    assert rec["stages"] == {"actor_gen": 1.2, "ref_infer": 0.2, "actor_train": 0.9, "reward": 0.01,
                             "advantage": 0.002, "weight_sync": 0.05}
    assert rec["replicas"]["actor_train"] == [0.6, 0.9]
    assert rec["kl"] == pytest.approx((0.1 * 12 + 0.5 * 4) / 16)
    assert (rec["iteration"], rec["version"], rec["time"], rec["tokens"]) == (4, 5, 123.0, 96)
    assert rec["tokens_per_s"] == pytest.approx(96 / 2.5) and rec["sync_Bps"] == pytest.approx(1000 / 0.05)
    assert rec["predicted"] == {"actor_gen": 1.0, "actor_train": 0.5, "weights:actor_train->actor_gen": 0.1,
                                "weight_sync": 0.1}
    assert rec["gen_versions"] == [3] and rec["pids"] == {"h:0": 10, "h:1": 11, "h:2": 12}
    assert rec["devices"]["actor_train"] == ["h:1", "h:2"] and rec["sync_verified"] is None
    timed = rec["phase_times"]["actor_train"][0]
    assert (timed["batch"], timed["seconds"], timed["device"], timed["dtype"]) == (6, 0.3, "h:1", "fp32")


def test_tokens_are_the_trained_batchs_even_when_the_loop_step_generates_nothing():
    """An async run's last iterations generate nothing (the generators are done): the record counts the
    tokens of the batch the iteration trained on, so its throughput does not fall to zero at the end."""
    sent = reports()
    sent[0].task_seconds.pop("actor_gen")  # a loop step that only trains
    rec = build_record(context(), 9, 2.0, sent, leader_rank=1, now=0.0)
    assert rec["tokens"] == 96 and rec["tokens_per_s"] == pytest.approx(48.0)
    assert (rec["sequences"], rec["device_count"]) == (16, 3)


def test_mfu_only_where_the_catalog_has_a_peak():
    """cpu slots carry the catalog's placeholder figures, not a peak: no MFU. On GPUs it is the replicas'
    model FLOPs over the slowest replica's seconds and every device's peak in the dtype trained in."""
    cpu = build_record(context(), 0, 2.5, reports(), leader_rank=1, now=0.0)
    assert cpu["mfu"] == {} and training_peaks(plan()) == {"actor_train": {}}
    gpu = plan(gpu="H100-SXM")
    ctx = record_context(gpu, Topology(gpu, DEVICES), "run-x", "abc123", work_description(gpu), False)
    peak = lookup("H100-SXM").peak_flops("fp32")
    assert ctx.train_peaks["actor_train"]["fp32"] == pytest.approx(2 * peak)
    rec = build_record(ctx, 0, 2.5, reports(), leader_rank=1, now=0.0)
    assert rec["mfu"] == {"actor_train": pytest.approx((3e9 + 1e9) / (0.9 * 2 * peak))}


def test_update_flops_count_forward_and_backward_of_every_real_token():
    shape = WorkloadSpec.load(WORKLOAD).roles()["actor"]
    one = update_flops(shape, [10], epochs=1)
    assert one == pytest.approx(3 * 10 * shape.forward_flops_per_token(context=5))
    assert update_flops(shape, [10, 20], epochs=2) == pytest.approx(
        2 * (one + 3 * 20 * shape.forward_flops_per_token(context=10)))
    assert update_flops(shape, [10], 1, lm_head=False) < one


def test_report_survives_the_wire_and_a_bad_digest_fails_the_iteration():
    sent = reports()
    assert [IterationReport.from_json(r.to_json()) for r in sent] == sent
    assert build_record(context(verify=True), 0, 1.0, sent, 1, 0.0)["sync_verified"] is True
    with pytest.raises(ExecutionError, match="iteration 0: after the weight_sync a receiver's weights differ"):
        build_record(context(verify=True), 0, 1.0, reports(digests=("a", "b")), 1, 0.0)


def test_what_the_builder_writes_the_profile_database_and_runrows_read_back(tmp_path):
    records = [build_record(context(), i, 2.0, reports(), 1, float(i)) for i in range(2)]
    db_file = tmp_path / "p.db"
    write_db(db_file, records)
    back = read_db(db_file, "run-x")
    assert [r["stages"] for r in back] == [r["stages"] for r in records]
    skipped: list[str] = []
    with ProfileDB(db_file) as db:
        rows = run_task_rows(db, skipped)
    # per iteration: generation's prefill and decode, the reference forward, one training step
    assert sorted(rows["benchmark"].value_counts().items()) == [("task.decode", 2), ("task.prefill", 4),
                                                                ("task.train", 2)]
    train = rows[rows["benchmark"] == "task.train"].iloc[0]
    assert (train["batch"], train["dp"], train["source"], train["run_key"]) == (6, 2, "run", "run-x")
    assert not skipped
    assert {r["task"] for r in db_rows(records[0])} == {*records[0]["stages"], "iteration"}
