"""Mixture-of-experts shapes: parameter counts, FLOPs, KV bytes and all-to-all bytes against hand
computation, and the config.json reader (hetprof.specs.moe).

Published figures: Qwen3 technical report / model cards (Qwen3-30B-A3B 30.5B total, 3.3B activated,
29.9B non-embedding; Qwen3-235B-A22B 235B / 22B), DeepSeek-V3 technical report (671B total, 37B
activated, main model without the MTP module), OpenAI gpt-oss model card table 1 (gpt-oss-120b
116.83B total / 5.13B active; gpt-oss-20b 20.91B / 3.61B; OpenAI's active count leaves out the
embedding table). Qwen and DeepSeek state the figures cut to the digits shown (3.35B reads "3.3B",
37.55B reads "37B"), so a count is checked to lie in [published, published + one last digit).
"""

from __future__ import annotations

import json

import pytest

from hetprof.errors import SpecError
from hetprof.specs.models import PRESETS, from_hf_config

# ---- Qwen3-30B-A3B by hand: 48 layers, hidden 2048, 32 q heads / 4 kv heads of 128, 128 experts
# of width 768, top-8, no shared expert, vocab 151936, untied head.
Q_ATTN = 2048 * 32 * 128 + 2 * 2048 * 4 * 128 + 32 * 128 * 2048 + 2 * 128  # q, k, v, o, q/k norms
Q_EXPERT = 3 * 2048 * 768  # gate, up, down
Q_ROUTER = 128 * 2048
Q_NORMS = 2 * 2048
Q_EMBED = 151936 * 2048  # embedding; the LM head is the same size again
Q_TOTAL = 48 * (Q_ATTN + 128 * Q_EXPERT + Q_ROUTER + Q_NORMS) + 2 * Q_EMBED + 2048
Q_ACTIVE = 48 * (Q_ATTN + 8 * Q_EXPERT + Q_ROUTER + Q_NORMS) + 2 * Q_EMBED + 2048

# ---- DeepSeek-V3 by hand: 61 layers (first 3 dense FFN 18432), hidden 7168, 128 heads, MLA
# (q rank 1536, kv rank 512, qk 128 nope + 64 rope, v 128), 256 routed experts of 2048 + 1 shared,
# top-8, vocab 129280, untied head.
D_ATTN = (7168 * 1536 + 1536 + 1536 * 128 * (128 + 64)  # q down, q norm, q up
          + 7168 * (512 + 64) + 512 + 512 * 128 * (128 + 128)  # kv down (latent + rope key), kv norm, kv up
          + 128 * 128 * 7168)  # o
D_DENSE_FFN = 3 * 7168 * 18432
D_EXPERT = 3 * 7168 * 2048
D_ROUTER = 256 * 7168
D_NORMS = 2 * 7168
D_EMBED = 129280 * 7168
D_TOTAL = (3 * (D_ATTN + D_DENSE_FFN + D_NORMS) + 58 * (D_ATTN + (256 + 1) * D_EXPERT + D_ROUTER + D_NORMS)
           + 2 * D_EMBED + 7168)
D_ACTIVE = (3 * (D_ATTN + D_DENSE_FFN + D_NORMS) + 58 * (D_ATTN + (8 + 1) * D_EXPERT + D_ROUTER + D_NORMS)
            + 2 * D_EMBED + 7168)


def test_qwen3_30b_a3b_counts_by_hand():
    m = PRESETS["qwen3-30b-a3b"]
    assert Q_TOTAL == 30_532_122_624 and Q_ACTIVE == 3_353_032_704
    assert m.params == Q_TOTAL and m.active_params == Q_ACTIVE
    assert m.routed_expert_params == 48 * 128 * Q_EXPERT
    assert 30.5e9 <= m.params < 30.6e9 and 3.3e9 <= m.active_params < 3.4e9
    assert 29.9e9 <= m.params - 2 * Q_EMBED < 30.0e9  # "29.9B non-embedding"
    assert m.size_label() == "30.5B total, 3.4B active"


def test_deepseek_v3_counts_by_hand():
    m = PRESETS["deepseek-v3"]
    assert D_TOTAL == 671_026_404_352 and D_ACTIVE == 37_552_282_624
    assert m.params == D_TOTAL and m.active_params == D_ACTIVE
    assert 671e9 <= m.params < 672e9 and 37e9 <= m.active_params < 38e9
    assert m.active_params == pytest.approx(37e9, rel=0.016)


@pytest.mark.parametrize("name, total, active", [("gpt-oss-120b", 116.83e9, 5.13e9), ("gpt-oss-20b", 20.91e9, 3.61e9),
                                                 ("qwen3-235b-a22b", 235e9, 22e9)])
