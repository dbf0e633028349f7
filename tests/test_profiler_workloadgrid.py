"""The shapes a workload runs: what `hetprof profile --workload` adds to the tasks grid."""

from __future__ import annotations

from pathlib import Path

from hetprof.profiler.workloadgrid import dp_degrees, merge_points, workload_models, workload_points
from hetprof.specs import WorkloadSpec

ROOT = Path(__file__).resolve().parents[1]


def test_dp_degrees_dense_on_small_clusters_sampled_on_large():
    assert dp_degrees(3) == [1, 2, 3]
    assert dp_degrees(64) == [1, 2, 4, 8, 16, 32, 64]
    assert dp_degrees(24) == [1, 2, 4, 8, 16, 24]


def test_points_of_the_demo_workload_cover_what_the_simulator_asks():
    w = WorkloadSpec.load(ROOT / "examples" / "workloads" / "grpo-tiny.yaml")  # 64 sequences, prompts 68/72
    pts = workload_points(w, 2)
    assert {(64, 68), (32, 68), (32, 72), (32, 71), (32, 75)} <= set(pts["prefill"])
    assert {(32, 69), (32, 75)} <= set(pts["decode"])
    assert set(pts["train"]) == {(32, 71), (32, 75), (16, 71), (16, 75)}  # mini_batches: 2


def test_every_role_model_once():
    w = WorkloadSpec.load(ROOT / "examples" / "workloads" / "qwen3-8b-ppo-sync.yaml")
    assert [m.name for m in workload_models(w)] == ["qwen3-8b"]


def test_merge_keeps_the_grid_and_drops_duplicates_and_shapes_past_the_positions():
    assert merge_points([(1, 8), (2, 8)], [(2, 8), (4, 100), (4, 600)], 512) == [(1, 8), (2, 8), (4, 100)]
