"""Each cost term against arithmetic done by hand from published shapes and given α/β."""

from __future__ import annotations

import math

import pytest

from hetprof.costmodels import LinkSpec, Phase, Placement, Work, comm, get_cost_model, memory, phases
from hetprof.profiles import DeviceInfo, ProfileDB
from hetprof.specs.catalog import lookup
from hetprof.specs.models import PRESETS

Q8 = PRESETS["qwen3-8b"]


def test_qwen3_8b_layer_flops_by_hand():
    # q and o: 4096 x (32 heads x 128) each; k and v: 4096 x (8 x 128) each; SwiGLU: 3 x 4096 x 12288
    weights = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 12288
    assert weights == 192_937_984
    assert Q8.matmul_flops_per_token_per_layer() == 2 * weights == 385_875_968
    # a 1024-token causal prefill through one layer: 1024 tokens of matmuls + 1024*1025/2 attention pairs,
    # each pair costing QK^T and AV = 2 * 2 * 32 heads * 128
    p = Phase("prefill", Q8, layers=1, batch=1, tokens=1024)
    assert phases.flops(p) == 1024 * 385_875_968 + 524_800 * 16_384 == 403_735_314_432
    # training: the matmuls forward + 2x backward, attention forward + 2.5x backward (FlashAttention),
    # one more forward of both with recomputation; TP halves a device's share
    matmul, attention = 1024 * 385_875_968, 524_800 * 16_384
    t = Phase("train", Q8, layers=1, batch=1, tokens=1024, tp=2)
    assert phases.flops(t) == pytest.approx((3 * matmul + 3.5 * attention) / 2)
    assert phases.flops(Phase("train", Q8, 1, 1, 1024, recompute=True)) == pytest.approx(4 * matmul + 4.5 * attention)
    # decode at context 2048: one token of matmuls and 2048 pairs per sequence, 8 sequences
    d = Phase("decode", Q8, layers=1, batch=8, tokens=2048)
    assert phases.flops(d) == 8 * (385_875_968 + 2048 * 16_384)


def test_kv_cache_bytes_by_hand():
    # K and V, 36 layers, 8 KV heads of 128, 2 bytes
    assert Q8.kv_bytes_per_token("bf16") == 2 * 36 * 8 * 128 * 2 == 147_456
    assert memory.kv_bytes_per_token(Q8, 36, 1) == 147_456
    assert memory.kv_bytes_per_token(Q8, 36, 2) == 73_728
    # with more TP ranks than KV heads every rank still holds one head
    assert memory.kv_bytes_per_token(Q8, 36, 16) == 2 * 36 * 1 * 128 * 2
    # a generation replica's KV cache: 40 sequences x 2048 tokens (batch caps the concurrency)
    cm = get_cost_model("analytical")
    w = Work("generation", Q8, batch=40, prompt_len=1024, response_len=1024)
    mem = cm.memory(w, Placement("H100-SXM"))
    assert mem.kv_cache == 40 * 2048 * 147_456


def test_ring_all_reduce_and_friends_by_hand():
    a, b, s = 1e-5, 1e10, 1e9
    # ring all-reduce over 4 ranks: 2(n-1) latency steps, 2(n-1)/n of the message per link
    assert comm.collective_time("all_reduce", s, 4, a, b) == pytest.approx(6 * 1e-5 + 1.5 * 0.1)
    assert comm.collective_time("all_gather", s, 4, a, b) == pytest.approx(3 * 1e-5 + 0.75 * 0.1)
    assert comm.collective_time("broadcast", s, 3, a, b) == pytest.approx(2 * 1e-5 + 0.1)
    assert comm.collective_time("p2p", s, 2, a, b) == pytest.approx(1e-5 + 0.1)
    assert comm.collective_time("all_reduce", s, 1, a, b) == 0.0
    cm = get_cost_model("analytical")
    assert cm.collective_time("all_reduce", s, 4, LinkSpec(a, b)) == pytest.approx(0.15006)
    with pytest.raises(ValueError, match="unknown collective"):
        comm.collective_time("all_to_some", s, 4, a, b)


def test_alpha_beta_fit_recovers_a_known_link():
    sizes = [2.0**k for k in range(12, 30, 2)]
    alpha, beta = 2e-5, 5e9
    secs = [comm.collective_time("all_reduce", s, 4, alpha, beta) for s in sizes]
    fa, fb, resid = comm.fit_alpha_beta(sizes, secs, "all_reduce", 4)
    assert fa == pytest.approx(alpha, rel=1e-6) and fb == pytest.approx(beta, rel=1e-6) and resid < 1e-9


