"""Long sequences in the cost model, by hand: recompute choices and activation offload in memory and
time, context parallelism's share of the work and its ring, and the micro-batch budgets a planner
chooses among."""

from __future__ import annotations

import pytest

from hetprof.costmodels import LinkSpec, comm, get_cost_model, phases
from hetprof.costmodels.data import MemoryEstimate, Phase, Placement, Work
from hetprof.costmodels.memory import (
    MICRO_BATCH_TOKENS,
    fitting_micro_tokens,
    micro_token_choices,
    task_memory,
)
from hetprof.errors import SpecError
from hetprof.specs import WorkloadSpec
from hetprof.specs.models import PRESETS, ModelShape

# 4 layers, hidden 64, ffn 128, 4 heads and 2 KV heads of 16, vocab 100. One layer stores per token
# 2 B × (5·64 + 2·64 + 2·32 + 4·128) = 2048 B; its input alone is 2 B × 64 = 128 B.
M = ModelShape("toy", "llama", 4, 64, 128, 4, 2, 16, 100, False)
PER_LAYER, INPUT = 2048, 128
LOGITS = 2 * 100 * 4  # a token's fp32 logits and their gradient
LINK = LinkSpec(1e-5, 1e10)


def _train(tokens_seqs: int = 2, seq_len: int = 100, **kw) -> MemoryEstimate:
    return task_memory("training", M, 4, 1, tokens_seqs, seq_len, "bf16", kw.pop("recompute", "none"), 0, **kw)


@pytest.mark.parametrize(("recompute", "offload", "stored"), [
    ("none", False, 4 * PER_LAYER),              # every layer's tensors
    ("selective", False, 4 * PER_LAYER),         # the fused core stores no seq² scores: nothing more to free
    ("full", False, 4 * INPUT + PER_LAYER),      # every layer's input, one layer replayed at a time
    (True, False, 4 * INPUT + PER_LAYER),        # the old boolean form
    ("none", True, 2 * PER_LAYER),               # offloaded: the layer computing and the one in flight
    ("full", True, 2 * INPUT + PER_LAYER),
])
def test_training_activations_per_recompute_choice_and_offload(recompute, offload, stored):
    est = _train(recompute=recompute, offload=offload)  # 2 sequences of 100 tokens: one micro-batch of 200
    assert est.activations == pytest.approx(200 * (stored + LOGITS))


def test_sequence_splits_put_a_share_of_the_micro_batch_on_a_rank():
    # context parallel: the replica's own 2 sequences, 1/2 of each on a rank
    assert _train(cp=2).activations == pytest.approx(100 * (4 * PER_LAYER + LOGITS))
    # Ulysses: 2 replicas pool 4 sequences, 1/2 of each on a rank: many sequences fill one budget alike
    assert _train(sp=2).activations == pytest.approx(200 * (4 * PER_LAYER + LOGITS))
    # one 4,000-token sequence over a 1,000-token budget: split over 4 ranks, 1,000 tokens each
    assert _train(1, 4000, micro_tokens=1000, cp=4).activations == pytest.approx(1000 * (4 * PER_LAYER + LOGITS))
    assert _train(1, 4000, micro_tokens=1000).activations == pytest.approx(4000 * (4 * PER_LAYER + LOGITS))


def test_a_smaller_micro_batch_holds_fewer_tokens():
    # 8 sequences of 1,000: 16 fit the default budget (all 8), 2 fit a 2,048-token one
    assert _train(8, 1000).activations == pytest.approx(8000 * (4 * PER_LAYER + LOGITS))
    assert _train(8, 1000, micro_tokens=2048).activations == pytest.approx(2000 * (4 * PER_LAYER + LOGITS))


