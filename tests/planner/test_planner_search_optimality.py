"""The searches against ground truth: hetrl finds the exhaustive optimum, the ILP its restricted one."""

from __future__ import annotations

import pytest

from hetprof.costmodels import get_cost_model
from hetprof.planner.search import SearchContext, get_search
from hetprof.planner.search.exhaustive import ExhaustiveConfig
from hetprof.planner.search.ilp import ILPConfig
from hetprof.planner.simulator import Simulator
from hetprof.specs import ClusterSpec, WorkloadSpec

NET = {"intra_region": {"latency": "0.1ms", "bandwidth": "25Gbps"},
       "inter_region": {"latency": "20ms", "bandwidth": "5Gbps"}}

CLUSTERS = {
    "a100x2+l4+l40s/2-regions": [
        {"name": "a", "gpus": {"type": "A100-40GB", "count": 2}, "region": "us"},
        {"name": "b", "gpus": {"type": "L4", "count": 1}, "region": "us"},
        {"name": "c", "gpus": {"type": "L40S", "count": 1}, "region": "eu"}],
    "a100x2+l4x2/1-region": [
        {"name": "a", "gpus": {"type": "A100-40GB", "count": 2}, "region": "us"},
        {"name": "b", "gpus": {"type": "L4", "count": 2}, "region": "us"}],
    "a100x2+l40s/2-regions": [
        {"name": "a", "gpus": {"type": "A100-40GB", "count": 2}, "region": "us"},
        {"name": "c", "gpus": {"type": "L40S", "count": 1}, "region": "eu"}],
    "h100+a100+l4/3-regions": [
        {"name": "h", "gpus": {"type": "H100", "count": 1}, "region": "us"},
        {"name": "a", "gpus": {"type": "A100-40GB", "count": 1}, "region": "eu"},
        {"name": "l", "gpus": {"type": "L4", "count": 2}, "region": "asia"}],
}


def make_sim(cluster: str, mode: str = "sync", model: str = "qwen3-0.6b", prompts: int = 16,
             algorithm: str = "grpo") -> Simulator:
    spec = ClusterSpec.from_dict({"name": cluster, "hosts": CLUSTERS[cluster], "network": NET})
    roles = {"actor": model, **({"critic": model} if algorithm == "ppo" else {})}
    work = WorkloadSpec.from_dict({
        "name": "w", "algorithm": algorithm, "mode": mode, "models": roles,
        "prompts_per_step": prompts, "responses_per_prompt": 4, "prompt_len": {"mean": 256},
        "response_len": {"mean": 256, "dist": "lognormal", "std": 128}})
    return Simulator(spec, work, get_cost_model("analytical"))


def run(sim: Simulator, name: str, **kw):
    ctx = SearchContext(planning=sim.planning, seed=kw.pop("seed", 0), max_pp=2, time_budget_s=120, **kw)
    return get_search(name)(ctx).run()


INSTANCES = [("a100x2+l4+l40s/2-regions", "sync"), ("a100x2+l4+l40s/2-regions", "async"),
             ("a100x2+l4x2/1-region", "sync"), ("h100+a100+l4/3-regions", "async")]


@pytest.mark.parametrize(("cluster", "mode"), INSTANCES)
def test_hetrl_finds_the_exhaustive_optimum(cluster, mode):
    sim = make_sim(cluster, mode)
    truth = run(sim, "exhaustive")
    found = run(sim, "hetrl", max_evals=4000)
    assert truth.extra["candidates"] > 50          # the instance is not trivial
    assert found.objective_value <= truth.objective_value * 1.005, (found.candidate, truth.candidate)
    # the heuristic's space is the exhaustive one: it can never beat the optimum
    assert found.objective_value >= truth.objective_value * (1 - 1e-9)


def test_hetrl_finds_the_exhaustive_optimum_for_ppo():
    """PPO has five tasks (52 groupings): the arm level is much wider than GRPO's."""
    sim = make_sim("a100x2+l40s/2-regions", "sync", prompts=8, algorithm="ppo")
    truth = run(sim, "exhaustive")
    found = run(sim, "hetrl", max_evals=1500)
    assert truth.extra["candidates"] > 500
    assert found.objective_value <= truth.objective_value * 1.005


@pytest.mark.parametrize(("cluster", "mode"), INSTANCES[:3])
def test_ilp_matches_exhaustive_on_its_restricted_space(cluster, mode):
    sim = make_sim(cluster, mode)
    ilp = run(sim, "ilp", config=ILPConfig(time_limit_s=20))
    grouping = tuple(tuple(g) for g in ilp.extra["grouping"])
    truth = run(sim, "exhaustive", config=ExhaustiveConfig(restricted=True, grouping=grouping))
    assert ilp.extra["status"] == "Optimal" and ilp.extra["gap"] is not None and ilp.extra["gap"] <= 1e-6
    assert ilp.objective_value <= truth.objective_value * 1.005
    assert ilp.objective_value >= truth.objective_value * (1 - 1e-9)


def test_hetrl_beats_or_ties_every_baseline():
    sim = make_sim("a100x2+l4+l40s/2-regions", "async")
    best = run(sim, "hetrl", max_evals=3000).objective_value
    for name in ("verl", "streamrl", "arealhex"):
        assert best <= run(sim, name).objective_value * (1 + 1e-9), name