def test_adam_mixed_precision_is_16_bytes_per_parameter():
    tiny = PRESETS["tiny"]
    cm = get_cost_model("analytical")
    mem = cm.memory(Work("training", tiny, batch=1, prompt_len=8, response_len=8), Placement("A100-40GB"))
    n = tiny.params
    assert mem.weights == 2 * n and mem.grads == 2 * n and mem.optimizer == 12 * n
    assert (mem.weights + mem.grads + mem.optimizer) / n == 16
    fp32 = cm.memory(Work("training", tiny, 1, 8, 8, dtype="fp32"), Placement("A100-40GB"))
    assert (fp32.weights + fp32.grads + fp32.optimizer) / n == 4 + 4 + 8
    # TP shards all of it; inference and generation keep no gradients or optimizer state
    tp2 = cm.memory(Work("training", tiny, 1, 8, 8), Placement("A100-40GB", tp=2))
    assert tp2.optimizer == pytest.approx(6 * n)
    inf = cm.memory(Work("inference", tiny, 1, 8, 8), Placement("A100-40GB"))
    assert inf.grads == inf.optimizer == 0 and inf.offloadable == inf.weights


def test_activation_memory_recompute_and_micro_batches():
    cm = get_cost_model("analytical")
    w = Work("training", Q8, batch=64, prompt_len=512, response_len=512)
    full = cm.memory(w, Placement("H100-SXM"))
    re = cm.memory(Work("training", Q8, 64, 512, 512, recompute=True), Placement("H100-SXM"))
    # by hand: 2 B x (5 x 4096 + 2 x 4096 + 2 x 1024 + 4 x 12288) per token per layer
    per = 2 * (5 * 4096 + 2 * 4096 + 2 * 1024 + 4 * 12288)
    tokens = 16 * 1024  # the 16k-token micro-batch of 16 sequences
    logits = 2 * tokens * 151_936 * 4
    assert full.activations == pytest.approx(36 * tokens * per + logits)
    assert re.activations == pytest.approx(tokens * (36 * 4096 * 2 + per) + logits)
    assert re.activations - logits < (full.activations - logits) / 5


