"""planner/search/evolution.py: one arm's evolutionary search over placements, on a small cluster."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from hetprof.costmodels import get_cost_model
from hetprof.planner.search import SearchContext
from hetprof.planner.search.arms import Arm
from hetprof.planner.search.base import Ledger
from hetprof.planner.search.evolution import (
    POPULATION,
    ArmEvolution,
    Genome,
    genome_from_candidate,
    rank_arms,
)
from hetprof.planner.search.space import Assembler, devices_by_type, gpu_types
from hetprof.planner.simulator import Simulator
from hetprof.specs import ClusterSpec, WorkloadSpec

GROUPING = (("actor_gen",), ("ref_infer", "actor_train"))
HOSTS = [("a", "A100-40GB", 2, "us"), ("b", "L4", 2, "us"), ("c", "L4", 1, "eu")]
TYPE_OF = {f"{h}:{i}": t for h, t, n, _ in HOSTS for i in range(n)}  # device id -> GPU type


@pytest.fixture(scope="module")
def sim() -> Simulator:
    cluster = ClusterSpec.from_dict({
        "name": "two-types", "hosts": [{"name": h, "gpus": {"type": t, "count": n}, "region": r} for h, t, n, r in HOSTS],
        "network": {"intra_region": {"latency": "0.2ms", "bandwidth": "10Gbps"},
                    "inter_region": {"latency": "30ms", "bandwidth": "1Gbps"}}})
    work = WorkloadSpec.from_dict({
        "name": "w", "algorithm": "grpo", "mode": "sync", "models": {"actor": "qwen3-0.6b"}, "prompts_per_step": 8,
        "responses_per_prompt": 4, "prompt_len": {"mean": 128}, "response_len": {"mean": 192}})
    return Simulator(cluster, work, get_cost_model("analytical"))


def _arm(sim: Simulator, counts=((0, 2), (2, 1))) -> Arm:
    types = gpu_types(sim.planning)
    assert types == ("A100-40GB", "L4")
    return Arm(GROUPING, counts, types)


def _evolution(sim: Simulator, arm: Arm, seed: int = 0, index: int = 0) -> ArmEvolution:
    return ArmEvolution(arm, index, seed, Assembler(sim.planning, 8, 2), devices_by_type(sim.planning))


def _type_counts(order) -> Counter:
    return Counter(TYPE_OF[d] for d in order)


def _check_genome(sim: Simulator, evo: ArmEvolution, genome: Genome) -> None:
    """The arm's GPU counts per group, every device exactly once (idle ones last), allowed shapes."""
    types = evo.arm.types
    groups = genome.orders[:-1]  # the last entry holds the idle GPUs
    for order, counts in zip(groups, evo.arm.counts, strict=True):
        assert _type_counts(order) == Counter({t: n for t, n in zip(types, counts, strict=True) if n})
    assert sorted(d for o in genome.orders for d in o) == sorted(TYPE_OF)
    shapes = genome.shape_map()
    assert set(shapes) == {t for g in GROUPING for t in g}
    for order, tasks in zip(groups, GROUPING, strict=True):
        for task in tasks:
            assert shapes[task] in evo.assembler.shapes_for(task, order)


def test_a_seed_genome_fills_the_arms_counts_and_the_same_seed_gives_the_same_one(sim):
    arm = _arm(sim)
    first = _evolution(sim, arm, seed=4).seed_genome()
    _check_genome(sim, _evolution(sim, arm), first)
    assert _evolution(sim, arm, seed=4).seed_genome() == first


def test_mutations_keep_the_arms_counts_and_every_device_once(sim):
    evo = _evolution(sim, _arm(sim), seed=1)
    genome = evo.seed_genome()
    children = set()
    for _ in range(40):
        child = evo.mutate(genome)
        if child is None:
            continue
        _check_genome(sim, evo, child)
        children.add(child)
        genome = child
    assert len(children) > 5  # mutations move something


def test_advance_spends_its_evaluations_on_new_genomes_and_keeps_the_best(sim):
    ledger = Ledger(SearchContext(planning=sim.planning, seed=0, max_pp=2, max_evals=10_000))
    evo = _evolution(sim, _arm(sim), seed=2)
    values = []

    def evaluate(cand) -> float:
        values.append(ledger.evaluate(cand)[0])
        return values[-1]

    evo.advance(30, evaluate, lambda: False)
    assert evo.evaluations == len(values) == 30 and len(evo.seen) >= 30
    assert evo.value == min(values) and math.isfinite(evo.value)
    assert ledger.evaluate(evo.best_candidate)[0] == evo.value
    assert len(evo.population) <= POPULATION
    assert [v for v, _ in evo.population] == sorted(v for v, _ in evo.population)
    # more evaluations never lose the best found
    before = evo.value
    evo.advance(20, evaluate, lambda: False)
    assert evo.value <= before and evo.evaluations == 50


def test_advance_is_deterministic_per_seed_and_index_and_stops_when_told(sim):
    def run(seed: int, index: int) -> list[float]:
        ledger = Ledger(SearchContext(planning=sim.planning, seed=0, max_pp=2, max_evals=10_000))
        values: list[float] = []
        evo = _evolution(sim, _arm(sim), seed=seed, index=index)
        evo.advance(25, lambda c: values.append(ledger.evaluate(c)[0]) or values[-1], lambda: False)
        return values

    assert run(3, 0) == run(3, 0)
    assert run(3, 0) != run(3, 1)
    evo = _evolution(sim, _arm(sim))
    evo.advance(10, lambda c: 1.0, lambda: True)
    assert evo.evaluations == 0


def test_a_small_arm_runs_out_and_is_marked_exhausted(sim):
    evo = _evolution(sim, _arm(sim, counts=((1, 0), (1, 0))))  # one A100 per group: few placements
    evo.advance(500, lambda c: 1.0, lambda: False)
    assert evo.exhausted and 0 < evo.evaluations < 500


def test_a_candidate_becomes_a_genome_that_rebuilds_its_layouts(sim):
    evo = _evolution(sim, _arm(sim), seed=5)
    genome = evo.seed_genome()
    cand = evo.candidate(genome)
    back = genome_from_candidate(cand, sorted(TYPE_OF))
    assert back.shape_map() == genome.shape_map()
    assert sorted(d for o in back.orders for d in o) == sorted(TYPE_OF)
    assert evo.candidate(back).layout_map() == cand.layout_map()


def test_coherent_neighbours_change_only_shapes(sim):
    evo = _evolution(sim, _arm(sim, counts=((0, 2), (2, 0))), seed=0)
    genome = evo.seed_genome()
    neighbours = evo.coherent_neighbours(genome)
    assert neighbours and genome not in neighbours and len(set(neighbours)) == len(neighbours)
    for child in neighbours:
        assert child.orders == genome.orders and child.shapes != genome.shapes
        _check_genome(sim, evo, child)


def test_rank_arms_keeps_the_best_values_and_breaks_ties_by_index(sim):
    states = [_evolution(sim, _arm(sim), index=i) for i in range(4)]
    for state, value in zip(states, [3.0, 1.0, 1.0, math.inf], strict=True):
        state.best_value = value
    assert [s.index for s in rank_arms(states, 3)] == [1, 2, 0]
    assert rank_arms(states, 0) == []
