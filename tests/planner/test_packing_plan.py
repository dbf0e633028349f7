"""The planner prices packed token-budget micro-batches as the executor runs them, memory by the
budget, and the profiler's workload grid measures the shapes it prices."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import numpy as np
import pytest

from hetprof.costmodels import get_cost_model
from hetprof.costmodels.analytical import AnalyticalCostModel
from hetprof.costmodels.memory import task_memory
from hetprof.planner.simulator import Simulator
from hetprof.profiler.workloadgrid import PACK_SHAPES_PER_BATCH, workload_points
from hetprof.runtime.tokenbudget import mean_pack, micro_batches_by_tokens, pack_groups, packed_shape, spread
from hetprof.specs import ClusterSpec, WorkloadSpec
from hetprof.specs.models import resolve_model

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


def test_pack_groups_are_the_executors_packs_of_a_length_sample():
    """Hand-packed, first fit decreasing into 1000 tokens: 1000 | 600 160 150 | 140 130 120 110."""
    responses = np.sort(np.array([10, 20, 30, 500, 40, 50, 60, 900]))
    assert pack_groups(100, responses, 8, 1000) == ((4, 125.0, 1), (3, 910 / 3, 1), (1, 1000.0, 1))
    # eight 300-token sequences in 1000 tokens: packs of 3, 3 and 2
    assert pack_groups(100, np.full(8, 200.0), 8, 1000) == ((3, 300.0, 2), (2, 300.0, 1))


def test_a_run_records_its_average_pack():
    """8 sequences of 300 tokens in 3 packs: one pack is 800 tokens, recorded as 3 sequences of 267."""
    assert mean_pack(8, 3, 300.0) == (3, 267)
    assert mean_pack(8, 2, 300.0) == (4, 300)  # even packs: the sequences' own length
    assert mean_pack(2, 3, 300.0) == (1, 200)  # a filler pass of no sequences shares the time


def fixed_lengths(budget: int = 1000) -> WorkloadSpec:
    """300-token sequences (100 prompt, 200 response): three fit a 1000-token pack."""
    return WorkloadSpec.from_dict({
        "name": "fixed", "algorithm": "grpo", "mode": "sync", "models": {"actor": "qwen3-0.6b"},
        "prompts_per_step": 4, "responses_per_prompt": 4, "mini_batches": 2,
        "prompt_len": {"mean": 100, "max": 100}, "response_len": {"mean": 200, "max": 200},
        "training": {"max_tokens_per_microbatch": budget}})


class PerCallAndToken(AnalyticalCostModel):
    """10 ms per call plus 10 µs per token; a training pass holds a 2 ms optimizer step."""

    def _task_time(self, work, placement):
        return SimpleNamespace(seconds=0.01 + 1e-5 * work.batch * (work.prompt_len + work.response_len))

    def optimizer_step_in_phase_time(self, work, placement) -> float:
        return 0.002


def test_a_packed_pass_is_priced_as_the_whole_packs_the_executor_runs():
    """8 sequences of 300 tokens run as packs of 3, 3 and 2: 3 calls of 10 ms and 2400 tokens of
    10 µs = 54 ms (8/3 packs of 3 sequences would be 50.7 ms). A training mini-batch of 8 is the same
    three packs with one optimizer step: 54 − 2 × 2 = 50 ms, twice per step (2 mini-batches)."""
    spec = fixed_lengths()
    sim = Simulator(cluster(), spec, PerCallAndToken(None), executable=True)
    assert sim.costs.basis.packs(8) == ((3, 300.0, 2), (2, 300.0, 1))
    assert sim.replica_seconds("ref_infer", A[:1], 1, 1, 8) == pytest.approx(0.054)
    assert sim.replica_seconds("actor_train", A[:1], 1, 1, 16) == pytest.approx(2 * 0.050 * spec.ppo_epochs)


def test_runnable_plan_prices_packed_passes_at_mean_lengths_in_the_budgets_micro_batches(cm):
    packed = Simulator(cluster(), workload(), cm, executable=True)
    padded = Simulator(cluster(), workload(None), cm, executable=True)
    costs = packed.costs.basis
    pricer = packed.costs.replicas
    groups = costs.packs(64)
    assert sum(count for _, _, count in groups) > 1  # 64 sequences of ~384 tokens need several 8192-token packs
    assert sum(n * count for n, _, count in groups) == 64
    sig = pricer.stage_signature(A[:1], 1, 1)
    split = (costs.graph.model_of("ref_infer").layers,)
    calls = sum(count * pricer.composed("ref_infer", sig, 1, n, split, length - costs.prompt, costs.prompt)
                for n, length, count in groups)
    assert packed.replica_seconds("ref_infer", A[:1], 1, 1, 64) == pytest.approx(calls)
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
    costs = Simulator(cluster(), w, cm, executable=True).costs.basis
    points = workload_points(w, 4)
    for per_replica in (64, 32, 16):  # dp 1, 2, 4
        for batch, kind in ((per_replica, "prefill"), (per_replica // w.mini_batches, "train")):
            groups = costs.packs(batch)
            common = sorted(groups, key=lambda g: -g[2])[:PACK_SHAPES_PER_BATCH]
            assert {(n, round(length)) for n, length, _ in common} <= set(points[kind])  # what the plan prices
            packs = sum(count for _, _, count in groups)
            assert mean_pack(batch, packs, w.prompt_len.mean + w.response_len.mean) in points[kind]  # a run's row
    unpacked = workload_points(dataclasses.replace(w, training=dataclasses.replace(w.training,
                                                                                  max_tokens_per_microbatch=None)), 4)
    assert set(unpacked["prefill"]) < set(points["prefill"]) and set(unpacked["train"]) <= set(points["train"])


def test_a_packed_mini_batch_is_priced_with_one_optimizer_step():
    """A fitted training pass holds one Adam step; the learner steps once per mini-batch of several
    packs. Hand-computed per step: packs × pass − (packs − 1) × step."""
    from hetprof.planner.passtime import packed_seconds

    assert packed_seconds([(0.1, 3)], 0.02) == pytest.approx(3 * 0.08 + 0.02)
    assert packed_seconds([(0.1, 1)], 0.02) == pytest.approx(0.1)  # one pack: its own step
    assert packed_seconds([(0.1, 2), (0.05, 1)], 0.02) == pytest.approx(0.25 - 2 * 0.02)
    step = 0.004

    class StepInPass(AnalyticalCostModel):  # a model whose training passes hold a step, as fitted ones do
        def optimizer_step_in_phase_time(self, work, placement) -> float:
            return step

    spec = workload()
    sim = Simulator(cluster(), spec, StepInPass(None), executable=True)
    plain = Simulator(cluster(), spec, AnalyticalCostModel(None), executable=True)
    mini = 64 // spec.mini_batches
    packs = sum(count for _, _, count in sim.costs.basis.packs(mini))
    assert packs > 1
    steps = spec.mini_batches * spec.ppo_epochs
    over = plain.replica_seconds("actor_train", A[:1], 1, 1, 64) - sim.replica_seconds("actor_train", A[:1], 1, 1, 64)
    assert over == pytest.approx(steps * (packs - 1) * step)
    assert sim.replica_seconds("ref_infer", A[:1], 1, 1, 64) == plain.replica_seconds("ref_infer", A[:1], 1, 1, 64)


def test_prompt_lengths_spread_into_the_packs_like_responses():
    """A step's prompts follow their distribution in the planner's length sample, paired with the
    responses by a fixed shuffle (a step draws them independently), not all at the mean."""
    from hetprof.runtime.tokenbudget import sample_lengths, step_prompts
    from hetprof.specs import LengthDist

    # the quantiles [10, 20, 30, 40] shuffled by permutation (2, 0, 1, 3), plus responses [1, 2, 3, 4]
    assert sample_lengths(np.array([10.0, 20, 30, 40]), np.array([1.0, 2, 3, 4]), 4) == [31, 12, 23, 44]
    assert sample_lengths(25.0, np.array([1.0, 2, 3, 4]), 4) == [26, 27, 28, 29]  # one prompt length
    # 21, 21, 81, 81 tokens in 170-token packs: 81 + 81 and 21 + 21; at the mean (51 each) 3 + 1
    responses = np.ones(4)
    assert pack_groups(np.array([20.0, 20, 80, 80]), responses, 4, 170) == ((2, 51.0, 2),)
    assert pack_groups(50.0, responses, 4, 170) == ((3, 51.0, 1), (1, 51.0, 1))
    prompts = step_prompts(LengthDist(mean=100, max=200, dist="normal", std=20), 64)
    assert len(prompts) == 64 and list(prompts) == sorted(prompts) and prompts.std() > 0


def test_a_pack_of_sequences_shorter_than_the_mean_prompt_is_priced_at_its_tokens():
    """Prompts spread: first-fit leaves a last pack of two short sequences (251 tokens each) under
    the mean prompt (256); it is priced as 251 prompt tokens and no response, at its own tokens."""
    from hetprof.planner.replicas import pack_tokens

    assert pack_tokens(251.0, 256.0) == (0.0, 251.0)
    assert pack_tokens(600.0, 256.0) == (344.0, 256.0)
    spec = WorkloadSpec.from_dict({
        "name": "spread", "algorithm": "grpo", "mode": "async", "models": {"actor": "qwen3-0.6b"},
        "prompts_per_step": 128, "responses_per_prompt": 8, "mini_batches": 4,
        "prompt_len": {"mean": 256, "max": 1024, "dist": "lognormal", "std": 128},
        "response_len": {"mean": 512, "max": 1024, "dist": "lognormal", "std": 256},
        "training": {"max_tokens_per_microbatch": 16384}})
    sim = Simulator(cluster(), spec, PerCallAndToken(None), executable=True)
    groups = sim.costs.basis.packs(415)
    assert any(length < sim.costs.basis.prompt for _, length, _ in groups)
    expected = sum(count * (0.01 + 1e-5 * n * length) for n, length, count in groups)
    assert sim.replica_seconds("ref_infer", A[:1], 1, 1, 415) == pytest.approx(expected)
