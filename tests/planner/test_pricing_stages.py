"""The pricing stages by hand (planner/replicas.py, planner/taskcosts.py, planner/basis.py) and the
one memo they share (planner/memo.py): bounded, and the same answers after an eviction."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest

from hetprof.costmodels import get_cost_model
from hetprof.planner.candidate import Candidate, even_layout
from hetprof.planner.memo import memoised
from hetprof.planner.replicas import ReplicaPricer, pack_tokens
from hetprof.planner.score import Score, objective_value
from hetprof.planner.simulator import Simulator
from hetprof.specs import ClusterSpec, WorkloadSpec
from hetprof.specs.vocabulary import TaskKind

# ---- the memo -----------------------------------------------------------------------------------


class Squares:
    def __init__(self) -> None:
        self.calls = 0

    @memoised(2)
    def square(self, x: int) -> int:
        self.calls += 1
        return x * x


def test_the_memo_is_bounded_and_answers_the_same_after_an_eviction():
    s = Squares()
    assert (s.square(2), s.square(3), s.square(2)) == (4, 9, 4)
    assert s.calls == 2                               # the second 2 was a hit
    assert s.square(4) == 16 and s.calls == 3         # 3 (least recently used) goes
    assert s.square.cache_info().currsize == 2        # never more than its limit
    assert s.square(3) == 9 and s.calls == 4          # evicted: recomputed, the same answer
    assert s.square(4) == 16 and s.calls == 4         # still held


def test_each_instance_has_its_own_memo():
    a, b = Squares(), Squares()
    a.square(5)
    b.square(5)
    assert (a.calls, b.calls) == (1, 1)


def test_a_memo_holds_at_least_one_answer():
    with pytest.raises(ValueError, match="at least one"):
        memoised(0)


# ---- one replica, composed by hand --------------------------------------------------------------

SECONDS = {"X": 2.0, "Y": 3.0}      # the stub cost model's seconds for one stage on each GPU type
P2P_S = 0.01                        # ... and for one point-to-point message


def _pricer(kind: TaskKind) -> ReplicaPricer:
    model = SimpleNamespace(layers=4, hidden=8, vocab=0, matmul_flops_per_token_per_layer=lambda: 1.0)
    cm = SimpleNamespace(task_time=lambda work, place: SimpleNamespace(seconds=SECONDS[place.device_type]),
                         collective_time=lambda op, size, n, link: P2P_S)
    graph = SimpleNamespace(model_of=lambda task: model, kind_of=lambda task: kind)
    basis = SimpleNamespace(cm=cm, graph=graph, dtype="bf16", dtype_of=lambda task: "bf16", prompt=10.0,
                            response=20.0, backend="hf",
                            work=lambda task, batch, layers=None, response=None, prompt=None, cp=1: None)
    return ReplicaPricer(basis)


def test_one_stage_is_its_slowest_gpu_type():
    pricer = _pricer(TaskKind.INFERENCE)
    sig = ((("X", "Y"), None),), ()
    assert pricer.composed("t", sig, 2, 8, (4,), 20.0) == 3.0


def test_a_pipeline_overlaps_its_micro_batches_and_pays_each_boundary():
    # two stages of 2 layers, vocab 0 so each stage's share is all of its time: stage times 2 and 3;
    # batch 8 over pp 2 runs m = min(8, 2 * 2) = 4 micro-batches: (2 + 3) / 4 + 3 * 3 / 4 = 3.5;
    # inference sends each micro-batch across the one boundary: (1 + 3) p2p messages
    pricer = _pricer(TaskKind.INFERENCE)
    sig = ((("X",), None), (("Y",), None)), (None,)
    assert pricer.composed("t", sig, 1, 8, (2, 2), 20.0) == pytest.approx(3.5 + 4 * P2P_S)
    training = _pricer(TaskKind.TRAINING)  # forward and backward: the boundary twice
    assert training.composed("t", sig, 1, 8, (2, 2), 20.0) == pytest.approx(3.5 + 8 * P2P_S)
    # generation: every decode step (round(20) + 1) crosses every boundary once
    generation = _pricer(TaskKind.GENERATION)
    assert generation.composed("t", sig, 1, 8, (2, 2), 20.0) == pytest.approx(3.5 + 21 * P2P_S)


def test_a_pack_is_its_tokens_with_the_prompt_capped_at_its_length():
    assert pack_tokens(300.0, 100.0) == (200.0, 100.0)
    assert pack_tokens(60.0, 100.0) == (0.0, 60.0)


# ---- objectives ---------------------------------------------------------------------------------


def test_objectives_rank_time_cost_and_a_budget():
    score = Score(iteration_s=10.0, feasible=True, cost_per_iteration=0.5, price_per_hour=180.0)
    assert objective_value(score, "throughput") == 10.0
    assert objective_value(score, "cost") == 0.5
    assert objective_value(score, "throughput-under-budget", 200.0) == 10.0
    assert objective_value(score, "throughput-under-budget", 100.0) == math.inf
    assert objective_value(dataclasses.replace(score, feasible=False), "throughput") == math.inf
    with pytest.raises(ValueError, match="unknown objective"):
        objective_value(score, "fastest")


# ---- the real stages on a small problem ---------------------------------------------------------


def _sim(**kw) -> Simulator:
    cluster = ClusterSpec.from_dict({"name": "one", "hosts": [
        {"name": "a", "gpus": {"type": "A100-40GB", "count": 2}, "region": "east"}]})
    workload = WorkloadSpec.from_dict({
        "name": "grpo", "algorithm": "grpo", "mode": "sync", "models": {"actor": "qwen3-0.6b"},
        "prompts_per_step": 8, "responses_per_prompt": 4, "prompt_len": {"mean": 128, "max": 256},
        "response_len": {"mean": 256, "max": 1024, "dist": "lognormal", "std": 200}} | kw)
    return Simulator(cluster, workload, get_cost_model("analytical"))


def _candidate(sim: Simulator) -> Candidate:
    devices = ("a:0", "a:1")
    layers = sim.graph.model_of("actor_gen").layers
    return Candidate([tuple(sim.tasks)], [devices],
                     {t: even_layout(t, devices, 1, 1, layers) for t in sim.tasks})


def test_unpadded_widths_are_the_declared_means():
    basis = _sim(prompt_len={"mean": 128, "max": 256, "dist": "lognormal", "std": 64}).costs.basis
    assert (basis.sequence_prompt, basis.sequence_response) == (128.0, 256.0)
    assert basis.longest_prompt(8) == 128.0                       # unpadded: the mean
    assert basis.generation_prompt(4) == basis.generation_prompt(1)  # 4 sequences: one prompt's 4 responses
    assert basis.generation_prompt(32) == basis.workload.prompt_len.expected_longest(8)  # 8 distinct prompts
    assert basis.generation_prompt(32) > basis.generation_prompt(4)  # more prompts pad wider


def test_a_layout_is_its_slowest_replica_plus_what_the_layout_adds():
    sim = _sim()
    costs = sim.costs
    layout = _candidate(sim).layout_map()["actor_train"]
    judged = costs.evaluate(layout)
    assert judged.replica_seconds == tuple(costs.replica_seconds("actor_train", r, 1, 1, b, s)
                                           for r, b, s in zip(layout.replicas, costs.batches(layout),
                                                              layout.layer_splits, strict=True))
    assert judged.seconds > max(judged.replica_seconds)          # gradients, Adam steps, the controller
    assert judged.grad_sync_s > 0                                # two replicas: a gradient all-reduce
    assert set(judged.memory) == {"a:0", "a:1"} and judged.host_fraction == {"a": pytest.approx(1.0)}


def test_every_stage_answers_the_same_after_its_memo_is_emptied():
    sim = _sim()
    cand = _candidate(sim)
    first = sim.evaluate(cand)
    evals = {t: sim.costs.evaluate(lay) for t, lay in cand.layout_map().items()}
    for memo in (sim.evaluate, sim.costs.evaluate, sim.costs._memory, sim.costs.replicas._replica,
                 sim.costs.replicas.stage_time, sim.costs.replicas._signature, sim.group_memory.residency,
                 sim.transfers.weight_sync_seconds, sim.structure.layout_problems):
        memo.cache_clear()
    again = sim.evaluate(cand)
    assert again is not first and again == first and again.iteration_s == first.iteration_s
    assert again.breakdown == first.breakdown and again.transfer_s == first.transfer_s
    for t, lay in cand.layout_map().items():
        assert sim.costs.evaluate(lay) == evals[t] and sim.costs.evaluate(lay) is not evals[t]
    assert sim.evaluations == 2                                  # a hit is not an evaluation


def test_searches_read_the_planning_context_not_the_simulator():
    sim = _sim()
    planning = sim.planning
    assert planning is sim.planning and planning.tasks == tuple(sim.tasks)
    assert planning.evaluate(_candidate(sim)) is sim.evaluate(_candidate(sim))
    assert planning.model_of("actor_train") == sim.graph.model_of("actor_train")
    assert planning.replica_memory("actor_train", "A100-40GB", 1, 28, 4) == sim.costs.memory(
        "actor_train", "A100-40GB", 1, 28, 4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        planning.seed = 1  # type: ignore[misc]