def test_other_presets_match_published_sizes(name, total, active):
    m = PRESETS[name]
    counted = m.active_params - (m.embedding_params if m.family == "gpt_oss" else 0)
    assert m.params == pytest.approx(total, rel=0.01) and counted == pytest.approx(active, rel=0.01)


def test_gpt_oss_layer_by_hand():
    # gpt-oss-120b: biased q/k/v/o (64 q heads, 8 kv heads of 64), a sink per head; experts of
    # width 2880 with gate_up and down biases; a biased router.
    m = PRESETS["gpt-oss-120b"]
    attn = 2880 * 4096 + 4096 + 2 * (2880 * 512 + 512) + 4096 * 2880 + 2880 + 64
    expert = 2880 * 2 * 2880 + 2 * 2880 + 2880 * 2880 + 2880
    assert m.attn_params_per_layer == attn and m.expert_params == expert
    assert m.router_params == 128 * 2880 + 128


def test_flops_count_the_active_weights():
    m = PRESETS["qwen3-30b-a3b"]
    # matmuls per layer: attention projections (no norms), router, 8 experts
    per_layer = 2 * (Q_ATTN - 2 * 128 + Q_ROUTER + 8 * Q_EXPERT)
    assert m.matmul_flops_per_token_per_layer() == per_layer
    assert m.forward_flops_per_token() == 48 * per_layer + 2 * 151936 * 2048
    assert m.router_flops_per_token() == 48 * 2 * 128 * 2048
    assert m.training_flops(2, 64) == pytest.approx(3 * m.forward_flops(2, 64))
    d = PRESETS["deepseek-v3"]  # mean over 3 dense-FFN and 58 MoE layers; attention minus its 2 norms
    mean_ffn = (3 * D_DENSE_FFN + 58 * (D_ROUTER + 9 * D_EXPERT)) / 61
    assert d.matmul_flops_per_token_per_layer() == pytest.approx(2 * (D_ATTN - 1536 - 512 + mean_ffn), rel=1e-12)
    # MLA attention: scores over 192 q/k dims, values over 128, per head and key
    assert d.attention_flops_per_token_per_layer(1000) == 2 * 128 * (192 + 128) * 1000


def test_params_per_layer_is_the_mean_layer():
    d = PRESETS["deepseek-v3"]
    assert d.layers * d.params_per_layer + 2 * D_EMBED + 7168 == pytest.approx(D_TOTAL, rel=1e-12)
    assert d.routed_expert_params_per_layer == 58 * 256 * D_EXPERT / 61


def test_mla_caches_the_latent_and_rope_key():
    d = PRESETS["deepseek-v3"]
    assert d.kv_bytes_per_token("bf16") == 61 * (512 + 64) * 2 == 70_272
    # grouped-query attention caches K and V of every kv head: Qwen3-30B-A3B 48 × 2 × 4 × 128 × 2
    assert PRESETS["qwen3-30b-a3b"].kv_bytes_per_token("bf16") == 48 * 2 * 4 * 128 * 2


def test_alltoall_bytes_per_layer():
    m = PRESETS["qwen3-30b-a3b"]
    # hidden 2048 × bf16 × top-8 × (EP−1)/EP leave the rank each way
    assert m.dispatch_bytes_per_token_layer(4) == 2048 * 2 * 8 * 3 / 4 == 24576
    assert m.dispatch_bytes_per_token_layer(1) == 0
    assert m.alltoall_bytes_per_token(8) == 2 * 48 * 2048 * 2 * 8 * 7 / 8
    assert PRESETS["deepseek-v3"].alltoall_bytes_per_token(2) == 2 * 58 * 7168 * 2 * 8 / 2
    assert PRESETS["qwen3-8b"].alltoall_bytes_per_token(8) == 0


def _write(tmp_path, cfg):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


QWEN3_MOE_CONFIG = {  # Qwen/Qwen3-30B-A3B config.json, the fields hetprof reads
    "model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 48,
    "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
    "max_position_embeddings": 40960, "tie_word_embeddings": False, "num_experts": 128, "num_experts_per_tok": 8,
    "moe_intermediate_size": 768, "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
}
DEEPSEEK_V3_CONFIG = {  # deepseek-ai/DeepSeek-V3 config.json, the fields hetprof reads
    "model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432, "num_hidden_layers": 61,
    "num_attention_heads": 128, "num_key_value_heads": 128, "vocab_size": 129280, "max_position_embeddings": 163840,
    "tie_word_embeddings": False, "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
    "moe_intermediate_size": 2048, "first_k_dense_replace": 3, "moe_layer_freq": 1, "norm_topk_prob": True,
    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
}
GPT_OSS_CONFIG = {  # openai/gpt-oss-120b config.json, the fields hetprof reads
    "model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880, "num_hidden_layers": 36,
    "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 201088,
    "max_position_embeddings": 131072, "tie_word_embeddings": False, "num_local_experts": 128,
    "num_experts_per_tok": 4, "attention_bias": True,
}


