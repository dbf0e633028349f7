"""hetrl's one-region arms: generation and the rest on two regions' pools, or training on one and the rest everywhere else."""

from __future__ import annotations

import numpy as np

from hetprof.costmodels import get_cost_model
from hetprof.planner.search.arms import (
    host_splits,
    one_region_pools,
    pool_pairs,
    region_cuts,
    structured_arms,
)
from hetprof.planner.search.seeding import initial_orders
from hetprof.planner.search.space import all_groupings, devices_by_type, gpu_types
from hetprof.planner.simulator import Simulator
from hetprof.specs import ClusterSpec, WorkloadSpec


def _sim() -> Simulator:
    hosts = [("a100-e", "A100-40GB", "east"), ("l40s-w", "L40S", "west"), ("a100-w", "A100-40GB", "west"),
             ("l4-n", "L4", "north")]
    cluster = ClusterSpec.from_dict({
        "name": "three-regions", "hosts": [{"name": n, "gpus": {"type": t, "count": 2}, "region": r}
                                           for n, t, r in hosts],
        "network": {"intra_region": {"latency": "0.1ms", "bandwidth": "100Gbps"},
                    "links": [{"between": ["east", "west"], "latency": "30ms", "bandwidth": "5Gbps"},
                              {"between": ["east", "north"], "latency": "60ms", "bandwidth": "1Gbps"},
                              {"between": ["west", "north"], "latency": "50ms", "bandwidth": "2Gbps"}]}})
    work = WorkloadSpec.from_dict({
        "name": "w", "algorithm": "grpo", "mode": "async", "models": {"actor": "qwen3-0.6b"}, "prompts_per_step": 8,
        "responses_per_prompt": 4, "prompt_len": {"mean": 128}, "response_len": {"mean": 192}})
    return Simulator(cluster, work, get_cost_model("analytical"))


def test_pairs_are_disjoint_one_region_pools_largest_and_best_linked_first():
    sim = _sim()
    types = gpu_types(sim.planning)                      # A100-40GB, L4, L40S
    pairs = pool_pairs(sim.planning, types)
    for (ca, ra), (cb, rb) in pairs:
        assert ra != rb or not any(x and y for x, y in zip(ca, cb, strict=True))
    # the largest pairs hold the whole west region (4 GPUs) and another region (2): east first, over the faster link
    assert pairs[:2] == [(((2, 0, 0), "east"), ((2, 0, 2), "west")), (((2, 0, 2), "west"), ((2, 0, 0), "east"))]
    assert set(pairs[2:4]) == {(((2, 0, 2), "west"), ((0, 2, 0), "north")), (((0, 2, 0), "north"), ((2, 0, 2), "west"))}
    sizes = [sum(a[0]) + sum(b[0]) for a, b in pairs]
    assert sizes == sorted(sizes, reverse=True)
    # within one region, its two GPU types pair with each other
    assert (((2, 0, 0), "west"), ((0, 0, 2), "west")) in pairs


def test_a_pair_arm_seeds_each_group_in_its_own_region():
    sim = _sim()
    types, by_type = gpu_types(sim.planning), devices_by_type(sim.planning)
    arms = structured_arms(all_groupings(sim.planning), types, [len(by_type[t]) for t in types],
                           pairs=pool_pairs(sim.planning, types))
    paired = [a for a in arms if a.regions]
    assert paired and all(a.grouping[0] == ("actor_gen",) for a in paired)
    arm = next(a for a in paired if a.regions == ("west", "east") and a.counts == ((2, 0, 0), (2, 0, 0)))
    assert "@west" in arm.label and "@east" in arm.label
    for variant in range(4):
        orders = initial_orders(arm, by_type, variant, np.random.default_rng(0), lambda d: sim.devices[d].region)
        assert {sim.devices[d].region for d in orders[0]} == {"west"}
        assert {sim.devices[d].region for d in orders[1]} == {"east"}
        assert len(orders[2]) == 4              # the west L40S and the L4 stay idle


