"""planner/search/hetrl.py through its entry point: budgets, arm spaces, sub-pool passes, edge clusters."""

from __future__ import annotations

import math

import pytest

from hetprof.costmodels import get_cost_model
from hetprof.errors import InfeasibleError
from hetprof.planner.search import SearchContext, get_search
from hetprof.planner.search.hetrl import HetRLConfig
from hetprof.planner.simulator import Simulator
from hetprof.specs import ClusterSpec, WorkloadSpec

TWO_REGIONS = [("a", "A100-40GB", 2, "us"), ("b", "L4", 2, "eu")]
TASKS = {"actor_gen", "ref_infer", "actor_train"}


def _sim(hosts, model: str = "qwen3-0.6b") -> Simulator:
    cluster = ClusterSpec.from_dict({
        "name": "c", "hosts": [{"name": h, "gpus": {"type": t, "count": n}, "region": r} for h, t, n, r in hosts],
        "network": {"intra_region": {"latency": "0.2ms", "bandwidth": "10Gbps"},
                    "inter_region": {"latency": "30ms", "bandwidth": "1Gbps"}}})
    work = WorkloadSpec.from_dict({
        "name": "w", "algorithm": "grpo", "mode": "sync", "models": {"actor": model}, "prompts_per_step": 8,
        "responses_per_prompt": 4, "prompt_len": {"mean": 128}, "response_len": {"mean": 192}})
    return Simulator(cluster, work, get_cost_model("analytical"))


def _hetrl(sim: Simulator, **ctx):
    return get_search("hetrl")(SearchContext(planning=sim.planning, seed=0, max_pp=2, **ctx)).run()


@pytest.fixture(scope="module")
def sim() -> Simulator:
    return _sim(TWO_REGIONS)


def test_the_evaluation_budget_is_spent_exactly_and_names_the_stop(sim):
    res = _hetrl(sim, max_evals=150)
    assert res.evaluations == 150 and res.extra["stopped_by"] == "evaluations"
    assert math.isfinite(res.objective_value) and res.extra["stages"] == 1
    more = _hetrl(sim, max_evals=400)
    assert more.evaluations == 400 and more.objective_value <= res.objective_value


def test_the_plan_places_every_task_on_the_clusters_devices_as_its_best_arm_says(sim):
    res = _hetrl(sim, max_evals=150)
    cand = res.candidate
    assert sorted(t for g in cand.groups for t in g) == sorted(TASKS)
    assert set(d for g in cand.group_devices for d in g) <= {f"{h}:{i}" for h, _, n, _ in TWO_REGIONS for i in range(n)}
    for tasks in cand.groups:
        assert "+".join(tasks) in res.extra["best_arm"]
    assert {t for t, _ in cand.layouts} == TASKS


def test_small_problems_enumerate_every_arm_larger_ones_start_from_structured_arms(sim):
    every = _hetrl(sim, max_evals=150)
    structured = _hetrl(sim, max_evals=150, config=HetRLConfig(enumerate_limit=0))
    assert every.extra["arms_enumerated"] and not structured.extra["arms_enumerated"]
    assert 0 < structured.extra["arms"] < every.extra["arms"]
    assert math.isfinite(structured.objective_value)


def test_the_cost_objective_also_searches_each_region_alone_and_keeps_the_cheaper(sim):
    res = _hetrl(sim, max_evals=150, objective="cost")
    pools = res.extra["sub_pools"]
    assert set(pools) == {"region us", "region eu"}
    # the passes' costs are reported rounded to 6 decimals
    assert res.score.cost_per_iteration <= min(v for v in pools.values() if v is not None) + 5e-7
    assert res.evaluations > 150  # the passes' evaluations are counted too
    alone = _hetrl(sim, max_evals=150, objective="cost", config=HetRLConfig(sub_pools=False))
    assert "sub_pools" not in alone.extra and alone.evaluations == 150


def test_a_one_gpu_cluster_colocates_everything_and_runs_out_of_placements():
    res = _hetrl(_sim([("a", "A100-40GB", 1, "us")]), max_evals=2000)
    assert res.candidate.groups == (("actor_gen", "ref_infer", "actor_train"),)
    assert res.candidate.group_devices == (("a:0",),)
    assert res.extra["stopped_by"] == "search space exhausted" and res.evaluations < 2000


def test_a_model_that_fits_nowhere_is_refused():
    with pytest.raises(InfeasibleError):
        _hetrl(_sim([("b", "L4", 1, "eu")], model="qwen3-14b"), max_evals=100)
