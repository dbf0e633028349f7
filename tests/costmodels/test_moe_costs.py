"""What expert parallelism costs (costmodels/moe.py, comm.expert_all_to_all_time, the roofline's
grouped GEMMs) against hand computation, and dense models unchanged by it."""

from __future__ import annotations

import dataclasses

import pytest

from hetprof.costmodels import LinkSpec, Phase, Placement, Work, comm, moe, phases
from hetprof.costmodels.analytical import AnalyticalCostModel
from hetprof.specs.models import PRESETS
from hetprof.specs.vocabulary import TaskKind

QWEN = PRESETS["qwen3-30b-a3b"]   # 48 layers, all MoE, hidden 2048, 128 experts of 768, top-8
DEEPSEEK = PRESETS["deepseek-v3"]
LINK = LinkSpec(alpha_s=5e-6, beta_Bps=2e11)


def test_dispatch_bytes_and_all_to_all_seconds_by_hand():
    # one token: its 2048-wide bf16 hidden state to 8 experts, 3 of 4 of them on other ranks at EP4
    per_token = 2048 * 2 * 8 * 3 / 4
    assert moe.dispatch_bytes(QWEN, 1000, 4, "bf16") == pytest.approx(1000 * per_token)
    assert moe.dispatch_bytes(QWEN, 1000, 1, "bf16") == 0.0
    # 48 layers x 2 passes x (dispatch + combine), each 3 alpha-steps and the bytes over beta, x 1.52
    sent = 1000 * per_token
    seconds = comm.expert_all_to_all_time(sent, 48, 4, 2, LINK.alpha_s, LINK.beta_Bps, 1.52)
    assert seconds == pytest.approx(48 * 2 * 2 * (3 * 5e-6 + 1.52 * sent / 2e11))
    assert comm.expert_all_to_all_time(sent, 48, 1, 2, LINK.alpha_s, LINK.beta_Bps) == 0.0


def test_cost_model_charges_the_all_to_alls_of_every_moe_layer():
    cm = AnalyticalCostModel()
    work = Work(TaskKind.TRAINING, QWEN, batch=4, prompt_len=256, response_len=768)
    place = Placement("H100-SXM", tp=2, ep=4, ep_link=LINK)
    tokens = 4 * 1024 / 2  # a TP rank's share of the replica's tokens
    sent = tokens * 2048 * 2 * 8 * 3 / 4
    expected = 48 * 2 * 2 * (3 * 5e-6 + 1.52 * sent / 2e11)  # forward + backward, no recomputation
    assert cm.task_time(work, place).breakdown["ep_comm"] == pytest.approx(expected)
    assert "ep_comm" not in cm.task_time(work, Placement("H100-SXM", tp=2)).breakdown


def test_imbalance_is_the_cited_max_violation_once_experts_are_spread():
    assert moe.imbalance(QWEN, 1) == 1.0
    assert moe.imbalance(QWEN, 8) == pytest.approx(1.52)      # auxiliary-loss balancing
    assert moe.imbalance(DEEPSEEK, 8) == pytest.approx(1.04)  # DeepSeek-V3's loss-free balancing
    assert moe.imbalance(PRESETS["qwen3-8b"], 8) == 1.0


def test_rows_per_expert_and_touched_experts_by_hand():
    assert moe.rows_per_expert(QWEN, 256, 1) == pytest.approx(256 * 8 / 128)      # a decode step: 16 rows
    assert moe.rows_per_expert(QWEN, 256, 4) == pytest.approx(256 * 4 * 8 / 128)  # EP4 gathers 4 ranks'
    # one token reads 8 of 128 experts; 4 tokens (1 each on 4 EP ranks) miss an expert with (120/128)^4
    assert moe.touched_fraction(QWEN, 1, 1) == pytest.approx(8 / 128)
    assert moe.touched_fraction(QWEN, 1, 4) == pytest.approx(1 - (120 / 128) ** 4)
    assert moe.touched_fraction(QWEN, 65536, 1) == pytest.approx(1.0)