def test_micro_batch_choices_halve_down_to_one_sequence_per_rank():
    assert micro_token_choices(4096) == (MICRO_BATCH_TOKENS, 8192, 4096)
    assert micro_token_choices(4096, 2) == (MICRO_BATCH_TOKENS, 8192, 4096, 2048)
    assert micro_token_choices(65536) == (MICRO_BATCH_TOKENS,)  # one sequence over-fills the default already

    def estimate(budget: int) -> MemoryEstimate:
        return MemoryEstimate(0, 0, 0, budget, 0, budget)

    assert fitting_micro_tokens(estimate, 10_000, 4096) == (8192, estimate(8192))
    assert fitting_micro_tokens(estimate, 1e9, 4096)[0] == MICRO_BATCH_TOKENS
    assert fitting_micro_tokens(estimate, 10, 4096)[0] == 4096  # none fits: the smallest, which says why


def test_selective_recompute_costs_one_more_attention_forward():
    none, selective = (Phase("train", M, 4, 2, 512, recompute_attention=s) for s in (False, True))
    assert phases.flops(selective) - phases.flops(none) == pytest.approx(phases.forward_attention_flops(none))
    # forward 1 + FlashAttention backward 2.5 + the replayed core 1; the weight matmuls stay at 3
    assert phases.attention_passes(selective) == 4.5 and phases.passes(selective) == 3.0
    full = Phase("train", M, 4, 2, 512, recompute=True, recompute_attention=True)
    assert (phases.attention_passes(full), phases.passes(full)) == (4.5, 4.0)  # the full replay holds the core's
    cm = get_cost_model("analytical")  # a compute-bound phase: 4 sequences of 8K through 8B's layers
    big = [Phase("train", PRESETS["qwen3-8b"], 36, 4, 8192, with_head=True, recompute_attention=s) for s in (False, True)]
    t_none, t_sel = (cm.phase_time(p, "H100-SXM").seconds for p in big)
    attention = cm.calibration.compute_rate("H100-SXM", "bf16", "attention", 8192).value
    assert t_sel - t_none == pytest.approx(phases.forward_attention_flops(big[0]) / attention)


def test_training_prices_flash_attention_backward_at_two_and_a_half_forwards():
    """FlashAttention-2 (Dao 2023) §4.1: backward FLOPs = 2.5 × forward (QKᵀ recomputed). By hand for one
    layer of 2 sequences of 512 at tp 1: pairs 2·512·513/2 = 262,656, × 4·heads·head_dim FLOPs each."""
    train, prefill = (Phase(kind, M, 1, 2, 512) for kind in ("train", "prefill"))
    core = 262_656 * 4 * M.heads * M.head_dim
    assert phases.forward_attention_flops(prefill) == pytest.approx(core)
    assert phases.attention_passes(prefill) == 1.0 and phases.attention_passes(train) == 3.5
    assert phases.flops(train) == pytest.approx(3.0 * phases.forward_matmul_flops(train) + 3.5 * core)


def test_work_reads_old_and_new_recompute_forms():
    assert Work("training", M, 1, 10, 10, recompute=True).recompute == "full"
    assert Work("training", M, 1, 10, 10, recompute=False).recompute == "none"
    assert Work("training", M, 1, 10, 10, recompute="selective").recompute == "selective"
    with pytest.raises(ValueError, match="recompute"):
        Work("training", M, 1, 10, 10, recompute="some")


def _workload(**training) -> WorkloadSpec:
    return WorkloadSpec.from_dict({
        "models": {"actor": "qwen3-0.6b"}, "prompt_len": {"mean": 64}, "response_len": {"mean": 64},
        "training": training})


def test_workload_recompute_accepts_booleans_of_old_files_and_the_three_choices():
    assert _workload(recompute=True).training.recompute_mode == "full"
    assert _workload(recompute=False).training.recompute_mode == "none"
    assert _workload().training.recompute_mode == "none"
    for mode in ("none", "selective", "full"):
        assert _workload(recompute=mode).training.recompute_mode == mode
    with pytest.raises(SpecError, match="selective"):
        _workload(recompute="partial")
    wl = _workload(recompute="selective", activation_offload=True)
    assert WorkloadSpec.from_dict(wl.to_dict()).training.recompute == "selective"
    assert wl.training.sequence_parallel is None and wl.training.context_parallel is None  # the planner's to choose