def test_max_concurrent_sequences_by_hand():
    cm = get_cost_model("analytical")
    w = Work("generation", Q8, batch=10_000, prompt_len=1024, response_len=1024)
    p = Placement("A100-80GB")
    free = 80e9 * 0.9 - Q8.params * 2 - memory.generation_workspace(Q8, 1)
    assert cm.max_concurrent_sequences(w, p) == int(free // (2048 * 147_456))
    # qwen3-14b on a 24 GB L4 has no room for a single sequence: generation is infeasible, not slow
    big = Work("generation", PRESETS["qwen3-14b"], 8, 512, 512)
    assert cm.max_concurrent_sequences(big, Placement("L4")) == 0
    assert math.isinf(cm.task_time(big, Placement("L4")).seconds)
    # TP=2 halves weights and KV per device, so sequences fit
    assert cm.max_concurrent_sequences(big, Placement("L4", tp=2)) > 0


def test_transfers_by_hand():
    cm = get_cost_model("analytical")
    wan = LinkSpec(alpha_s=0.01, beta_Bps=5e9 / 8)
    # weights of qwen3-8b in bf16 broadcast to 2 generators (3 ranks in the ring)
    assert cm.weight_sync_time(Q8, wan, receivers=2) == pytest.approx(2 * 0.01 + Q8.params * 2 / (5e9 / 8))
    # 64 sequences of 1024 tokens of rollouts: 17 bytes per token
    assert cm.rollout_transfer_time(64, 1024, wan) == pytest.approx(0.01 + 64 * 1024 * 17 / (5e9 / 8))
    # offload over the host bus: PCIe 4.0 / 5.0 x16 nominal (32 / 64 GB/s) at 78% for big copies
    assert cm.host_transfer_time(25e9, "A100-40GB") == pytest.approx(25e9 / (32e9 * 0.78))
    assert cm.host_transfer_time(50e9, "H100-SXM") == pytest.approx(50e9 / (64e9 * 0.78))
    # a 1 MiB copy sits at the curve's small end (half the big-copy rate): launch latency dominates
    assert cm.host_transfer_time(2 ** 20, "H100-SXM") == pytest.approx(2 ** 20 / (64e9 * 0.5))
    assert cm.host_transfer_time(0, "H100-SXM") == 0.0


def test_a_catalog_sets_a_type_host_bus_and_its_curve(tmp_path):
    from hetprof.errors import SpecError
    from hetprof.specs.catalog import load_catalog

    path = tmp_path / "catalog.yaml"
    path.write_text("gpus:\n  H100-SXM:\n    host_link_GBps: 128\n"
                    "    efficiency: {host_link: {points: [[1, 0.9]], source: measured here}}\n")
    cm = get_cost_model("analytical", catalog=load_catalog(path))
    assert cm.host_transfer_time(50e9, "H100-SXM") == pytest.approx(50e9 / (128e9 * 0.9))
    path.write_text("gpus:\n  H100-SXM:\n    host_link_GBps: -1\n")
    with pytest.raises(SpecError, match=r"gpus\.H100-SXM\.host_link_GBps") as err:
        load_catalog(path)
    assert str(path) in str(err.value)


def test_roofline_bound_and_tp_comm():
    cm = get_cost_model("analytical")
    a100 = lookup("A100-80GB")
    # a single decode step is memory bound: its time is weights + KV over achievable HBM bandwidth
    ph = Phase("decode", Q8, 36, 1, 1024, with_head=True)
    t = cm.phase_time(ph, "A100-80GB")
    hbm = a100.hbm_Bps * a100.efficiency.decode_memory(1)  # the decode curve at batch 1
    expected = phases.memory_bytes(ph) / hbm + phases.kernel_launches(ph) * 4e-6
    assert t.seconds == pytest.approx(expected) and t.source == "datasheet"
    # it reads every layer's weights, the LM head and the whole KV cache (embedding rows are a lookup)
    assert phases.memory_bytes(ph) > (36 * Q8.params_per_layer + 151_936 * 4096) * 2 + 1024 * 147_456
    # a long prefill is compute bound: 16384 rows reach A100's large-matmul ceiling, attention over
    # 2048 keys the attention curve's value there (hetprof/data/gpus.yaml)
    pf = Phase("prefill", Q8, 36, 8, 2048)
    eff = a100.efficiency
    assert cm.phase_time(pf, "A100-80GB").seconds == pytest.approx(
        phases.forward_matmul_flops(pf) / (312e12 * eff.matmul.best)
        + phases.forward_attention_flops(pf) / (312e12 * eff.attention(2048))
        + phases.kernel_launches(pf) * 4e-6)
    # inference with TP=2: two all-reduces of the hidden states per layer on the given link
    link = LinkSpec(1e-5, 1e11)
    w = Work("inference", Q8, 4, 256, 256)
    est = cm.task_time(w, Placement("A100-80GB", tp=2, tp_link=link))
    ar = comm.collective_time("all_reduce", 4 * 512 * 4096 * 2, 2, 1e-5, 1e11)
    assert est.breakdown["tp_comm"] == pytest.approx(36 * 2 * ar)
    assert est.seconds == pytest.approx(sum(est.breakdown.values()))


def test_measured_rows_replace_datasheet(db_path):
    with ProfileDB(db_path) as db:
        dev = db.add_device(DeviceInfo(name="test cpu", kind="cpu", catalog_type="cpu", host="h"))
        db.add_benchmark("compute.matmul", dev, "h", {"dtype": "bf16"}, [
            {"params": {"m": 512, "n": 512, "k": 512, "dtype": "bf16"}, "metrics": {"seconds": 1e-3, "tflops": 0.25}}
            for _ in range(3)])
        cm = get_cost_model("analytical", db=db)
    ph = Phase("prefill", PRESETS["tiny"], 2, 4, 64)
    t = cm.phase_time(ph, "cpu")
    assert cm.calibration.flops("cpu", "bf16").value == pytest.approx(0.25e12)
    assert cm.calibration.flops("cpu", "bf16").source == "measured"
    assert cm.calibration.memory_bw("cpu").source == "datasheet"
    # bound by whichever rate is slower; the note says the two rates came from different places
    assert "memory bandwidth datasheet" in t.note
    assert get_cost_model("analytical").calibration.flops("cpu", "bf16").source == "datasheet"


def test_answers_are_memoised_and_pure():
    cm = get_cost_model("analytical")
    w = Work("generation", Q8, 64, 512, 512)
    p = Placement("L40S", tp=2)
    first = cm.task_time(w, p)
    assert cm.task_time(Work("generation", Q8, 64, 512, 512), Placement("L40S", tp=2)) is first
    with pytest.raises(TypeError):
        first.breakdown["decode"] = 0.0  # shared answers cannot be changed by a caller


@pytest.mark.parametrize("kind", ["generation", "inference", "training"])
def test_every_path_runs_on_the_cpu_type(kind):
    cm = get_cost_model("analytical")
    w = Work(kind, PRESETS["tiny"], 4, 16, 16)
    for p in (Placement("cpu"), Placement("cpu", tp=2), Placement("cpu", tp=2, pp=2)):
        est = cm.task_time(w, p)
        assert 0 < est.seconds < math.inf and est.source == "datasheet"
        assert cm.memory(w, p).total > 0


def test_interleaved_pipeline_divides_the_bubble_and_multiplies_the_hops():
    # Megatron's interleaved 1F1B over v chunks a stage: bubble (pp-1)/(v*m) of a stage, v x the p2p hops
    cm = get_cost_model("analytical")
    work = Work("training", Q8, batch=8, prompt_len=0, response_len=2048)
    plain = cm.task_time(work, Placement("H100-SXM", pp=4, microbatches=8)).breakdown
    inter = cm.task_time(work, Placement("H100-SXM", pp=4, microbatches=8, virtual_stages=4)).breakdown
    stage = plain["train"] + plain["tp_comm"]
    assert plain["pp_bubble"] == pytest.approx(stage * 3 / 8)
    assert inter["pp_bubble"] == pytest.approx(stage * 3 / 32)
    assert inter["pp_comm"] == pytest.approx(4 * plain["pp_comm"])
    with pytest.raises(ValueError, match="virtual_stages"):
        Placement("H100-SXM", pp=4, virtual_stages=0)
