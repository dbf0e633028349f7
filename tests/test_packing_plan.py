"""The planner prices packed token-budget micro-batches as the executor runs them, memory by the
budget, and the profiler's workload grid measures the shapes it prices."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from hetprof.costmodels import get_cost_model
from hetprof.costmodels.memory import task_memory
from hetprof.models import resolve_model
from hetprof.planner.simulator import Simulator
from hetprof.profiler.workloadgrid import workload_points
from hetprof.specs import ClusterSpec, WorkloadSpec
from hetprof.tokenbudget import micro_batches_by_tokens, packed_shape, spread

A = tuple(f"a:{i}" for i in range(4))
BUDGET = 8192


def workload(budget: int | None = BUDGET) -> WorkloadSpec:
    training = {"recompute": True} | ({"max_tokens_per_microbatch": budget} if budget else {})
    return WorkloadSpec.from_dict({
        "name": "long-tail", "algorithm": "grpo", "mode": "async", "models": {"actor": "qwen3-0.6b"},
        "prompts_per_step": 16, "responses_per_prompt": 4, "mini_batches": 2,
        "prompt_len": {"mean": 128, "max": 256},
        "response_len": {"mean": 256, "max": 2048, "dist": "lognormal", "std": 400}, "training": training})


def cluster() -> ClusterSpec:
    return ClusterSpec.from_dict({"name": "one", "hosts": [{"name": "a", "gpus": {"type": "A100-40GB", "count": 4}}]})


@pytest.fixture(scope="module")
def cm():
    return get_cost_model("analytical")


def test_packed_shape_counts_the_executors_micro_batches():
    responses = np.sort(np.array([10, 20, 30, 500, 40, 50, 60, 900]))
    assert spread(responses, 8).tolist() == responses.tolist()
    m, per = packed_shape(100, responses, 8, 1000)
    lengths = (100 + responses).tolist()
    assert m == len(micro_batches_by_tokens(lengths, 1000)) and per == math.ceil(8 / m)
    assert packed_shape(100, responses, 8, 100_000) == (1, 8)  # one pack holds them all
    assert packed_shape(100, responses, 3, 100)[0] == 3  # never more packs than sequences


def test_runnable_plan_prices_packed_passes_at_mean_lengths_in_the_budgets_micro_batches(cm):
    packed = Simulator(cluster(), workload(), cm, executable=True)
    padded = Simulator(cluster(), workload(None), cm, executable=True)
    costs = packed.costs
    m, per = costs.packs(64)
    assert m > 1  # 64 sequences of ~384 tokens need several 8192-token packs
    sig = costs._stage_signature(A[:1], 1, 1)
    split = (costs.graph.model_of("ref_infer").layers,)
    call = costs._composed("ref_infer", sig, 1, per, split, costs.response, costs.prompt)
    assert packed.replica_seconds("ref_infer", A[:1], 1, 1, 64) == pytest.approx(call * 64 / per)
    assert m * per >= 64 > (m - 1) * per
    # the padded plan prices the step's longest response, several times the mean here
    for task in ("ref_infer", "actor_train"):
        assert packed.replica_seconds(task, A[:1], 1, 1, 64) < 0.6 * padded.replica_seconds(task, A[:1], 1, 1, 64)
    # generation keeps its engine's semantics: the same price either way
    assert packed.replica_seconds("actor_gen", A[:1], 1, 1, 64) == padded.replica_seconds("actor_gen", A[:1], 1, 1, 64)
    # pipelined replicas run padded micro-batches in `hetprof run`, and are priced so
    assert packed.replica_seconds("actor_train", A[:2], 1, 2, 64) == padded.replica_seconds("actor_train", A[:2], 1, 2, 64)


def test_memory_is_bounded_by_the_token_budget():
    model = resolve_model("qwen3-0.6b")
    padded = task_memory("training", model, model.layers, 1, 64, 4096, "bf16", False, 1)
    packed = task_memory("training", model, model.layers, 1, 64, 4096, "bf16", False, 1, token_budget=8192)
    small = task_memory("training", model, model.layers, 1, 1, 100, "bf16", False, 1, token_budget=8192)
    assert packed.activations < padded.activations and packed.weights == padded.weights
    assert small.activations < packed.activations  # fewer tokens than the budget: only what there is
    again = task_memory("training", model, model.layers, 1, 64, 4096, "bf16", False, 1, token_budget=2 * 8192)
    assert again.activations > packed.activations


def test_workload_grid_measures_the_packed_shapes_the_planner_prices(cm):
    w = workload(5000)
    costs = Simulator(cluster(), w, cm, executable=True).costs
    points = workload_points(w, 4)
    whole = round(w.prompt_len.mean + w.response_len.mean)
    for per_replica in (64, 32, 16):  # dp 1, 2, 4
        assert (costs.packs(per_replica)[1], whole) in points["prefill"]
        assert (costs.packs(per_replica // w.mini_batches)[1], whole) in points["train"]
    unpacked = workload_points(dataclasses.replace(w, training=dataclasses.replace(w.training,
                                                                                  max_tokens_per_microbatch=None)), 4)
    assert set(unpacked["prefill"]) < set(points["prefill"]) and set(unpacked["train"]) <= set(points["train"])


def test_a_packed_mini_batch_is_priced_with_one_optimizer_step():
    """A fitted training pass holds one Adam step; the learner steps once per mini-batch of several
    packs. Hand-computed per step: packs × pass − (packs − 1) × step."""
    from hetprof.costmodels.analytical import AnalyticalCostModel
    from hetprof.planner.passtime import packed_seconds

    assert packed_seconds(0.1, 3.0, 0.02) == pytest.approx(3 * 0.08 + 0.02)
    assert packed_seconds(0.1, 1.0, 0.02) == pytest.approx(0.1)  # one pack: its own step
    step = 0.004

    class StepInPass(AnalyticalCostModel):  # a model whose training passes hold a step, as fitted ones do
        def optimizer_step_in_phase_time(self, work, placement) -> float:
            return step

    spec = workload()
    sim = Simulator(cluster(), spec, StepInPass(None), executable=True)
    plain = Simulator(cluster(), spec, AnalyticalCostModel(None), executable=True)
    mini = 64 // spec.mini_batches
    _, per = sim.costs.packs(mini)
    assert mini / per > 1
    steps = spec.mini_batches * spec.ppo_epochs
    over = plain.replica_seconds("actor_train", A[:1], 1, 1, 64) - sim.replica_seconds("actor_train", A[:1], 1, 1, 64)
    assert over == pytest.approx(steps * (mini / per - 1) * step)
    assert sim.replica_seconds("ref_infer", A[:1], 1, 1, 64) == plain.replica_seconds("ref_infer", A[:1], 1, 1, 64)
