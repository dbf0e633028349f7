"""Expert-parallel memory (hetprof.costmodels.memory) against hand computation, and dense models
unchanged by the new arguments."""

from __future__ import annotations

import pytest

from hetprof.costmodels.memory import (
    expert_replicas,
    kv_bytes_per_token,
    max_concurrent_sequences,
    params_on_device,
    task_memory,
)
from hetprof.specs.models import PRESETS
from hetprof.specs.vocabulary import TaskKind

QWEN = PRESETS["qwen3-30b-a3b"]
# Qwen3-30B-A3B by hand (tests/specs/test_moe_models.py spells the layer out)
ATTN = 2048 * 32 * 128 + 2 * 2048 * 4 * 128 + 32 * 128 * 2048 + 2 * 128
ROUTER, NORMS, EMBED = 128 * 2048, 2 * 2048, 151936 * 2048
EXPERTS = 48 * 128 * 3 * 2048 * 768  # every routed expert: what EP splits
SHARED = 48 * (ATTN + ROUTER + NORMS) + 2 * EMBED + 2048  # attention, router, norms, embedding, head


def test_experts_split_over_ep_the_rest_over_tp():
    assert params_on_device(QWEN, 48, 1) == pytest.approx(SHARED + EXPERTS, rel=1e-12)
    assert params_on_device(QWEN, 48, 1, ep=4) == pytest.approx(SHARED + EXPERTS / 4, rel=1e-12)
    # expert TP defaults to TP (Megatron-core): TP2 × EP4 splits each expert's share in two more
    assert params_on_device(QWEN, 48, 2, ep=4) == pytest.approx(SHARED / 2 + EXPERTS / 8, rel=1e-12)
    # vLLM-style EP keeps experts whole (etp 1) while attention shards over TP
    assert params_on_device(QWEN, 48, 2, ep=4, etp=1) == pytest.approx(SHARED / 2 + EXPERTS / 4, rel=1e-12)


def test_training_state_with_ep_and_zero():
    common = dict(kind=TaskKind.TRAINING, model=QWEN, layers=48, tp=1, batch=4, seq_len=1024, dtype="bf16",
                  recompute=True, concurrent=0, dp=8, ep=4)
    plain = task_memory(**common)
    on_device = SHARED + EXPERTS / 4
    assert plain.weights == pytest.approx(2 * on_device, rel=1e-12)
    assert plain.grads == pytest.approx(2 * on_device, rel=1e-12)
    assert plain.optimizer == pytest.approx(12 * on_device, rel=1e-12)
    # ZeRO-2 over 8 replicas: dense state over 8, expert state over its 8 / 4 = 2 expert replicas
    assert expert_replicas(8, 1, 4) == 2
    zero2 = task_memory(**common, sharding="zero2")
    assert zero2.weights == plain.weights
    assert zero2.grads == pytest.approx(2 * (SHARED / 8 + EXPERTS / 4 / 2), rel=1e-12)
    assert zero2.optimizer == pytest.approx(12 * (SHARED / 8 + EXPERTS / 4 / 2), rel=1e-12)
    fsdp = task_memory(**common, sharding="fsdp")
    assert fsdp.weights == pytest.approx(2 * (SHARED / 8 + EXPERTS / 8), rel=1e-12)


def test_ep_lets_more_sequences_fit():
    args = (QWEN, 48, 1, 4096, "bf16", 80e9)
    assert max_concurrent_sequences(*args, ep=8) > max_concurrent_sequences(*args)


def test_mla_kv_cache_is_not_split_by_tp():
    d = PRESETS["deepseek-v3"]
    assert kv_bytes_per_token(d, 61, 8) == kv_bytes_per_token(d, 61, 1) == 61 * 576 * 2


@pytest.mark.parametrize("sharding", ["none", "zero2", "fsdp"])
def test_dense_models_ignore_ep(sharding):
    m = PRESETS["qwen3-8b"]
    args = dict(kind=TaskKind.TRAINING, model=m, layers=36, tp=2, batch=4, seq_len=1024, dtype="bf16",
                recompute=False, concurrent=0, dp=4, sharding=sharding)
    assert task_memory(**args) == task_memory(**args, ep=4)
    assert params_on_device(m, 36, 2) == (36 * m.params_per_layer + 2 * m.embedding_params + m.hidden) / 2


def test_phase_prices_active_matmuls_and_mla_attention():
    from hetprof.costmodels import phases
    from hetprof.costmodels.data import Phase

    d = PRESETS["deepseek-v3"]
    decode = Phase("decode", d, layers=61, batch=4, tokens=1000, tp=2)
    # decode: 4 sequences × 1000 cached keys, 2·128 heads·(192 + 128) per pair, over 2 ranks
    assert phases.forward_attention_flops(decode) == 61 * 2 * 128 * (192 + 128) * 4 * 1000 / 2
    assert phases.forward_matmul_flops(decode) == pytest.approx(61 * 4 * d.matmul_flops_per_token_per_layer() / 2)
    q = PRESETS["qwen3-8b"]  # dense: 4·heads·head_dim per pair, as before
    assert phases.forward_attention_flops(Phase("decode", q, 36, 4, 1000)) == 36 * 4.0 * 32 * 128 * 4000
