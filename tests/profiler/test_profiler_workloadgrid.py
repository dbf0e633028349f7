"""The shapes a workload runs: what `hetprof profile --workload` adds to the tasks grid."""

from __future__ import annotations

from pathlib import Path

from hetprof.profiler.workloadgrid import dp_degrees, merge_points, workload_models, workload_points
from hetprof.specs import WorkloadSpec

ROOT = Path(__file__).resolve().parents[2]


def test_dp_degrees_dense_on_small_clusters_sampled_on_large():
    assert dp_degrees(3) == [1, 2, 3]
    assert dp_degrees(64) == [1, 2, 4, 8, 16, 32, 64]
    assert dp_degrees(24) == [1, 2, 4, 8, 16, 24]


def test_points_of_the_demo_workload_cover_what_the_simulator_asks():
    from hetprof.costmodels import get_cost_model
    from hetprof.planner.simulator import Simulator
    from hetprof.specs import ClusterSpec

    w = WorkloadSpec.load(ROOT / "examples" / "workloads" / "grpo-tiny.yaml")  # 64 sequences, prompts ~67, cap 71
    pts = workload_points(w, 2)
    assert {(64, 67), (32, 67), (32, 71), (32, 70), (32, 74)} <= set(pts["prefill"])  # means and caps
    # the padded widths a runnable plan is priced at (and `hetprof run` computes) on two slots
    cluster = ClusterSpec.from_dict({"name": "two", "hosts": [{"name": "h", "gpus": {"type": "cpu", "count": 2}}]})
    costs = Simulator(cluster, w, get_cost_model("analytical"), executable=True).costs.basis
    gen, whole = round(costs.generation_prompt(32)), round(costs.sequence_prompt + costs.sequence_response)
    assert gen > 67 and whole > 70
    assert {(32, gen), (32, whole)} <= set(pts["prefill"]) and (32, gen) in pts["generate"]
    assert (32, gen + 1) in pts["decode"] and {(16, whole), (32, whole)} <= set(pts["train"])  # mini_batches: 2


def test_every_role_model_once():
    w = WorkloadSpec.load(ROOT / "examples" / "workloads" / "qwen3-8b-ppo-sync.yaml")
    assert [m.name for m in workload_models(w)] == ["qwen3-8b"]


def test_merge_keeps_the_grid_and_drops_duplicates_and_shapes_past_the_positions():
    assert merge_points([(1, 8), (2, 8)], [(2, 8), (4, 100), (4, 600)], 512) == [(1, 8), (2, 8), (4, 100)]


def test_packed_inference_points_are_named_with_their_response_tokens():
    w = WorkloadSpec.load(ROOT / "examples" / "workloads" / "grpo-tiny.yaml")
    assert workload_points(w, 2)["packed_prefill"] == []  # a padded workload runs no packed pass
    data = w.to_dict()
    data["training"]["max_tokens_per_microbatch"] = 512
    pts = workload_points(WorkloadSpec.from_dict(data), 2)
    packed = pts["packed_prefill"]
    assert packed and all((b, n) in pts["prefill"] and r == 3 for b, n, r in packed)  # response mean 3
    trained = pts["packed_train"]
    assert trained and all((b, n) in pts["train"] and r == 3 for b, n, r in trained)
    assert workload_points(w, 2)["packed_train"] == []


def test_padded_inference_points_are_each_replicas_rows_at_the_priced_width():
    """A padded workload's reference and log-prob passes run each replica's rows as wide as the step's
    longest prompt plus its longest response: those prefill points are named, so the profiler times
    the pass there (with its log-probs), not generation's prefill; a packed workload names none."""
    from hetprof.costmodels import get_cost_model
    from hetprof.planner.simulator import Simulator
    from hetprof.specs import ClusterSpec

    w = WorkloadSpec.load(ROOT / "examples" / "workloads" / "grpo-tiny.yaml")  # 64 sequences
    cluster = ClusterSpec.from_dict({"name": "two", "hosts": [{"name": "h", "gpus": {"type": "cpu", "count": 2}}]})
    costs = Simulator(cluster, w, get_cost_model("analytical"), executable=True).costs.basis
    whole = round(costs.sequence_prompt + costs.sequence_response)
    pts = workload_points(w, 2)
    assert pts["padded_prefill"] == [(32, whole), (64, whole)]  # dp 2 and dp 1
    assert set(pts["padded_prefill"]) <= set(pts["prefill"])
    data = w.to_dict()
    data["training"]["max_tokens_per_microbatch"] = 512
    assert workload_points(WorkloadSpec.from_dict(data), 2)["padded_prefill"] == []