def test_responses_up_to_64k_with_a_long_tail_load():
    wl = WorkloadSpec.from_dict({"models": {"actor": "qwen3-8b"}, "prompt_len": {"mean": 1024, "max": 2048},
                                 "response_len": {"mean": 16384, "max": 65536, "dist": "lognormal", "std": 16384}})
    assert wl.response_len.cap == 65536
    assert wl.response_len.expected_longest(512) > 2 * wl.response_len.mean  # the tail the planner feels


def test_ring_attention_passes_each_ranks_keys_and_values_around_the_ring():
    # 1,000 tokens × 2 × 32 wide × 2 B = 128 kB per step; cp 4: 3 steps per layer and pass
    step = 1e-5 + 128_000 / 1e10
    assert comm.ring_attention_time(1000, 32, 4, 4, 3, 1e-5, 1e10) == pytest.approx(4 * 3 * 3 * step)
    assert comm.ring_attention_time(1000, 32, 4, 1, 3, 1e-5, 1e10) == 0.0
    cm = get_cost_model("analytical")
    place = Placement("H100-SXM")
    # 10 sequences of 100 over cp 4: 250 tokens a rank; K and V of 2 heads of 16
    one = comm.ring_attention_time(250, 32, 4, 4, 1, 1e-5, 1e10)
    assert cm.context_parallel_time(Work("inference", M, 10, 20, 80), place, 4, LINK) == pytest.approx(one)
    assert cm.context_parallel_time(Work("training", M, 10, 20, 80), place, 4, LINK) == pytest.approx(3 * one)
    full = Work("training", M, 10, 20, 80, recompute="full")
    assert cm.context_parallel_time(full, place, 4, LINK) == pytest.approx(4 * one)


def test_context_parallel_ranks_compute_their_share_of_every_sequence():
    cm = get_cost_model("analytical")
    place = Placement("H100-SXM", 2)
    for kind, part in (("training", "train"), ("inference", "forward")):
        whole = cm.task_time(Work(kind, M, 8, 512, 1536), place).breakdown
        half = cm.task_time(Work(kind, M, 8, 512, 1536, cp=2), place).breakdown
        assert half[part] == pytest.approx(whole[part] / 2)
        assert half["tp_comm"] < whole["tp_comm"]


def test_activation_offload_shows_only_the_host_traffic_the_compute_does_not_hide():
    cm = get_cost_model("analytical")
    place = Placement("H100-SXM")
    work = Work("training", M, 10, 20, 80, activation_offload=True)
    parts = cm.task_time(work, place).breakdown
    moved = 1000 * 2 * PER_LAYER  # 1,000 tokens, every layer but the 2 resident ones
    expect = max(0.0, 2 * cm.host_transfer_time(moved, "H100-SXM") - parts["train"])
    assert parts["activation_offload"] == pytest.approx(expect)
    assert "activation_offload" not in cm.task_time(Work("training", M, 10, 20, 80), place).breakdown


def test_attention_of_sequences_that_differ_in_length_is_priced_by_their_squares():
    # 2 sequences of 100 and 300 tokens priced at their mean 200: Σs² / Σs = (10⁴ + 9·10⁴) / 400 = 250
    mean = Phase("train", M, 4, 2, 200)
    spread = Phase("train", M, 4, 2, 200, attention_span=250.0)
    assert phases.attention_pairs(mean) == 2 * 200 * 201 / 2
    assert phases.attention_pairs(spread) == 2 * 200 * 251 / 2  # (Σs² + Σs) / 2 causal pairs
    assert phases.attention_keys(spread) == 250.0
    assert phases.forward_matmul_flops(spread) == phases.forward_matmul_flops(mean)  # tokens are tokens
    decode = Phase("decode", M, 4, 2, 200, attention_span=250.0)
    assert phases.attention_pairs(decode) == 2 * 200  # a decode step attends its own context
