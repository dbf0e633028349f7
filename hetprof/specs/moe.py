"""Mixture-of-experts and latent-attention shapes, read from a Hugging Face config.json.

An MoE layer replaces the dense SwiGLU FFN with `experts` routed SwiGLU experts of width
`expert_ffn` (a token goes to `top_k` of them, chosen by a linear router of experts × hidden) plus
`shared_experts` experts every token goes through. Some layers keep a dense FFN (DeepSeek's first
k layers, Qwen's `mlp_only_layers`). MLA (DeepSeek-V2/V3) projects queries and keys/values through
low ranks and caches only the compressed latent and the rope key.

Field names and layer rules follow transformers' configuration and modeling files (v5.x):
- qwen3_moe: Qwen3MoeConfig / Qwen3MoeDecoderLayer — a layer is MoE when it is not in
  `mlp_only_layers` and (index + 1) % `decoder_sparse_step` == 0; no shared experts.
- deepseek_v3: DeepseekV3Config / DeepseekV3DecoderLayer — layers ≥ `first_k_dense_replace` are MoE
  (and, in DeepSeek's own modeling_deepseek.py, index % `moe_layer_freq` == 0); one shared MLP of
  width moe_intermediate_size × n_shared_experts; MLA attention (DeepseekV3Attention).
- gpt_oss: GptOssConfig / GptOssExperts, GptOssTopKRouter, GptOssAttention — every layer MoE,
  biases on q/k/v/o, on the experts and on the router, one attention sink per head.
A config of these model types that lacks a field the count needs is refused (SpecError) rather
than defaulted: a silently wrong expert count misprices every plan.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from hetprof.errors import SpecError


@dataclasses.dataclass(frozen=True)
class MoeShape:
    experts: int  # routed experts per MoE layer
    top_k: int  # routed experts each token goes to
    expert_ffn: int  # SwiGLU width of one expert
    shared_experts: int = 0  # experts (of width expert_ffn) every token goes through
    dense_layers: tuple[int, ...] = ()  # indices of the layers that keep a dense FFN
    norm_topk_prob: bool = False  # top-k weights renormalised to sum to 1 (no cost; kept for export)

    def moe_layers(self, layers: int) -> int:
        return layers - len(self.dense_layers)


@dataclasses.dataclass(frozen=True)
class MlaShape:
    q_lora_rank: int | None  # None: queries use one full-rank projection
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def cached_per_layer(self) -> int:
        """Numbers one token caches per layer: the compressed KV latent and the shared rope key."""
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclasses.dataclass(frozen=True)
class Architecture:
    """What an MoE family adds to a decoder's shapes (the dense reader fills in the rest)."""

    family: str
    moe: MoeShape
    mla: MlaShape | None = None
    biases: bool = False  # GPT-OSS: linear biases (attention, experts, router) and attention sinks
    head_dim: int | None = None  # overrides the dense reader's head_dim (MLA: the q/k head)
    kv_heads: int | None = None


def _int(cfg: dict, key: str, path: Path) -> int:
    value = cfg.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise SpecError(str(path), key, f"an integer (required for a {cfg.get('model_type')} model)", value)
    return value


def _opt_int(cfg: dict, key: str, path: Path, default: int) -> int:
    return default if cfg.get(key) is None else _int(cfg, key, path)


def _qwen3_moe(cfg: dict, path: Path) -> Architecture:
    layers = _int(cfg, "num_hidden_layers", path)
    step = _opt_int(cfg, "decoder_sparse_step", path, 1)
    only_mlp = set(cfg.get("mlp_only_layers") or [])
    dense = tuple(i for i in range(layers) if i in only_mlp or (i + 1) % step != 0)
    moe = MoeShape(experts=_int(cfg, "num_experts", path), top_k=_int(cfg, "num_experts_per_tok", path),
                   expert_ffn=_int(cfg, "moe_intermediate_size", path), dense_layers=dense,
                   norm_topk_prob=bool(cfg.get("norm_topk_prob", False)))
    return Architecture("qwen3_moe", moe)


def _deepseek_v3(cfg: dict, path: Path) -> Architecture:
    layers = _int(cfg, "num_hidden_layers", path)
    first_dense = _int(cfg, "first_k_dense_replace", path)
    freq = _opt_int(cfg, "moe_layer_freq", path, 1)
    dense = tuple(i for i in range(layers) if i < first_dense or i % freq != 0)
    moe = MoeShape(experts=_int(cfg, "n_routed_experts", path), top_k=_int(cfg, "num_experts_per_tok", path),
                   expert_ffn=_int(cfg, "moe_intermediate_size", path),
                   shared_experts=_int(cfg, "n_shared_experts", path), dense_layers=dense,
                   norm_topk_prob=bool(cfg.get("norm_topk_prob", False)))
    q_rank = cfg.get("q_lora_rank")
    mla = MlaShape(q_lora_rank=None if q_rank is None else _int(cfg, "q_lora_rank", path),
                   kv_lora_rank=_int(cfg, "kv_lora_rank", path),
                   qk_nope_head_dim=_int(cfg, "qk_nope_head_dim", path),
                   qk_rope_head_dim=_int(cfg, "qk_rope_head_dim", path), v_head_dim=_int(cfg, "v_head_dim", path))
    return Architecture("deepseek_v3", moe, mla, head_dim=mla.qk_head_dim,
                        kv_heads=_opt_int(cfg, "num_key_value_heads", path, _int(cfg, "num_attention_heads", path)))


def _gpt_oss(cfg: dict, path: Path) -> Architecture:
    experts_key = "num_local_experts" if "num_local_experts" in cfg else "num_experts"
    moe = MoeShape(experts=_int(cfg, experts_key, path), top_k=_int(cfg, "num_experts_per_tok", path),
                   expert_ffn=_int(cfg, "intermediate_size", path), norm_topk_prob=True)
    return Architecture("gpt_oss", moe, biases=bool(cfg.get("attention_bias", True)))


# model_type -> reader of the MoE fields (registry: a new family is one entry, no branches).
READERS: dict[str, Callable[[dict, Path], Architecture]] = {
    "qwen3_moe": _qwen3_moe, "deepseek_v3": _deepseek_v3, "gpt_oss": _gpt_oss,
}


def read_architecture(cfg: dict, path: Path) -> Architecture | None:
    """The MoE part of a config.json, or None for a dense model type."""
    reader = READERS.get(str(cfg.get("model_type", "")))
    return None if reader is None else reader(cfg, path)
