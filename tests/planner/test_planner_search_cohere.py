"""hetrl's group-coherent reshape: every task of a group moved to one TP×PP in one mutation."""

from __future__ import annotations

import numpy as np

from hetprof.costmodels import get_cost_model
from hetprof.planner.search.arms import Arm
from hetprof.planner.search.evolution import ArmEvolution, cohere, set_common_shape
from hetprof.planner.search.space import Assembler, devices_by_type, gpu_types
from hetprof.planner.simulator import Simulator
from hetprof.specs import ClusterSpec, WorkloadSpec


def test_common_shape_is_one_every_task_allows_and_not_the_one_they_share():
    allowed = {"a": [(1, 1), (2, 1), (4, 1)], "b": [(2, 1), (4, 1), (2, 2)], "c": [(1, 1), (2, 1), (4, 1)]}
    seen = set()
    for seed in range(20):
        shapes = {"a": (1, 1), "b": (2, 2), "c": (4, 1), "gen": (2, 2)}
        assert set_common_shape(["a", "b", "c"], shapes, allowed.__getitem__, np.random.default_rng(seed))
        pick = shapes["a"]
        assert shapes["b"] == shapes["c"] == pick and pick in {(2, 1), (4, 1)}
        assert shapes["gen"] == (2, 2)          # a task not named keeps its shape
        seen.add(pick)
    assert seen == {(2, 1), (4, 1)}
    # the only common shape, already shared: no move
    shapes = {"a": (2, 1), "b": (2, 1)}
    assert not set_common_shape(["a", "b"], shapes, {"a": [(2, 1)], "b": [(2, 1), (1, 1)]}.__getitem__,
                                np.random.default_rng(0))


def _sim() -> Simulator:
    cluster = ClusterSpec.from_dict({
        "name": "one-host", "hosts": [{"name": "h", "gpus": {"type": "A100-40GB", "count": 4}, "region": "east"}],
        "network": {"intra_region": {"latency": "0.1ms", "bandwidth": "100Gbps"}}})
    work = WorkloadSpec.from_dict({
        "name": "w", "algorithm": "grpo", "mode": "sync", "models": {"actor": "qwen3-0.6b"}, "prompts_per_step": 8,
        "responses_per_prompt": 4, "prompt_len": {"mean": 128}, "response_len": {"mean": 192}})
    return Simulator(cluster, work, get_cost_model("analytical"))


def test_cohere_gives_a_shared_group_one_shape_its_devices_allow():
    sim = _sim()
    types, by_type = gpu_types(sim.planning), devices_by_type(sim.planning)
    arm = Arm((tuple(sim.tasks),), ((4,),), tuple(types))
    assembler = Assembler(sim.planning, 8, 4)
    order = [list(by_type[types[0]]), []]
    coherent = 0
    for seed in range(8):
        shapes = {t: (1, 1) for t in sim.tasks}
        assert cohere(order, shapes, arm.grouping, assembler.shapes_for, np.random.default_rng([seed, 0]))
        rest = {s for t, s in shapes.items() if t != "actor_gen"}
        assert len(rest) == 1 and rest != {(1, 1)}
        assert all(shapes[t] in assembler.shapes_for(t, order[0]) for t in sim.tasks)
        coherent += shapes["actor_gen"] != (1, 1)   # generation joins the common shape half the time
        again = {t: (1, 1) for t in sim.tasks}
        cohere(order, again, arm.grouping, assembler.shapes_for, ArmEvolution(arm, 0, seed, assembler, by_type).rng)
        assert again == shapes                      # same seed, same move
    assert 0 < coherent < 8


def _one_group_evolution() -> tuple:
    """(simulator, assembler, evolution) of the arm with every task in one group on 4 GPUs a type."""
    sim = _sim()
    arm = Arm((tuple(sim.tasks),), ((4,),), tuple(gpu_types(sim.planning)))
    assembler = Assembler(sim.planning, 8, 4)
    return sim, assembler, ArmEvolution(arm, 0, 0, assembler, devices_by_type(sim.planning))


def test_a_new_best_queues_its_group_coherent_neighbours_and_they_are_tried_next():
    sim, assembler, evo = _one_group_evolution()
    genome = evo.seed_genome()
    near = evo.coherent_neighbours(genome)
    order = genome.orders[0]
    common = set.intersection(*(set(assembler.shapes_for(t, order)) for t in sim.tasks))
    assert near and len(set(near)) == len(near) and genome not in near
    for child in near:
        assert child.orders == genome.orders
        rest = {s for t, s in child.shapes if t != "actor_gen"}
        changed = [t for t, s in child.shapes if s != genome.shape_map()[t]]
        assert (len(rest) == 1 and rest <= common) or len(changed) == 1     # a group's shape, or one task's
    group, single = evo.group_reshapes(genome, set()), evo.task_reshapes(genome, set(evo.group_reshapes(genome, set())))
    assert near[0] == group[0] and near[1] == single[0] and set(near) == set(group) | set(single)
    assert evo.coherent_neighbours(genome) == near          # deterministic
    evo.advance(1, lambda cand: 1.0, lambda: False)         # the first genome is a new best
    assert evo.pending_from == evo.population[0][1]         # listed when the arm goes on
    tried = evo.coherent_neighbours(evo.pending_from)[0]
    evo.advance(1, lambda cand: 2.0, lambda: False)
    assert tried in evo.seen


def test_coherent_neighbours_are_tried_fastest_first_by_the_tasks_own_seconds():
    sim, assembler, evo = _one_group_evolution()
    genome = evo.seed_genome()
    listed = evo.group_reshapes(genome, set())
    # a made-up price per shape that inverts shape order: the rank must follow it, not the list
    assembler.own_seconds = lambda task, order, shape: 100.0 - 10 * shape[0] - shape[1]
    near = evo.group_reshapes(genome, set())
    assert set(near) == set(listed) and near != listed
    common = [s for t, s in near[0].shapes if s != genome.shape_map()[t]]
    best = max(s for c in near for t, s in c.shapes if s != genome.shape_map()[t])
    assert common and common[0] == best        # the cheapest reshape is tried first
    # deterministic: the same genome lists the same neighbours
    assert evo.group_reshapes(genome, set()) == near


def test_each_task_alone_is_tried_on_its_fastest_other_shape_best_ratio_first():
    sim, assembler, evo = _one_group_evolution()
    genome = evo.seed_genome()
    now = genome.shape_map()
    # made-up prices: actor_train gains most from TP4 (a tenth of its time), ref_infer a half
    price = {("actor_train", (4, 1)): 1.0, ("ref_infer", (2, 1)): 5.0}
    assembler.own_seconds = lambda task, order, shape: 10.0 if shape == now[task] else price.get((task, shape), 20.0)
    single = evo.task_reshapes(genome, set())
    changes = [[(t, s) for t, s in c.shapes if s != now[t]] for c in single]
    assert all(len(c) == 1 for c in changes) and len({c[0][0] for c in changes}) == len(changes)
    assert changes[0] == [("actor_train", (4, 1))] and changes[1] == [("ref_infer", (2, 1))]
    # every placed task is offered one (shared memory may favour a shape that is not fastest alone)
    assert {c[0][0] for c in changes} == set(sim.tasks) - {"actor_logprob"}
