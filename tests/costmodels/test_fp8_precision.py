"""FP8 per task: the workload's precision forms, what each FP8 recipe holds and computes at (by hand),
and the refusals: a GPU type without FP8 units, and `hetprof run`, which has no FP8 kernels."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from hetprof.costmodels import get_cost_model, memory
from hetprof.costmodels.calibration import Calibration
from hetprof.errors import ExecutionError, SpecError
from hetprof.executor.launch.checks import check_supported
from hetprof.executor.launch.handwritten_plan import handwritten_plan
from hetprof.planner.simulator import Simulator
from hetprof.specs import ClusterSpec, WorkloadSpec
from hetprof.specs.catalog import builtin
from hetprof.specs.executable import workload_problems
from hetprof.specs.models import resolve_model
from hetprof.specs.precision import FP8_WEIGHT_COPIES
from hetprof.specs.vocabulary import TaskKind

ROOT = Path(__file__).resolve().parents[2]
FP8_BOTH = {"generation": "fp8", "training": "fp8"}


def _workload(precision, actor: str = "qwen3-8b") -> WorkloadSpec:
    return WorkloadSpec.from_dict({
        "name": "w", "algorithm": "grpo", "models": {"actor": actor}, "prompts_per_step": 8,
        "responses_per_prompt": 4, "prompt_len": {"mean": 256}, "response_len": {"mean": 512},
        "precision": precision}, file="w.yaml")


def test_precision_reads_as_one_value_or_one_per_task_kind():
    scalar = _workload("bf16")
    assert [scalar.dtype_of(k) for k in TaskKind] == ["bf16"] * 3 and scalar.weights_dtype == "bf16"
    both = _workload(FP8_BOTH)
    assert [both.dtype_of(k) for k in TaskKind] == ["fp8", "fp8", "fp8"]  # inference follows training
    assert both.weights_dtype == "bf16"  # what the trainer keeps and a weight sync sends
    gen = _workload({"generation": "fp8"})
    assert [gen.dtype_of(k) for k in TaskKind] == ["fp8", "bf16", "bf16"]
    assert _workload(both.to_dict()["precision"]).precision == both.precision  # round trip
    with pytest.raises(SpecError) as err:
        _workload({"generation": "fp9"})
    assert err.value.field == "precision.generation" and err.value.file == "w.yaml"
    with pytest.raises(SpecError) as err:
        _workload({"rollout": "fp8"})
    assert err.value.field == "precision.rollout"


def test_fp8_generation_holds_one_byte_linear_weights_and_kv_by_hand():
    m = resolve_model("qwen3-8b")
    layers, tp = m.layers, 2
    params = memory.params_on_device(m, layers, tp)
    edges = (m.embedding_params + m.lm_head_params + m.hidden) / tp  # embedding and LM head stay bf16
    fp8 = memory.task_memory(TaskKind.GENERATION, m, layers, tp, 16, 768, "fp8", False, 16)
    bf16 = memory.task_memory(TaskKind.GENERATION, m, layers, tp, 16, 768, "bf16", False, 16)
    assert fp8.weights == pytest.approx((params - edges) * 1 + edges * 2)
    kv_per_token = 2 * layers * math.ceil(m.kv_heads / tp) * m.head_dim * 1
    assert fp8.kv_cache == pytest.approx(16 * 768 * kv_per_token) and bf16.kv_cache == pytest.approx(2 * fp8.kv_cache)
    assert fp8.activations == bf16.activations  # the workspace stays bf16
    # so more sequences fit next to the weights
    cap = builtin().lookup("H100").memory_bytes
    assert (memory.max_concurrent_sequences(m, layers, tp, 768, "fp8", cap)
            > 2 * memory.max_concurrent_sequences(m, layers, tp, 768, "bf16", cap))


def test_fp8_training_holds_bf16_weights_their_fp8_copies_and_partly_fp8_activations_by_hand():
    m = resolve_model("qwen3-8b")
    layers, tp, batch, seq = m.layers, 1, 4, 1024
    params = memory.params_on_device(m, layers, tp)
    edges = m.embedding_params + m.lm_head_params + m.hidden
    est = memory.task_memory(TaskKind.TRAINING, m, layers, tp, batch, seq, "fp8", False, 0)
    ref = memory.task_memory(TaskKind.TRAINING, m, layers, tp, batch, seq, "bf16", False, 0)
    assert FP8_WEIGHT_COPIES == 2
    assert est.weights == pytest.approx((params - edges) * (2 + 2 * 1) + edges * 2)
    assert (est.grads, est.optimizer) == (ref.grads, ref.optimizer) == (params * 2, params * 12)
    h, q, kv, f = m.hidden, m.heads * m.head_dim, m.kv_heads * m.head_dim, m.ffn
    per_layer = 2 * (5 * h + 2 * q + 2 * kv + 4 * f) - 1 * (2 * h + q + f)  # Linear inputs saved in FP8
    assert memory.activation_bytes_per_token_layer(m, tp, "fp8") == pytest.approx(per_layer)
    tokens = memory.micro_batch(batch, seq) * seq
    logits = tokens * m.vocab * 4
    assert est.activations == pytest.approx(tokens * layers * per_layer + 2 * logits)


def test_fp8_matmuls_run_at_the_fp8_peak_and_attention_at_bf16():
    cal = Calibration()
    h100 = builtin().lookup("H100-SXM")
    for rows in (256, 1024, 8192):
        assert cal.compute_rate("H100", "fp8", "matmul", rows).value == pytest.approx(
            1979e12 * h100.efficiency.matmul_fp8(rows))
    assert cal.compute_rate("H100", "fp8", "attention", 4096).value == cal.compute_rate(
        "H100", "bf16", "attention", 4096).value
    # a prefill of the same shape is faster in FP8, not twice as fast: attention and memory do not move
    from hetprof.costmodels.data import Phase
    m = resolve_model("qwen3-8b")
    cm = get_cost_model("analytical")
    fast = cm.phase_time(Phase("prefill", m, m.layers, 16, 2048, dtype="fp8"), "H100").seconds
    slow = cm.phase_time(Phase("prefill", m, m.layers, 16, 2048, dtype="bf16"), "H100").seconds
    assert slow / 2 < fast < slow


def _cluster(*types: str) -> ClusterSpec:
    return ClusterSpec.from_dict({"name": "c", "hosts": [{"name": t.lower(), "gpus": {"type": t, "count": 8}}
                                                         for t in types]})


def test_fp8_on_a_cluster_without_fp8_units_is_refused_naming_the_catalog_field():
    with pytest.raises(SpecError) as err:
        Simulator(_cluster("A100-40GB"), _workload({"training": "fp8"}), get_cost_model("analytical"))
    assert err.value.field == "gpus.A100-40GB.fp8_tflops" and "training" in err.value.expected
    with pytest.raises(KeyError, match=r"gpus\.A100-40GB\.fp8_tflops"):
        Calibration().compute_rate("A100-40GB", "fp8", "matmul", 1024)


def test_on_a_mixed_cluster_an_fp8_task_is_refused_on_the_type_without_fp8_and_priced_on_the_other():
    sim = Simulator(_cluster("A100-40GB", "H100"), _workload(FP8_BOTH), get_cost_model("analytical"))
    on_a100 = sim.costs.replica("actor_gen", ["a100-40gb:0"], 1, 1, 32)
    assert on_a100.seconds == math.inf and "gpus.A100-40GB.fp8_tflops" in on_a100.note
    on_h100 = sim.costs.replica("actor_gen", ["h100:0"], 1, 1, 32)
    assert math.isfinite(on_h100.seconds) and not on_h100.note
    bf16 = Simulator(_cluster("A100-40GB", "H100"), _workload("bf16"), get_cost_model("analytical"))
    assert on_h100.seconds < bf16.costs.replica("actor_gen", ["h100:0"], 1, 1, 32).seconds


def test_hetprof_run_refuses_an_fp8_plan_in_one_line_and_never_runs_it_in_bf16():
    cluster = ClusterSpec.load(ROOT / "examples" / "clusters" / "cpu-local.yaml")
    wl = WorkloadSpec.load(ROOT / "examples" / "workloads" / "grpo-tiny.yaml").to_dict()
    plan = handwritten_plan(cluster, {**wl, "precision": {"generation": "fp8"}},
                            {"actor_gen": ["localhost:0"], "ref_infer": ["localhost:1"], "actor_train": ["localhost:1"]})
    with pytest.raises(ExecutionError) as err:
        check_supported(plan, cuda_available=False)
    text = str(err.value)
    assert "\n" not in text and text.startswith("precision.generation fp8") and "bf16" in text
    scalar = handwritten_plan(cluster, {**wl, "precision": "fp8"},
                              {"actor_gen": ["localhost:0"], "ref_infer": ["localhost:1"], "actor_train": ["localhost:1"]})
    with pytest.raises(ExecutionError, match=r"^precision fp8 \(generation, inference, training\)"):
        check_supported(scalar, cuda_available=False)
    # one engine precision serves generation and inference: two are refused too, bf16 everywhere is not
    assert workload_problems(_workload({"generation": "fp16", "training": "bf16"}))
    assert not workload_problems(_workload("bf16"))