@pytest.mark.parametrize("cfg, preset", [(QWEN3_MOE_CONFIG, "qwen3-30b-a3b"), (DEEPSEEK_V3_CONFIG, "deepseek-v3"),
                                         (GPT_OSS_CONFIG, "gpt-oss-120b")])
def test_config_json_reads_to_the_preset(tmp_path, cfg, preset):
    m = from_hf_config(_write(tmp_path, cfg))
    p = PRESETS[preset]
    assert (m.params, m.active_params, m.kv_bytes_per_token(), m.family) == (
        p.params, p.active_params, p.kv_bytes_per_token(), p.family)


def test_qwen3_moe_dense_layers_follow_the_sparse_step(tmp_path):
    # Qwen3MoeDecoderLayer: MoE when not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0
    cfg = {**QWEN3_MOE_CONFIG, "num_hidden_layers": 6, "decoder_sparse_step": 2, "mlp_only_layers": [5]}
    m = from_hf_config(_write(tmp_path, cfg))
    assert m.moe.dense_layers == (0, 2, 4, 5) and m.moe_layers == 2
    assert m.params == (6 * (Q_ATTN + Q_NORMS) + 4 * 3 * 2048 * 6144 + 2 * (128 * Q_EXPERT + Q_ROUTER)
                        + 2 * Q_EMBED + 2048)


def test_qwen3_moe_shape_round_trips_through_hf_config(tmp_path):
    m = PRESETS["qwen3-30b-a3b"]
    back = from_hf_config(_write(tmp_path, m.to_hf_config()))
    assert (back.params, back.active_params, back.moe) == (m.params, m.active_params, m.moe)


@pytest.mark.parametrize("cfg, field", [(QWEN3_MOE_CONFIG, "num_experts"), (QWEN3_MOE_CONFIG, "moe_intermediate_size"),
                                        (DEEPSEEK_V3_CONFIG, "n_routed_experts"), (DEEPSEEK_V3_CONFIG, "kv_lora_rank"),
                                        (DEEPSEEK_V3_CONFIG, "first_k_dense_replace"),
                                        (GPT_OSS_CONFIG, "num_experts_per_tok")])
def test_missing_moe_field_is_refused_in_one_line(tmp_path, cfg, field):
    path = _write(tmp_path, {k: v for k, v in cfg.items() if k != field})
    with pytest.raises(SpecError) as err:
        from_hf_config(path)
    message = str(err.value)
    assert "\n" not in message and field in message and str(path) in message


def test_dense_models_have_no_experts():
    m = PRESETS["qwen3-8b"]
    assert m.active_params == m.params and m.routed_expert_params == 0 and m.router_flops_per_token() == 0
    assert m.size_label() == "8.2B"
    with pytest.raises(ValueError, match="deepseek_v3"):
        PRESETS["deepseek-v3"].to_hf_config()


# Small configs of each family, built by transformers' own model classes: the parameter count
# hetprof reads from the config.json equals the model's, exactly (dense layers, shared experts,
# MLA ranks, biases and sinks included).
TINY_CONFIGS = [
    {**QWEN3_MOE_CONFIG, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
     "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 64, "num_experts": 8, "num_experts_per_tok": 2,
     "moe_intermediate_size": 32, "decoder_sparse_step": 2, "mlp_only_layers": [3], "max_position_embeddings": 512},
    {**DEEPSEEK_V3_CONFIG, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
     "num_key_value_heads": 4, "vocab_size": 64, "n_routed_experts": 8, "n_shared_experts": 2, "num_experts_per_tok": 2,
     "moe_intermediate_size": 32, "first_k_dense_replace": 1, "q_lora_rank": 24, "kv_lora_rank": 16,
     "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8, "n_group": 2, "topk_group": 1,
     "max_position_embeddings": 512},
    {**GPT_OSS_CONFIG, "hidden_size": 64, "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
     "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 64, "num_local_experts": 8, "num_experts_per_tok": 2,
     "max_position_embeddings": 512, "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 1.0,
                                                         "beta_fast": 32.0, "beta_slow": 1.0,
                                                         "original_max_position_embeddings": 512}},
]


@pytest.mark.parametrize("cfg", TINY_CONFIGS, ids=lambda c: c["model_type"])
def test_counts_equal_the_transformers_model(tmp_path, cfg):
    transformers = pytest.importorskip("transformers")
    shape = from_hf_config(_write(tmp_path, cfg))
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**cfg))
    assert shape.params == sum(p.numel() for p in model.parameters())


def test_tiny_moe_preset_builds_in_transformers():
    transformers = pytest.importorskip("transformers")
    m = PRESETS["tiny-moe"]
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**m.to_hf_config()))
    assert m.params == sum(p.numel() for p in model.parameters()) and m.vocab == PRESETS["tiny"].vocab
