"""Generation engines: vllm's continuous batching and the hf padded loop, on hand-computable costs."""

from __future__ import annotations

import dataclasses
import math

import pytest

from hetprof.costmodels import get_cost_model
from hetprof.planner.engines import (
    ENGINES,
    EngineLimits,
    GenerationRequest,
    StepTable,
    default_backend,
    paged_schedule,
)
from hetprof.planner.simulator import Simulator
from hetprof.specs import ClusterSpec, WorkloadSpec

ALPHA, BETA, GAMMA = 1e-3, 2e-2, 5e-3  # prefill s/token, decode s/step, decode s/(step·sequence)


def linear(b: int, prompt: float, steps: float) -> float:
    """A call that prefills at ALPHA per token and decodes at BETA + GAMMA·batch per step."""
    return ALPHA * b * prompt + steps * (BETA + GAMMA * b)


def request(lengths, prompt=16.0, kv_tokens=1 << 20, seats=256, block=16, wide=None):
    wide = wide if wide is not None else max(lengths)
    return GenerationRequest(tuple(float(x) for x in lengths), prompt, lambda k: prompt, lambda k: float(wide),
                             EngineLimits(kv_tokens, seats, block))


def step(b: int) -> float:
    return BETA + GAMMA * b


def test_vllm_batch_shrinks_as_short_responses_finish():
    run = ENGINES.get("vllm")(request([2, 4]), linear)
    first = ALPHA * 2 * 16 + 2 * step(2)      # both admitted, prefilled together, 2 steps at batch 2
    second = first + 2 * step(1)              # the long one alone for its last 2 steps
    assert run.finish == pytest.approx((first, second))
    assert run.seconds == pytest.approx(second)


def test_vllm_seats_refill_from_the_queue():
    run = ENGINES.get("vllm")(request([2, 4], seats=1), linear)
    a = ALPHA * 16 + 2 * step(1)
    b = a + ALPHA * 16 + 4 * step(1)
    assert run.finish == pytest.approx((a, b))


def test_vllm_takes_kv_blocks_as_tokens_are_written_and_preempts_the_latest_when_full():
    # prompts of 16, responses of 16, 64 tokens of cache: all three prompts fit (48 tokens and the
    # next step's 3); after 5 steps (63 tokens) the next step would not fit, so the latest admitted
    # is preempted with its 5 tokens made; the other two finish 11 steps on, and it comes back,
    # recomputing its prompt and its 5 tokens, for its last 11 steps
    plan = paged_schedule((16, 16, 16), 16, 256, 64)
    assert plan.steps.tolist() == [5, 11, 11] and plan.live.tolist() == [3, 2, 1]
    assert plan.admitted.tolist() == [3, 0, 1] and plan.prefill_tokens.tolist() == [48, 0, 21]
    assert plan.finish.tolist() == [1, 1, 2] and plan.preemptions == 1
    assert plan.context.tolist() == pytest.approx([48 / 3 + 5 / 2, 42 / 2 + 11 / 2, 21 + 11 / 2])  # mid-span
    req = request([16, 16, 16], kv_tokens=64)
    req = dataclasses.replace(req, table=StepTable(linear, 16.0, 3, 16, 1 << 20))  # costs without memory limits
    run = ENGINES.get("vllm")(req, linear)
    two = ALPHA * 3 * 16 + 5 * step(3) + 11 * step(2)
    assert run.finish == pytest.approx((two, two, two + ALPHA * 21 + 11 * step(1)))
    too_long = ENGINES.get("vllm")(request([100], kv_tokens=64), linear)
    assert math.isinf(too_long.seconds) and "KV blocks" in too_long.note


def test_a_cache_that_holds_every_sequence_never_preempts():
    plan = paged_schedule((5, 9, 3, 7), 8, 2, 1 << 20)
    assert plan.preemptions == 0 and plan.admitted.sum() == 4 and plan.live.max() == 2


