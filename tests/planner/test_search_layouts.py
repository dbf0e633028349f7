"""planner/search/layouts.py: device order, TP groups, feasible shapes, balanced layer splits and shares."""

from __future__ import annotations

import math

import pytest

from hetprof.costmodels import get_cost_model
from hetprof.planner.planning import PlanningContext
from hetprof.planner.search import layouts, replica_kinds
from hetprof.planner.search.layouts import DegreeOption
from hetprof.planner.simulator import Simulator
from hetprof.specs import ClusterSpec, WorkloadSpec

# two A100s on host a (us), two L4s on host b (eu), one A100 on host c (us)
HOSTS = [("a", "A100-40GB", 2, "us"), ("b", "L4", 2, "eu"), ("c", "A100-40GB", 1, "us")]
DEVICES = [f"{h}:{i}" for h, _, n, _ in HOSTS for i in range(n)]


def _sim(model: str = "qwen3-0.6b", executable: bool = False) -> PlanningContext:
    cluster = ClusterSpec.from_dict({
        "name": "mixed", "hosts": [{"name": h, "gpus": {"type": t, "count": n}, "region": r} for h, t, n, r in HOSTS],
        "network": {"intra_region": {"latency": "0.2ms", "bandwidth": "10Gbps"},
                    "inter_region": {"latency": "30ms", "bandwidth": "1Gbps"}}})
    workload = WorkloadSpec.from_dict({
        "name": "w", "algorithm": "grpo", "mode": "sync", "models": {"actor": model}, "prompts_per_step": 8,
        "responses_per_prompt": 4, "prompt_len": {"mean": 128}, "response_len": {"mean": 192}})
    return Simulator(cluster, workload, get_cost_model("analytical"), executable=executable).planning


@pytest.fixture(scope="module")
def sim() -> PlanningContext:
    return _sim()


def test_canonical_order_is_region_host_index_whatever_the_input_order(sim):
    want = ("b:0", "b:1", "a:0", "a:1", "c:0")  # region eu before us; within us, host a before c
    assert layouts.canonical_order(sim, ["c:0", "a:1", "b:1", "a:0", "b:0"]) == want
    assert layouts.canonical_order(sim, reversed(want)) == want


def test_tp_groups_stay_inside_a_host_and_leave_out_what_does_not_fill_one(sim):
    order = ["a:0", "b:0", "a:1", "b:1", "c:0"]
    assert layouts.tp_groups(sim, order, 1) == [(d,) for d in order]  # tp 1: the order itself
    assert layouts.tp_groups(sim, order, 2) == [("a:0", "a:1"), ("b:0", "b:1")]  # c:0 has no partner
    assert layouts.tp_groups(sim, order, 4) == []


def test_arrange_makes_stage_major_replicas_of_consecutive_groups(sim):
    order = ["a:0", "a:1", "b:0", "b:1", "c:0"]
    assert layouts.arrange(sim, order, 1, 2) == [("a:0", "a:1"), ("b:0", "b:1")]  # c:0 fills no replica
    assert layouts.arrange(sim, order, 2, 2) == [("a:0", "a:1", "b:0", "b:1")]
    assert layouts.arrange(sim, order, 2, 1) == [("a:0", "a:1"), ("b:0", "b:1")]


def test_shapes_for_hosts_by_hand():
    assert layouts.divisors(12) == [1, 2, 3, 4, 6, 12]
    # hosts of 2, 2 and 1 devices: 5 groups of TP1, 2 of TP2, none of TP4 (no host has 4)
    got = layouts.shapes_for_hosts((2, 2, 1), (1, 2, 4), 3)
    assert got == [DegreeOption(1, 1, 5), DegreeOption(1, 2, 2), DegreeOption(1, 3, 1), DegreeOption(2, 1, 2), DegreeOption(2, 2, 1)]
    assert layouts.shapes_for_hosts((), (1,), 2) == []
    assert str(DegreeOption(tp=2, pp=3, dp=4)) == "DP4×TP2×PP3"