def test_routed_flops_are_the_top_k_expert_matmuls():
    p = Phase("prefill", QWEN, layers=48, batch=2, tokens=100, tp=2)
    assert phases.routed_matmul_flops(p) == pytest.approx(48 * 200 * 2 * 3 * 2048 * 768 * 8 / 2)
    assert phases.routed_matmul_flops(dataclasses.replace(p, model=PRESETS["qwen3-8b"])) == 0.0


def test_decode_reads_the_experts_its_tokens_reach_on_its_rank():
    one = Phase("decode", QWEN, layers=48, batch=1, tokens=100)
    width = 2
    routed = QWEN.routed_expert_params_per_layer * 48
    rest = 48 * QWEN.params_per_layer - routed
    assert phases.weight_bytes(one) == pytest.approx((rest + routed * 8 / 128) * width)
    ep4 = dataclasses.replace(one, ep=4)
    assert phases.weight_bytes(ep4) == pytest.approx((rest + routed * (1 - (120 / 128) ** 4) / 4) * width)


def test_grouped_gemm_runs_at_the_catalog_rate_of_its_rows():
    cm = AnalyticalCostModel()
    p = Phase("train", QWEN, layers=4, batch=8, tokens=4096)
    cal = cm.calibration
    rate = cal.compute_rate("H100-SXM", "bf16", "matmul", phases.matmul_rows(p)).value
    grouped = cal.compute_rate("H100-SXM", "bf16", "matmul", phases.expert_rows(p)).value
    routed = phases.routed_matmul_flops(p)
    expected = (phases.forward_matmul_flops(p) - routed) / rate + routed / (grouped * 1288 / 1304)
    assert cm._matmul_seconds(p, "H100-SXM", rate) == pytest.approx(expected)


def test_dense_models_cost_what_they_did():
    cm = AnalyticalCostModel()
    dense = PRESETS["qwen3-8b"]
    p = Phase("decode", dense, layers=36, batch=64, tokens=512)
    rate = cm.calibration.compute_rate("H100-SXM", "bf16", "matmul", 64).value
    assert cm._matmul_seconds(p, "H100-SXM", rate) == phases.forward_matmul_flops(p) / rate
    assert phases.weight_bytes(p) == 36 * dense.params_per_layer * 2
    work = Work(TaskKind.TRAINING, dense, batch=4, prompt_len=256, response_len=768)
    # an EP degree on a dense model changes nothing (there are no experts to spread)
    assert cm.task_time(work, Placement("H100-SXM", ep=4)).seconds == cm.task_time(work, Placement("H100-SXM")).seconds


def test_fp8_training_of_an_moe_model_sends_its_all_to_alls_in_bf16():
    # Transformer Engine casts to FP8 inside the expert GEMMs: the dispatched hidden states stay bf16
    assert moe.dispatch_bytes(QWEN, 1000, 4, "fp8") == moe.dispatch_bytes(QWEN, 1000, 4, "bf16")
    cm = AnalyticalCostModel()
    place = Placement("H100-SXM", ep=4, ep_link=LINK)
    fp8 = cm.task_time(Work(TaskKind.TRAINING, QWEN, batch=4, prompt_len=256, response_len=768, dtype="fp8"), place)
    bf16 = cm.task_time(Work(TaskKind.TRAINING, QWEN, batch=4, prompt_len=256, response_len=768), place)
    assert fp8.breakdown["ep_comm"] == pytest.approx(bf16.breakdown["ep_comm"])
    assert fp8.breakdown["train"] < bf16.breakdown["train"]  # FP8 GEMMs at their own, higher peak


def test_an_all_to_all_across_hosts_puts_only_the_other_hosts_share_on_the_network():
    # 16 GPUs, 8 a host: 8 of a GPU's 15 peers are on the other host; its host's 8 GPUs share the NICs
    nvlink, network = 4.5e11, 4e11
    per_byte = max((7 / 15) / nvlink, (8 / 15) * 8 / network)
    assert comm.all_to_all_Bps(nvlink, network, 16, 8) == pytest.approx(1 / per_byte)
    assert comm.all_to_all_Bps(nvlink, network, 8, 8) == nvlink           # one host: the GPU link alone
    assert comm.all_to_all_Bps(nvlink, network, 64, 8) < comm.all_to_all_Bps(nvlink, network, 16, 8)
    # one GPU of each of 16 hosts, while 7 other groups' GPUs on every host cross its network too
    assert comm.all_to_all_Bps(nvlink, network, 16, 1, 8) == pytest.approx(network / 8)