def test_vllm_prices_each_step_at_the_live_mean_context():
    delta = 1e-4

    def attention(b, prompt, steps):  # per step b·delta·context, the context growing through the call
        return b * steps * delta * (prompt + steps / 2)

    run = ENGINES.get("vllm")(request([40], prompt=100.0), attention)
    assert run.seconds == pytest.approx(40 * delta * (100 + 20 + 0.5))


def test_step_table_interpolates_between_batches():
    table = StepTable(linear, 16.0, 20, 64, 1 << 20)  # sampled at batches 1, 4, 16, 20
    for b in (1, 3, 7, 20):
        assert table.decode(b, 40.0) == pytest.approx(step(b))
        assert table.prefill(b) == pytest.approx(ALPHA * b * 16)


def test_hf_decodes_every_wave_to_its_longest_response():
    run = ENGINES.get("hf")(request([2, 4, 8], wide=8), linear)
    whole = ALPHA * 3 * 16 + 8 * step(3)
    assert run.finish == pytest.approx((whole,) * 3)
    # room for one (16 + 8)-token sequence at a time: three waves of one
    waves = ENGINES.get("hf")(request([2, 4, 8], kv_tokens=30, wide=8), linear)
    one = ALPHA * 16 + 8 * step(1)
    assert waves.finish == pytest.approx((one, 2 * one, 3 * one))


def test_continuous_batching_beats_the_padded_loop_on_long_tails():
    lengths = [8] * 15 + [256]
    vllm = ENGINES.get("vllm")(request(lengths), linear)
    hf = ENGINES.get("hf")(request(lengths), linear)
    assert vllm.seconds < hf.seconds
    assert vllm.finish[0] < hf.finish[0]  # short responses leave early


def _cluster(gpu: str) -> ClusterSpec:
    return ClusterSpec.from_dict({"name": gpu, "hosts": [{"name": "h", "gpus": {"type": gpu, "count": 2}}]})


def test_default_backend_is_vllm_on_gpus_and_hf_on_cpus():
    assert default_backend(_cluster("A100-80GB")) == "vllm"
    assert default_backend(_cluster("cpu")) == "hf"


def test_the_simulator_prices_the_engine_it_is_given():
    wl = WorkloadSpec.from_dict({"models": {"actor": "qwen3-0.6b"}, "prompts_per_step": 16, "responses_per_prompt": 4,
                                 "prompt_len": {"mean": 128}, "response_len": {"mean": 256, "max": 1024,
                                                                                "dist": "lognormal", "std": 256}})
    cm = get_cost_model("analytical")
    times = {b: Simulator(_cluster("A100-80GB"), wl, cm, backend=b).replica_seconds("actor_gen", ["h:0"], 1, 1, 64)
             for b in ("hf", "vllm")}
    assert times["vllm"] < times["hf"]  # the padded loop decodes every sequence to the longest


def test_static_decodes_each_micro_batch_to_its_longest_response():
    # arrival order [3, 1, 4, 1, 5] in micro-batches of 2: [3, 1] to 3 steps, [4, 1] to 4, [5] to 5
    run = ENGINES.get("static")(request([3, 1, 4, 1, 5], seats=2), linear)
    a = ALPHA * 2 * 16 + 3 * step(2)
    b = a + ALPHA * 2 * 16 + 4 * step(2)
    c = b + ALPHA * 16 + 5 * step(1)
    assert run.finish == pytest.approx((a, a, b, b, c))
    assert run.seconds == pytest.approx(c)
    # continuous batching refills the finished seats, so it is never slower on the same costs
    assert ENGINES.get("vllm")(request([3, 1, 4, 1, 5], seats=2), linear).seconds < run.seconds


def test_static_micro_batch_shrinks_to_what_the_kv_cache_holds():
    # 16-token prompts, 16-token responses: room for 64 tokens holds two sequences of four seats
    run = ENGINES.get("static")(request([16, 16, 16], kv_tokens=64, seats=4), linear)
    two = ALPHA * 2 * 16 + 16 * step(2)
    assert run.finish == pytest.approx((two, two, two + ALPHA * 16 + 16 * step(1)))
    too_long = ENGINES.get("static")(request([100], kv_tokens=64), linear)
    assert math.isinf(too_long.seconds) and "KV cache" in too_long.note