def test_feasible_shapes_follow_the_devices_hosts_and_the_models_limits(sim):
    tps, stages = layouts.degree_limits(sim, "actor_train", max_tp=4, max_pp=2)
    model = layouts.task_model(sim, "actor_train")
    assert tps == tuple(t for t in (1, 2, 4) if model.heads % t == 0) and stages == 2
    shapes = layouts.feasible_shapes(sim, "actor_train", DEVICES, max_tp=4, max_pp=2)
    assert shapes == layouts.shapes_for_hosts((2, 2, 1), tps, stages)
    # one device per host: TP stops at 1 however many devices
    assert {s.tp for s in layouts.feasible_shapes(sim, "actor_train", ["a:0", "b:0", "c:0"])} == {1}


def test_an_executable_plan_never_pipelines_generation():
    sim = _sim(executable=True)
    assert layouts.degree_limits(sim, "actor_gen", max_pp=4)[1] == 1
    assert layouts.degree_limits(sim, "actor_train", max_pp=4)[1] == 4
    assert layouts.degree_limits(_sim(), "actor_gen", max_pp=4)[1] == 4  # any layout: generation may


def test_sharding_is_tried_only_for_training_with_several_replicas(sim):
    assert layouts.sharding_levels(sim, "actor_train", 2, 1, 1) == ("none", "zero2", "fsdp")
    assert layouts.sharding_levels(sim, "actor_train", 1, 1, 1) == ("none",)
    assert layouts.sharding_levels(sim, "actor_gen", 4, 1, 1) == ("none",)
    assert layouts.sharding_levels(_sim(executable=True), "actor_train", 2, 2, 1) == ("none",)


@pytest.mark.parametrize("task", ["actor_train", "actor_gen"])
def test_the_faster_stage_holds_more_layers(sim, task):
    layers = layouts.task_model(sim, task).layers
    split = replica_kinds.balance_layers(sim, task, ("a:0", "b:0"), 1, 2, 16)  # A100 stage, then L4 stage
    assert sum(split) == layers and min(split) >= 1 and split[0] > split[1]
    assert replica_kinds.balance_layers(sim, task, ("a:0",), 1, 1, 16) == (layers,)


def test_a_balanced_layout_gives_the_faster_replica_more_sequences_and_no_slower_time(sim):
    order = ["a:0", "b:0"]
    balanced = layouts.build_layout(sim, "actor_train", order, 1, 1)
    equal = layouts.build_layout(sim, "actor_train", order, 1, 1, balanced=False)
    assert balanced.replicas == equal.replicas == (("a:0",), ("b:0",))
    assert math.isclose(sum(balanced.shares), 1.0) and balanced.shares[0] > balanced.shares[1]
    assert equal.shares == (0.5, 0.5)
    assert layouts.layout_seconds(sim, balanced) < layouts.layout_seconds(sim, equal)
    # a pipeline of more stages than the model has layers is no layout
    assert layouts.build_layout(sim, "actor_train", order * 20, 1, 40) is None


def test_a_shared_memo_changes_no_layout(sim):
    memo: dict = {}
    order = layouts.canonical_order(sim, DEVICES)
    for tp, pp in [(1, 1), (1, 2), (2, 1), (1, 1)]:
        assert layouts.build_layout(sim, "actor_train", order, tp, pp, memo=memo) == \
            layouts.build_layout(sim, "actor_train", order, tp, pp)


def test_best_layout_is_no_slower_than_any_single_stage_layout_and_none_when_nothing_fits(sim):
    devices = DEVICES
    best = layouts.best_layout(sim, "actor_train", devices, max_pp=2)
    assert best is not None and set(best.devices()) <= set(devices)
    order = layouts.canonical_order(sim, devices)
    for shape in layouts.feasible_shapes(sim, "actor_train", devices, max_pp=1):
        other = layouts.build_layout(sim, "actor_train", order, shape.tp, shape.pp)
        assert layouts.layout_cost(sim, best) <= layouts.layout_cost(sim, other)
    # a 14B model's training state does not fit one 24 GB L4 at any shape
    assert layouts.best_layout(_sim("qwen3-14b"), "actor_train", ["b:0"]) is None