def test_a_trainer_arm_keeps_training_in_one_region_and_hands_the_rest_everything_else():
    sim = _sim()
    types, by_type = gpu_types(sim.planning), devices_by_type(sim.planning)
    arms = structured_arms(all_groupings(sim.planning), types, [len(by_type[t]) for t in types],
                           trainers=one_region_pools(sim.planning, types))
    trained = [a for a in arms if a.regions]
    assert trained and all("actor_train" in a.grouping[1] and a.regions[0] is None for a in trained)
    # training on the west A100s; generation on every other GPU, the east A100s included
    arm = next(a for a in trained if a.regions[1] == "west" and a.counts == ((2, 2, 2), (2, 0, 0)))
    for variant in range(4):
        orders = initial_orders(arm, by_type, variant, np.random.default_rng(0), lambda d: sim.devices[d].region)
        assert {sim.devices[d].host for d in orders[1]} == {"a100-w"}
        assert {sim.devices[d].host for d in orders[0]} == {"a100-e", "l40s-w", "l4-n"}
        assert orders[2] == ()


def test_training_pools_come_most_flops_first_so_a_small_budget_tries_the_fastest_trainer():
    sim = _sim()
    types, by_type = gpu_types(sim.planning), devices_by_type(sim.planning)
    pools = one_region_pools(sim.planning, types)
    # west (2 A100 + 2 L40S) holds the most bf16 FLOPs, then its two L40S, then two A100s, then the L4s
    assert pools[0] == ((2, 0, 2), "west") and pools[1] == ((0, 0, 2), "west")
    assert pools[-1] == ((0, 2, 0), "north")
    arms = structured_arms(all_groupings(sim.planning), types, [len(by_type[t]) for t in types], trainers=pools)
    first = next(a for a in arms if a.regions)
    assert first.regions == (None, "west") and first.counts[1] == (2, 0, 2)


def test_a_one_region_cluster_gets_generation_on_whole_hosts_of_one_type_most_bandwidth_first():
    cluster = ClusterSpec.from_dict({
        "name": "one-region", "hosts": [{"name": "a100", "gpus": {"type": "A100-40GB", "count": 2}, "region": "dc",
                                         "count": 3},
                                        {"name": "l4", "gpus": {"type": "L4", "count": 2}, "region": "dc"}],
        "network": {"intra_region": {"latency": "0.1ms", "bandwidth": "100Gbps"}}})
    sim = Simulator(cluster, _sim().workload, get_cost_model("analytical"))
    types = gpu_types(sim.planning)                      # A100-40GB, L4
    splits = host_splits(sim.planning, types)
    # two of three A100 hosts, then one (the L4 host is the whole type: no boundary inside it)
    assert splits == [(((4, 0), "dc"), ((2, 2), "dc")), (((2, 0), "dc"), ((4, 2), "dc"))]
    assert host_splits(_sim().planning, gpu_types(_sim().planning)) == []      # several regions: pool pairs name these


def _screened(**config) -> tuple[list, list, object, object]:
    """hetrl's screen alone on `_sim()`: (ranked arms, the structured list, the search, its ledger)."""
    from hetprof.planner.search import SearchContext
    from hetprof.planner.search.base import Ledger
    from hetprof.planner.search.hetrl import HetRLConfig, HetRLSearch, arm_space
    from hetprof.planner.search.parallel import EvaluationPool
    from hetprof.planner.search.space import Assembler

    ctx = SearchContext(planning=_sim().planning, max_evals=10_000, config=HetRLConfig(enumerate_limit=0, **config))
    search = HetRLSearch(ctx)
    problem, _, structured = arm_space(ctx.planning, search.config, ctx.objective)
    search._assembler, search._states, search._seeds, search._resumed = Assembler(ctx.planning), {}, {}, {}
    ledger = Ledger(ctx)
    return search._screen(structured, problem, ledger, EvaluationPool(ledger, 1, 8, 4)), structured, search, ledger


def test_screening_scores_each_head_arm_once_and_ranks_them_by_it():
    import math

    ranked, structured, search, ledger = _screened(screen_arms=12)
    head = structured[:12]
    assert sorted(ranked[:12], key=head.index) == head and ranked[12:] == structured[12:]
    values = [search._states[a].value for a in ranked[:12]]
    assert values == sorted(values) and math.isfinite(values[0])
    assert all(search._states[a].evaluations <= 1 for a in head)
    assert ledger.evaluations == sum(search._states[a].evaluations for a in head) >= 10


