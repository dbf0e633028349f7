"""The data-parallel training suite for real (two gloo processes), and what the cost models read from it."""

from __future__ import annotations

import statistics

import pytest
import torch

from hetprof.costmodels import get_cost_model
from hetprof.costmodels.comm import collective_time
from hetprof.costmodels.data import LinkSpec, Placement, Work
from hetprof.profiler.context import ProfileContext
from hetprof.profiler.suites.dptrain import (
    BENCHMARK,
    DataParallelTrainSuite,
    task_models,
    workload_points,
    worlds_for,
)
from hetprof.profiles import DeviceInfo, ProfileDB
from hetprof.runtime.dataparallel import needs_buffer_broadcast
from hetprof.specs.models import PRESETS


@pytest.mark.slow
def test_two_gloo_replicas_time_both_modes_per_model_size(tmp_path):
    with ProfileDB(tmp_path / "p.db") as db:
        dev = db.add_device(DeviceInfo(name="test cpu", kind="cpu", catalog_type="cpu", host="t"))
        ctx = ProfileContext(db=db, host="t", device="cpu", device_id=dev, quick=True, threads=1,
                             models=[PRESETS["tiny"]], devices=["cpu"], options={"worlds": [2]})
        DataParallelTrainSuite().run(ctx)
        df = db.samples(BENCHMARK)
        extra = get_cost_model("analytical", db=db).dp_step_extra("cpu")
    assert set(df["mode"]) == {"plain", "dp"} and set(df["world"]) == {2} and set(df["backend"]) == {"gloo"}
    sizes = sorted(df["grad_bytes"].unique())
    assert len(sizes) == 2 and sizes[1] > 1.8 * sizes[0]  # tiny at 1 and 2 layers: gradients ~2× apart
    assert (df["seconds"] > 0).all()
    assert (df.groupby(["grad_bytes", "mode"]).size() >= 3).all()
    assert "data parallelism adds" in ctx.summary[0].headline
    assert extra != 0.0  # measured, whatever its sign on a busy machine


def test_worlds_never_oversubscribe_cpu_cores(monkeypatch):
    ctx = ProfileContext(db=None, host="t", device="cpu", device_id=None, quick=True, threads=1, devices=["cpu"],
                         options={"worlds": [2, 4, 64]})
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert worlds_for(ctx) == [2, 4]
    gpus = ProfileContext(db=None, host="t", device="cuda:0", device_id=None, quick=True, threads=1,
                          devices=["cuda:0"])
    assert worlds_for(gpus) == []  # one GPU: no data parallelism to measure


def test_model_depths_give_distinct_gradient_sizes():
    ctx = ProfileContext(db=None, host="t", device="cpu", device_id=None, quick=True, threads=1,
                         models=[PRESETS["tiny"], PRESETS["qwen3-8b"]])
    depths = [(tm.shape.name, tm.layers_run) for tm in task_models(ctx, "fp32")]
    assert depths == [("tiny", 1), ("tiny", 2), ("qwen3-8b", 1), ("qwen3-8b", 2), ("qwen3-8b", 4)]


def test_the_workloads_own_steps_are_measured_on_each_models_deepest_build():
    ctx = ProfileContext(db=None, host="t", device="cpu", device_id=None, quick=True, threads=1,
                         models=[PRESETS["tiny"], PRESETS["qwen3-8b"]],
                         options={"workload_points": {"train": [(16, 71), (32, 75)], "prefill": [(64, 68)]}})
    points = workload_points(ctx, task_models(ctx, "fp32"))
    assert [(p["task_model"].shape.name, p["task_model"].layers_run, p["batch"], p["seq_len"]) for p in points] == [
        ("tiny", 2, 16, 71), ("tiny", 2, 32, 75), ("qwen3-8b", 4, 16, 71), ("qwen3-8b", 4, 32, 75)]
    assert workload_points(ProfileContext(db=None, host="t", device="cpu", device_id=None, quick=True,
                                          threads=1, models=[PRESETS["tiny"]]), []) == []


def _dp_rows(db, dev, plain: float, dp: float, grad_bytes: int, layers: int) -> None:
    params = {"backend": "gloo", "world": 2, "model": "tiny", "layers_run": layers, "batch": 8, "seq_len": 64,
              "grad_bytes": grad_bytes}
    db.add_benchmark(BENCHMARK, dev, "h", {"backend": "gloo", "world": 2}, [
        {"params": {**params, "mode": mode}, "metrics": {"seconds": t}}
        for mode, t in (("plain", plain), ("dp", dp)) for _ in range(3)])


def test_step_extra_is_what_data_parallelism_adds_beyond_its_all_reduce(db_path):
    """Two models: 6 ms and 9 ms added to the step; the all-reduce on the datasheet link is subtracted."""
    with ProfileDB(db_path) as db:
        dev = db.add_device(DeviceInfo(name="test cpu", kind="cpu", catalog_type="cpu", host="h"))
        _dp_rows(db, dev, 0.020, 0.026, 400_000, 2)
        _dp_rows(db, dev, 0.010, 0.019, 200_000, 1)
        cm = get_cost_model("fitted", db=db)
    link, source = cm.device_link("cpu")
    assert source == "datasheet"
    def all_reduce(size: int) -> float:
        return collective_time("all_reduce", size, 2, link.alpha_s, link.beta_Bps)

    extra = statistics.median([0.006 - all_reduce(400_000), 0.009 - all_reduce(200_000)])
    assert cm.dp_step_extra("cpu") == pytest.approx(extra)
    # the planner's data-parallel term: all-reduce of the replica's gradients + the measured extra
    work, place = Work("training", PRESETS["tiny"], 8, 32, 32, dtype="fp32"), Placement("cpu")
    link2 = LinkSpec(1e-4, 1e9)
    plain = get_cost_model("fitted").dp_grad_sync_time(work, place, 2, link2)
    assert cm.dp_grad_sync_time(work, place, 2, link2) == pytest.approx(plain + extra)
    assert get_cost_model("analytical").dp_step_extra("cpu") == 0.0  # no rows: the all-reduce alone


def test_dp_term_never_goes_below_zero(db_path):
    """A GPU overlapping its all-reduce with the backward can make the extra negative; the term stays ≥ 0."""
    with ProfileDB(db_path) as db:
        dev = db.add_device(DeviceInfo(name="test cpu", kind="cpu", catalog_type="cpu", host="h"))
        _dp_rows(db, dev, 0.020, 0.0195, 4_000_000_000, 2)
        cm = get_cost_model("analytical", db=db)
    assert cm.dp_step_extra("cpu") < 0
    work = Work("training", PRESETS["tiny"], 8, 32, 32, dtype="fp32")
    assert cm.dp_grad_sync_time(work, Placement("cpu"), 2, LinkSpec(1e-3, 1e12)) == 0.0


def test_only_trained_buffers_are_broadcast():
    lm = torch.nn.Sequential(torch.nn.Linear(4, 4))
    lm.register_buffer("inv_freq", torch.ones(2))  # constant, like rotary frequencies
    assert not needs_buffer_broadcast(lm)
    assert needs_buffer_broadcast(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)))