def test_a_stated_expert_imbalance_replaces_the_cited_one():
    assert moe.imbalance(QWEN, 8, 1.0) == 1.0 and moe.imbalance(QWEN, 8, 1.2) == 1.2
    assert moe.imbalance(QWEN, 1, 1.2) == 1.0  # no expert parallelism: no rank waits for another
    cm = AnalyticalCostModel()
    place = Placement("H100-SXM", ep=4, ep_link=LINK)
    cited = cm.task_time(Work(TaskKind.TRAINING, QWEN, batch=4, prompt_len=256, response_len=768), place)
    forced = cm.task_time(Work(TaskKind.TRAINING, QWEN, batch=4, prompt_len=256, response_len=768,
                               expert_imbalance=1.0), place)
    assert forced.breakdown["ep_comm"] < cited.breakdown["ep_comm"]
    assert forced.breakdown["train"] < cited.breakdown["train"]  # the routed GEMMs wait less too
    with pytest.raises(ValueError, match="expert_imbalance"):
        Work(TaskKind.TRAINING, QWEN, batch=4, prompt_len=256, response_len=768, expert_imbalance=0.5)


def test_whole_experts_fold_the_expert_group_over_the_tp_ranks_by_hand():
    # Megatron TP2 EP8 ETP1 over 4 replicas: each expert whole on one of 8 ranks, so a rank's 1/2 of the
    # replica's tokens go to 7/8 of their experts on other ranks, and its MoE layers join no TP
    # all-reduce: training's 4 per layer halve (the attention's stay)
    cm = AnalyticalCostModel()
    work = Work(TaskKind.TRAINING, QWEN, batch=4, prompt_len=256, response_len=768)
    sliced = cm.task_time(work, Placement("H100-SXM", tp=2, ep=4, ep_link=LINK, tp_link=LINK))
    whole = cm.task_time(work, Placement("H100-SXM", tp=2, ep=4, ep_link=LINK, tp_link=LINK, etp=1))
    sent = 4 * 1024 / 2 * 2048 * 2 * 8 * 7 / 8
    assert whole.breakdown["ep_comm"] == pytest.approx(48 * 2 * 2 * (7 * 5e-6 + 1.52 * sent / 2e11))
    assert whole.breakdown["tp_comm"] == pytest.approx(sliced.breakdown["tp_comm"] / 2)
    # memory and the routed GEMMs' rows are the same: ep × tp shards of the experts either way
    assert cm.memory(work, Placement("H100-SXM", tp=2, ep=4, etp=1)).total == pytest.approx(
        cm.memory(work, Placement("H100-SXM", tp=2, ep=4)).total)
    # at EP1 the fold alone spreads the experts: the TP pair exchanges tokens and waits for its busier rank
    alone = cm.task_time(work, Placement("H100-SXM", tp=2, ep_link=LINK, tp_link=LINK, etp=1))
    pair = 4 * 1024 / 2 * 2048 * 2 * 8 * 1 / 2
    assert alone.breakdown["ep_comm"] == pytest.approx(48 * 2 * 2 * (1 * 5e-6 + 1.52 * pair / 2e11))
    assert alone.breakdown["train"] > cm.task_time(work, Placement("H100-SXM", tp=2, tp_link=LINK)).breakdown["train"]


def test_generation_never_folds_its_experts():
    # vLLM slices experts over TP: a generation placement's etp changes nothing
    cm = AnalyticalCostModel()
    gen = Work(TaskKind.GENERATION, QWEN, batch=64, prompt_len=256, response_len=512)
    assert cm.task_time(gen, Placement("H100-SXM", tp=2, etp=1)).seconds == pytest.approx(
        cm.task_time(gen, Placement("H100-SXM", tp=2)).seconds)
    with pytest.raises(ValueError, match="etp"):
        Placement("H100-SXM", tp=4, etp=2)