def test_region_pair_arms_put_each_group_of_a_colocated_grouping_on_its_own_region():
    from hetprof.planner.search.arms import region_pair_arms, region_pools

    sim = _sim()
    types, by_type = gpu_types(sim.planning), devices_by_type(sim.planning)     # A100-40GB, L4, L40S
    pools = region_pools(sim.planning, types)
    assert pools == [((2, 0, 0), "east"), ((0, 2, 0), "north"), ((2, 0, 2), "west")]
    grouping = (("actor_gen", "actor_train"), ("actor_logprob",))
    arms = region_pair_arms(grouping, pools, types)
    assert len(arms) == 6 and region_pair_arms((grouping[0],), pools, types) == []
    arm = next(a for a in arms if a.regions == ("west", "east"))
    assert arm.counts == ((2, 0, 2), (2, 0, 0))
    orders = initial_orders(arm, by_type, 0, np.random.default_rng(0), lambda d: sim.devices[d].region)
    assert {sim.devices[d].region for d in orders[0]} == {"west"} and len(orders[0]) == 4
    assert {sim.devices[d].region for d in orders[1]} == {"east"}
    # the structured list pairs regions for generation alone only: these arms are new
    structured = structured_arms(all_groupings(sim.planning), types, [len(by_type[t]) for t in types],
                                 pairs=pool_pairs(sim.planning, types), trainers=one_region_pools(sim.planning, types))
    assert not set(arms) & set(structured)


def test_screening_adds_region_pairs_of_the_best_screened_colocated_groupings():
    plain, structured, _, _ = _screened(screen_arms=40, pair_groupings=0)
    ranked, _, search, _ = _screened(screen_arms=40, pair_groupings=2)
    added = [a for a in ranked if a not in set(structured)]
    # two colocated groupings (generation alone is paired already), each on the 6 ordered pairs of
    # the 3 regions, scored once and ranked with the head
    assert len({a.grouping for a in added}) == 2 and len(added) == 12
    assert all(a.grouping[0] != ("actor_gen",) for a in added)
    assert all(len(set(a.regions)) == 2 and None not in a.regions for a in added)
    assert all(search._states[a].evaluations == 1 for a in added)
    head = ranked[:40 + len(added)]
    values = [search._states[a].value for a in head]
    assert values == sorted(values)
    assert ranked[len(head):] == plain[40:] and set(plain[:40]) <= set(head)
    # on this cluster a colocated grouping split across two regions screens among the best few
    assert any(a in added for a in ranked[:4])


def test_a_seed_placement_takes_each_later_kind_from_the_regions_its_group_already_holds():
    cluster = ClusterSpec.from_dict({
        "name": "two-regions", "hosts": [{"name": n, "gpus": {"type": t, "count": 2}, "region": r}
                                         for n, t, r in (("a100-w", "A100-40GB", "west"), ("l40s-e", "L40S", "east"),
                                                         ("l40s-w", "L40S", "west"))],
        "network": {"intra_region": {"latency": "0.1ms", "bandwidth": "100Gbps"},
                    "links": [{"between": ["east", "west"], "latency": "60ms", "bandwidth": "1Gbps"}]}})
    sim = Simulator(cluster, _sim().workload, get_cost_model("analytical"))
    types, by_type = gpu_types(sim.planning), devices_by_type(sim.planning)     # A100-40GB, L40S; east's L40S first in locality order
    assert sim.devices[by_type["L40S"][0]].region == "east"
    grouping = (("actor_gen", "actor_train"), ("ref_infer",))
    arm = structured_arms([grouping], types, [2, 4], region_cuts(sim.planning, by_type, types))
    arm = next(a for a in arm if a.counts == ((2, 2), (0, 2)) and not a.regions)
    for variant in range(4):
        orders = initial_orders(arm, by_type, variant, np.random.default_rng(0), lambda d: sim.devices[d].region)
        # the A100s put the first group in the west: its L40S come from there, not from the east
        assert {sim.devices[d].region for d in orders[0]} == {"west"}
        assert {sim.devices[d].region for d in orders[1]} == {"east"}
