"""Long sequences in the planner: the micro-batch it chooses when the workload sets none, Ulysses and
context-parallel degrees as searched layout dimensions (memory and traffic as the cost model prices
them), and a published Qwen3-32B layout at 4K sequences that the 16K-token default used to refuse."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from rich.console import Console

from hetprof.costmodels import comm, get_cost_model, memory
from hetprof.planner.candidate import Candidate, even_layout
from hetprof.planner.layoutcomms import ring_seconds, ulysses_seconds
from hetprof.planner.memcheck import check_plan
from hetprof.planner.pinned import PinnedLayout, pinned_candidate
from hetprof.planner.report import micro_batch_choices, print_plan
from hetprof.planner.search import layouts, splits
from hetprof.planner.search.space import decode_candidate, encode_candidate
from hetprof.planner.session import build_plan
from hetprof.planner.simulator import Simulator
from hetprof.runtime.tokenbudget import sample_lengths
from hetprof.specs import ClusterSpec, WorkloadSpec
from hetprof.specs.layout import TaskLayout
from hetprof.specs.loader import from_data
from hetprof.specs.models import DTYPE_BYTES

H100X8 = {"name": "h100x8", "hosts": [{"name": "n", "gpus": {"type": "H100", "count": 8}}]}


def _sim(actor: str, prompt: int, response: int, executable: bool = False, **training) -> Simulator:
    wl = WorkloadSpec.from_dict({"models": {"actor": actor}, "prompts_per_step": 32, "responses_per_prompt": 8,
                                 "prompt_len": {"mean": prompt, "max": prompt}, "mini_batches": 4,
                                 "response_len": {"mean": response, "max": response},
                                 "training": {"kl_coef": 0.0, **training}})
    return Simulator(ClusterSpec.from_dict(H100X8), wl, get_cost_model("analytical"), streaming=False,
                     executable=executable)


def test_a_qwen3_32b_tp4_pp2_layout_at_4k_sequences_is_not_refused_for_a_default_budget():
    # Megatron-style TP4 × PP2 on one 8-GPU host, 1K prompts + 3K responses, activation checkpointing
    sim = _sim("qwen3-32b", 1024, 3072, executable=True, recompute=True)
    pinned = from_data(PinnedLayout, {"groups": {"all": 8}, "offload": ["all"], "tasks": {
        "generation": {"group": "all", "tp": 4}, "inference": {"group": "all", "tp": 4, "pp": 2},
        "training": {"group": "all", "tp": 4, "pp": 2}}})
    cand = pinned_candidate(sim, pinned)
    # at the 16K-token default a stage would need more than the GPU: the layout used to be refused
    train = sim.planning.replica_memory("actor_train", "H100", 4, 32, 256)
    at_default = memory.task_memory("training", sim.planning.model_of("actor_train"), 32, 4, 256, 4096, "bf16",
                                    True, 0)
    assert at_default.total > 80e9 > train.total
    assert sim.planning.micro_tokens("actor_train", "H100", 4, 32, 256) == 8192  # two 4K sequences
    score = sim.evaluate(cand)
    assert score.feasible, score.violations
    plan = build_plan(sim, cand, score, search="pinned")
    assert check_plan(plan) == []  # the independent check makes the same choice
    layouts_, _ = sim.with_followers(cand)
    assert "actor_train 8,192 tokens" in micro_batch_choices(sim, layouts_)
    console = Console(record=True, width=200)
    print_plan(console, sim, cand, score)
    assert "micro-batches the planner chose" in console.export_text()


def test_the_planner_chooses_the_micro_batch_only_when_the_workload_fixes_none():
    free = _sim("qwen3-8b", 1024, 3072, recompute=True)
    fsdp8 = ("actor_train", "H100", 1, 36, 32, 8, "fsdp")
    assert free.planning.micro_tokens(*fsdp8) == memory.MICRO_BATCH_TOKENS  # the default fits: kept
    # whole Adam state of 8B on one GPU fits nowhere: the smallest budget, one sequence, says by how much
    assert free.planning.micro_tokens("actor_train", "H100", 1, 36, 32) == 4096
    assert free.planning.micro_tokens("actor_gen", "H100", 1, 36, 32) is None  # generation has no micro-batch
    fixed = _sim("qwen3-8b", 1024, 3072, recompute=True, max_tokens_per_microbatch=4096)
    assert fixed.planning.micro_tokens(*fsdp8) is None
    lay = even_layout("actor_train", tuple(sorted(fixed.devices)), 1, 1, 36)
    assert micro_batch_choices(fixed, {"actor_train": lay}) == []


def test_sequence_splits_are_searched_fixed_by_the_workload_and_off_for_hetprof_run():
    devs = tuple(f"n:{i}" for i in range(8))
    long = _sim("qwen3-8b", 1024, 65536, recompute="full")
    assert splits.sequence_splits(long.planning, "actor_gen", 1) == ((1,), (1,))
    assert splits.sequence_splits(long.planning, "actor_train", 1) == ((1, 2, 4, 8), (1, 2, 4, 8))
    assert splits.sequence_splits(long.planning, "actor_train", 4) == ((1, 2, 4, 8), (1, 2, 4, 8))
    assert splits.sequence_splits(long.planning, "actor_train", 8) == ((1, 2, 4), (1, 2, 4, 8))  # 32 heads / 8
    chosen = layouts.best_layout(long.planning, "actor_train", devs)
    assert chosen.sp * chosen.cp > 1 and long.task_eval(chosen).violations == ()
    # one 66K-token sequence holds more than a GPU's room unless it is split
    whole = long.planning.replica_memory("actor_train", "H100", 1, 36, 32, 8, "fsdp", 1)
    split = long.planning.replica_memory("actor_train", "H100", 1, 36, 32, 8, "fsdp", chosen.sp, chosen.cp)
    assert whole.activations > split.activations
    fixed = _sim("qwen3-8b", 1024, 65536, recompute="full", sequence_parallel=1, context_parallel=2)
    assert splits.sequence_splits(fixed.planning, "actor_train", 1) == ((1,), (2,))
    lay = layouts.best_layout(fixed.planning, "actor_train", devs)
    assert (lay.sp, lay.cp) == (1, 2) and lay.dp * lay.tp * lay.pp * 2 == len(lay.devices())
    short = _sim("qwen3-8b", 256, 512, executable=True)  # padded passes: `hetprof run` splits none
    assert splits.sequence_splits(short.planning, "actor_train", 1) == ((1,), (1,))


def test_a_plan_for_hetprof_run_splits_sequences_only_as_the_executor_does():
    """Ulysses on whole-model replicas of packed passes (executable.sequence_parallel_problems); no CP."""
    packed = _sim("qwen3-8b", 256, 512, executable=True, max_tokens_per_microbatch=4096)
    assert splits.sequence_splits(packed.planning, "actor_train", 1) == ((1, 2, 4, 8), (1,))
    assert splits.sequence_splits(packed.planning, "actor_logprob", 1) == ((1, 2, 4, 8), (1,))
    assert splits.sequence_splits(packed.planning, "actor_train", 2) == ((1,), (1,))  # TP replicas
    assert splits.sequence_splits(packed.planning, "actor_train", 1, pp=2) == ((1,), (1,))
    assert splits.sequence_splits(packed.planning, "actor_gen", 1) == ((1,), (1,))
    devs = tuple(f"n:{i}" for i in range(8))
    padded = _sim("qwen3-8b", 256, 512, executable=True)
    lay = TaskLayout("actor_train", 1, 1, tuple((d,) for d in devs), (1 / 8,) * 8, ((36,),) * 8, sp=2)
    assert packed.structure.layout_problems(lay, devs, 0) == []
    said = padded.structure.layout_problems(lay, devs, 0)
    assert len(said) == 1 and "max_tokens_per_microbatch" in said[0] and "--any-layout" in said[0]


def test_a_context_parallel_layout_prices_its_ring_and_its_share_of_the_work():
    sim = _sim("qwen3-8b", 1024, 7168, recompute="full")
    devs = tuple(sorted(sim.devices))
    plain = even_layout("actor_train", devs, 2, 1, 36)          # DP4 × TP2
    ring = even_layout("actor_train", devs, 2, 1, 36, cp=2)     # DP2 × TP2 × CP2
    assert ring.stage_devices(0, 0) == devs[:4] and ring.describe() == "DP2×TP2×PP1 CP2"
    b = sim.planning._costs.basis
    link = b.links.between("n", "n")
    # the busiest replica's 128 sequences of 8K, 1/2 of each on a rank, K and V of 8 KV heads over TP2
    tokens = 128 * 8192 / 2
    hand = comm.ring_attention_time(tokens, 8 * 128 // 2, 36, 2, 4, link.alpha_s, link.beta_Bps,
                                    DTYPE_BYTES["bf16"])
    assert ring_seconds(b, ring) == pytest.approx(hand)
    # a CP2 replica of 4 GPUs does two TP2 replicas' sequences at the same seconds (1/2 of each on a rank)
    one, two = (sim.task_eval(x) for x in (plain, ring))
    assert two.replica_seconds[0] == pytest.approx(one.replica_seconds[0], rel=0.02)
    assert two.seconds > one.seconds  # and its ring on top
    stage = sim.planning.replica_memory("actor_train", "H100", 2, 36, 128, 2, "none", 1, 2)
    assert two.memory["n:0"] == stage  # memory per GPU: the CP2 rank's
    # a budget is per GPU: a CP2 micro-batch holds two ranks' budgets of sequences, half of each on a rank
    assert stage.activations == sim.planning.replica_memory("actor_train", "H100", 2, 36, 128).activations


def test_a_ulysses_layout_is_priced_by_its_own_degree():
    sim = _sim("qwen3-8b", 1024, 7168, recompute="full")
    devs = tuple(sorted(sim.devices))
    lay = even_layout("actor_train", devs, 1, 1, 36, sp=4)
    b = sim.planning._costs.basis
    problems: list[str] = []
    alone = ulysses_seconds(b, lay, 4, problems)
    assert alone > 0 and problems == []
    plain = sim.task_eval(dataclasses.replace(lay, sp=1))
    assert sim.task_eval(lay).seconds > plain.seconds  # its all-to-alls on top of the same compute


def test_candidates_keep_their_split_degrees_through_encoding():
    devs = tuple(f"n:{i}" for i in range(8))
    lay = even_layout("actor_train", devs, 2, 1, 36, cp=2, sp=2)
    cand = Candidate([("actor_train",)], [devs], {"actor_train": lay})
    back = decode_candidate(encode_candidate(cand), devs).layout("actor_train")
    assert (back.cp, back.sp) == (2, 2) and back == lay
    plain = Candidate([("actor_train",)], [devs], {"actor_train": even_layout("actor_train", devs, 1, 1, 36)})
    assert '"sp"' not in encode_candidate(plain)  # unsplit layouts encode as before


def test_a_long_tail_costs_training_its_quadratic_share_of_attention():
    def sim(dist: dict) -> Simulator:
        wl = WorkloadSpec.from_dict({"models": {"actor": "qwen3-8b"}, "prompts_per_step": 32, "responses_per_prompt": 8,
                                     "prompt_len": {"mean": 1024, "max": 1024},
                                     "response_len": {"mean": 16384, "max": 65536, **dist},
                                     "training": {"kl_coef": 0.0, "recompute": "full"}})
        return Simulator(ClusterSpec.from_dict(H100X8), wl, get_cost_model("analytical"), streaming=False)

    fixed, tail = sim({}), sim({"dist": "lognormal", "std": 16384})
    b = tail.planning._costs.basis
    s = np.asarray(sample_lengths(b.prompts, b.lengths, b.sequences), dtype=float)
    assert b.attention_span == pytest.approx((s * s).sum() / s.sum())
    assert b.attention_span > 1.5 * (1024 + 16384)  # lognormal with std = mean: about twice the mean
    assert fixed.planning._costs.basis.attention_span == pytest.approx(1024 + 16384)
    assert b.work("actor_gen", 8).attention_span is None  # decode prices its own contexts
    devs = tuple(sorted(fixed.devices))
    lay = even_layout("actor_train", devs, 1, 1, 36, sp=8)
    assert tail.task_eval(lay).replica_seconds[0] > 1.2 * fixed.task_eval(lay).replica_seconds[0]


def test_a_plan_with_a_context_parallel_layout_passes_the_structure_check():
    """A CP stage holds tp × cp devices: a whole plan with one is priced, not refused as malformed."""
    sim = _sim("qwen3-8b", 1024, 7168, recompute="full")
    devs = tuple(sorted(sim.devices))
    ring = even_layout("actor_train", devs, 2, 1, 36, cp=2)     # DP2 × TP2 × CP2: 4 devices a replica
    assert sim.structure.layout_problems(ring, devs, 0) == []
    pinned = from_data(PinnedLayout, {"groups": {"all": 8}, "tasks": {
        "generation": {"group": "all", "tp": 1}, "training": {"group": "all", "tp": 2, "cp": 2}}})
    score = sim.evaluate(pinned_candidate(sim, pinned))
    assert not any("devices, tp*pp" in v for v in score.violations), score.violations
    short = dataclasses.replace(ring, replicas=(devs[:3], devs[3:6]), shares=(0.5, 0.5), layer_splits=((36,),) * 2)
    said = sim.structure.layout_problems(short, devs, 0)
    assert said and "tp*pp*cp = 4 expected" in said[0]
