"""Transformer shapes and the numbers every stage derives from them.

A ModelShape is the few integers that decide cost: parameters, FLOPs per token, KV-cache bytes
per token. Presets come from the published configs of Qwen3, Llama-3 and the mixture-of-experts
Qwen3-MoE, DeepSeek-V3 and GPT-OSS (plus tiny shapes for tests); any local Hugging Face
`config.json` works too. Nothing is downloaded.

Mixture of experts (hetprof.specs.moe): `params` counts every expert, `active_params` what one
token goes through; the per-layer figures the cost models scale by layer count
(`params_per_layer`, `matmul_flops_per_token_per_layer`) are means over the layers, since MoE and
dense-FFN layers differ. A dense model (moe None) computes exactly what it always did.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from hetprof.errors import SpecError
from hetprof.safety.safefiles import NotReadable, read_bounded
from hetprof.specs.moe import MlaShape, MoeShape, read_architecture

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


@dataclasses.dataclass(frozen=True)
class ModelShape:
    name: str
    family: str  # "qwen3" | "llama" (decides the HF architecture the executor builds)
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tie_embeddings: bool
    max_position: int = 40960
    qk_norm: bool = False
    moe: MoeShape | None = None  # routed experts (None: every layer has the dense FFN)
    mla: MlaShape | None = None  # multi-head latent attention (None: grouped-query attention)
    biases: bool = False  # linear biases and attention sinks (GPT-OSS)

    # ---- parameters -------------------------------------------------------------------------
    @property
    def attn_matmul_params_per_layer(self) -> int:
        """Weights of the attention's projections (what its matmuls multiply by)."""
        if self.mla is not None:
            m = self.mla
            q = (self.hidden * self.heads * m.qk_head_dim if m.q_lora_rank is None
                 else self.hidden * m.q_lora_rank + m.q_lora_rank * self.heads * m.qk_head_dim)
            kv = (self.hidden * (m.kv_lora_rank + m.qk_rope_head_dim)
                  + m.kv_lora_rank * self.heads * (m.qk_nope_head_dim + m.v_head_dim))
            return q + kv + self.heads * m.v_head_dim * self.hidden
        q = self.hidden * self.heads * self.head_dim
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        o = self.heads * self.head_dim * self.hidden
        return q + kv + o

    @property
    def attn_params_per_layer(self) -> int:
        norms = 2 * self.head_dim if self.qk_norm else 0
        if self.mla is not None:  # RMSNorms on the q and kv latents
            norms = (self.mla.q_lora_rank or 0) + self.mla.kv_lora_rank
        if self.biases:  # q, k, v, o biases and one sink logit per head
            norms += (self.heads + 2 * self.kv_heads) * self.head_dim + self.hidden + self.heads
        return self.attn_matmul_params_per_layer + norms

    @property
    def mlp_params_per_layer(self) -> int:
        """A dense FFN layer's weights."""
        return 3 * self.hidden * self.ffn  # SwiGLU: gate, up, down

    # An MoE layer's FFN: routed experts, shared experts, router (0 for a dense model).
    @property
    def expert_params(self) -> int:
        """One expert's weights (SwiGLU of width expert_ffn; GPT-OSS adds gate/up and down biases)."""
        if self.moe is None:
            return 0
        bias = 2 * self.moe.expert_ffn + self.hidden if self.biases else 0
        return 3 * self.hidden * self.moe.expert_ffn + bias

    @property
    def router_params(self) -> int:
        if self.moe is None:
            return 0
        return self.moe.experts * self.hidden + (self.moe.experts if self.biases else 0)

    @property
    def moe_layers(self) -> int:
        return 0 if self.moe is None else self.moe.moe_layers(self.layers)

    @property
    def routed_expert_params(self) -> int:
        """Weights of every routed expert of the model (what expert parallelism shards)."""
        return 0 if self.moe is None else self.moe_layers * self.moe.experts * self.expert_params

    def _ffn_layer_params(self, routed: int) -> int:
        """Sum over layers of the FFN weights, with `routed` experts counted in each MoE layer."""
        if self.moe is None:
            return self.layers * self.mlp_params_per_layer
        dense = len(self.moe.dense_layers) * self.mlp_params_per_layer
        per_moe = (routed + self.moe.shared_experts) * self.expert_params + self.router_params
        return dense + self.moe_layers * per_moe

    @property
    def params_per_layer(self) -> int | float:
        """A layer's weights; for MoE the mean over the layers (dense-FFN and MoE layers differ)."""
        if self.moe is None:
            return self.attn_params_per_layer + self.mlp_params_per_layer + 2 * self.hidden
        total = self._ffn_layer_params(self.moe.experts) + self.layers * (self.attn_params_per_layer + 2 * self.hidden)
        return total / self.layers

    @property
    def routed_expert_params_per_layer(self) -> float:
        """Mean routed-expert weights per layer (the part of params_per_layer that EP shards)."""
        return self.routed_expert_params / self.layers

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def lm_head_params(self) -> int:
        return 0 if self.tie_embeddings else self.vocab * self.hidden

    @property
    def params(self) -> int:
        return (self.layers * self.params_per_layer + self.embedding_params + self.lm_head_params
                + self.hidden) if self.moe is None else self.active_params + self._inactive_params

    @property
    def _inactive_params(self) -> int:
        return 0 if self.moe is None else self.moe_layers * (self.moe.experts - self.moe.top_k) * self.expert_params

    @property
    def active_params(self) -> int:
        """Parameters one token goes through: all but the routed experts it is not sent to. The
        embedding table counts whole, as Qwen and DeepSeek count (OpenAI's GPT-OSS figure leaves
        it out: subtract `embedding_params`)."""
        if self.moe is None:
            return self.params
        layers = self._ffn_layer_params(self.moe.top_k) + self.layers * (self.attn_params_per_layer + 2 * self.hidden)
        return layers + self.embedding_params + self.lm_head_params + self.hidden

    def size_label(self) -> str:
        """Parameters for reports: '8.2B' dense, '30.5B total, 3.4B active' for MoE (one decimal, rounded)."""
        if self.moe is None:
            return f"{self.params / 1e9:.1f}B"
        return f"{self.params / 1e9:.1f}B total, {self.active_params / 1e9:.1f}B active"

    # ---- compute ----------------------------------------------------------------------------
    def matmul_flops_per_token_per_layer(self) -> float:
        """Forward FLOPs of one token through one layer's weight matmuls (2 per MAC); for MoE the
        mean over layers of the active weights: the router, top-k routed and the shared experts."""
        if self.moe is None:
            return 2.0 * (self.attn_params_per_layer - (2 * self.head_dim if self.qk_norm else 0)
                          + self.mlp_params_per_layer)
        e = self.moe
        routed = 3 * self.hidden * e.expert_ffn * (e.top_k + e.shared_experts)  # biases are adds, not MACs
        ffn = len(e.dense_layers) * self.mlp_params_per_layer + self.moe_layers * (routed + e.experts * self.hidden)
        return 2.0 * (self.attn_matmul_params_per_layer + ffn / self.layers)

    def router_flops_per_token(self) -> float:
        """Forward FLOPs of every MoE layer's router for one token (experts × hidden logits)."""
        return 0.0 if self.moe is None else 2.0 * self.moe_layers * self.moe.experts * self.hidden

    def attention_flops_per_token_per_layer(self, context: float) -> float:
        """Forward FLOPs of QK^T and AV for one query token attending to `context` tokens (MLA: the
        scores over qk_nope + qk_rope dimensions, the values over v_head_dim, per head)."""
        if self.mla is not None:
            return 2.0 * self.heads * (self.mla.qk_head_dim + self.mla.v_head_dim) * context
        return 4.0 * self.heads * self.head_dim * context

    def forward_flops_per_token(self, context: float = 0.0, include_lm_head: bool = True) -> float:
        """Forward FLOPs for one token whose attention spans `context` tokens (all layers)."""
        per_layer = self.matmul_flops_per_token_per_layer() + self.attention_flops_per_token_per_layer(context)
        head = 2.0 * self.vocab * self.hidden if include_lm_head else 0.0
        return self.layers * per_layer + head

    def forward_flops(self, batch: int, seq_len: int) -> float:
        """Forward FLOPs of a full causal pass over batch × seq_len tokens (mean context seq/2)."""
        return batch * seq_len * self.forward_flops_per_token(context=seq_len / 2)

    def training_flops(self, batch: int, seq_len: int, recompute: bool = False) -> float:
        """Forward + backward (2× forward), plus one more forward with activation recomputation."""
        return (4.0 if recompute else 3.0) * self.forward_flops(batch, seq_len)

    # ---- memory -----------------------------------------------------------------------------
    def kv_bytes_per_token(self, dtype: str = "bf16") -> int:
        """KV-cache bytes of one token, all layers (MLA caches the latent and rope key, not K and V)."""
        if self.mla is not None:
            return self.layers * self.mla.cached_per_layer * DTYPE_BYTES[dtype]
        return 2 * self.layers * self.kv_heads * self.head_dim * DTYPE_BYTES[dtype]

    def weight_bytes(self, dtype: str = "bf16") -> int:
        return self.params * DTYPE_BYTES[dtype]

    # ---- expert-parallel communication ----------------------------------------------------------
    def dispatch_bytes_per_token_layer(self, ep: int, dtype: str = "bf16") -> float:
        """Bytes one token sends out of its rank in one MoE layer's dispatch all-to-all: its hidden
        state to each of its top_k experts, of which (ep−1)/ep live on other ranks when experts are
        spread evenly over ep ranks. The combine all-to-all brings the same bytes back."""
        if self.moe is None or ep <= 1:
            return 0.0
        return self.hidden * DTYPE_BYTES[dtype] * self.moe.top_k * (ep - 1) / ep

    def alltoall_bytes_per_token(self, ep: int, dtype: str = "bf16") -> float:
        """Dispatch + combine bytes of one token's forward over every MoE layer (a backward pass
        moves the same again, in reverse)."""
        return 2.0 * self.moe_layers * self.dispatch_bytes_per_token_layer(ep, dtype)

    def to_hf_config(self) -> dict:
        """A Hugging Face config dict (Qwen3, Qwen3-MoE or Llama architecture) with these shapes."""
        common = {
            "vocab_size": self.vocab, "hidden_size": self.hidden, "intermediate_size": self.ffn,
            "num_hidden_layers": self.layers, "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads, "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position, "tie_word_embeddings": self.tie_embeddings,
            "rms_norm_eps": 1e-6, "hidden_act": "silu",
        }
        if self.family == "qwen3":
            return {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "rope_theta": 1e6, **common}
        if self.family == "qwen3_moe" and self.moe is not None:
            e = self.moe  # Qwen3MoeConfig's fields; dense layers listed, so decoder_sparse_step stays 1
            return {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "rope_theta": 1e6,
                    "num_experts": e.experts, "num_experts_per_tok": e.top_k, "moe_intermediate_size": e.expert_ffn,
                    "decoder_sparse_step": 1, "mlp_only_layers": list(e.dense_layers),
                    "norm_topk_prob": e.norm_topk_prob, **common}
        if self.moe is not None or self.mla is not None:  # a dense Llama would silently be another model
            raise ValueError(f"no Hugging Face config writer for the {self.family} architecture")
        return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "rope_theta": 5e5, **common}


def _qwen3(name, layers, hidden, ffn, heads, kv, tie, vocab=151936, head_dim=128, max_pos=40960):
    return ModelShape(name, "qwen3", layers, hidden, ffn, heads, kv, head_dim, vocab, tie, max_pos, qk_norm=True)


def _qwen3_moe(name, layers, hidden, ffn, heads, kv, experts, top_k, expert_ffn):
    moe = MoeShape(experts, top_k, expert_ffn, norm_topk_prob=True)
    return ModelShape(name, "qwen3_moe", layers, hidden, ffn, heads, kv, 128, 151936, False, 40960, qk_norm=True,
                      moe=moe)


def _gpt_oss(name, layers, experts):
    return ModelShape(name, "gpt_oss", layers, 2880, 2880, 64, 8, 64, 201088, False, 131072,
                      moe=MoeShape(experts, 4, 2880, norm_topk_prob=True), biases=True)


PRESETS: dict[str, ModelShape] = {m.name: m for m in [
    _qwen3("qwen3-0.6b", 28, 1024, 3072, 16, 8, True),
    _qwen3("qwen3-1.7b", 28, 2048, 6144, 16, 8, True),
    _qwen3("qwen3-4b", 36, 2560, 9728, 32, 8, True),
    _qwen3("qwen3-8b", 36, 4096, 12288, 32, 8, False),
    _qwen3("qwen3-14b", 40, 5120, 17408, 40, 8, False),
    _qwen3("qwen3-32b", 64, 5120, 25600, 64, 8, False),
    ModelShape("llama3-8b", "llama", 32, 4096, 14336, 32, 8, 128, 128256, False, 8192),
    ModelShape("llama3-70b", "llama", 80, 8192, 28672, 64, 8, 128, 128256, False, 8192),
    # Mixture of experts, from the published config.json of each (hf.co/<org>/<model>/blob/main/config.json):
    # Qwen/Qwen3-30B-A3B and Qwen/Qwen3-235B-A22B (every layer MoE, no shared expert, norm_topk_prob true),
    # deepseek-ai/DeepSeek-V3 (first 3 layers dense, 1 shared expert, MLA; the multi-token-prediction
    # module, num_nextn_predict_layers, is left out as in the published 671B), openai/gpt-oss-20b and
    # openai/gpt-oss-120b (biases, attention sinks; sliding-window layers are priced as full attention).
    _qwen3_moe("qwen3-30b-a3b", 48, 2048, 6144, 32, 4, experts=128, top_k=8, expert_ffn=768),
    _qwen3_moe("qwen3-235b-a22b", 94, 4096, 12288, 64, 4, experts=128, top_k=8, expert_ffn=1536),
    ModelShape("deepseek-v3", "deepseek_v3", 61, 7168, 18432, 128, 128, 192, 129280, False, 163840,
               moe=MoeShape(256, 8, 2048, shared_experts=1, dense_layers=(0, 1, 2), norm_topk_prob=True),
               mla=MlaShape(q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                            v_head_dim=128)),
    _gpt_oss("gpt-oss-20b", 24, experts=32),
    _gpt_oss("gpt-oss-120b", 36, experts=128),
    # Tiny shapes: small enough to train on a CPU in seconds, same architecture as the real ones.
    # The vocabulary matches the executor's character tokenizer.
    _qwen3("tiny", 2, 64, 192, 4, 2, True, vocab=64, head_dim=16, max_pos=512),
    _qwen3("tiny-2x", 4, 128, 384, 4, 2, True, vocab=64, head_dim=32, max_pos=512),
    # Qwen3-MoE at the tiny shape: 8 experts of width 48, top-2 (2 × 48 active, half of tiny's FFN).
    ModelShape("tiny-moe", "qwen3_moe", 2, 64, 192, 4, 2, 16, 64, True, 512, qk_norm=True,
               moe=MoeShape(8, 2, 48, norm_topk_prob=True)),
]}


def resolve_model(ref: str, base_dir: Path | None = None) -> ModelShape:
    """A preset by name, or the shapes of a local Hugging Face config.json (file or directory)."""
    key = ref.strip().lower()
    if key in PRESETS:
        return PRESETS[key]
    path = Path(ref)
    if base_dir is not None and not path.is_absolute():
        path = base_dir / path
    try:
        if path.is_dir():
            path = path / "config.json"
        found = path.is_file()
    except OSError:  # a name no file system holds (too long, say) names no local config either
        found = False
    if found:
        return from_hf_config(path)
    raise KeyError(ref)


# Caps on a model folder's config.json, far above every published model (vocabularies ~262k,
# contexts ~10M, hidden ~16k, ~128 layers): beyond them a shared config is a mistake or an attack.
CONFIG_CAPS = {"hidden_size": 1 << 16, "num_hidden_layers": 1 << 10, "num_attention_heads": 1 << 10,
               "num_key_value_heads": 1 << 10, "intermediate_size": 1 << 20, "vocab_size": 1 << 22,
               "head_dim": 1 << 12, "max_position_embeddings": 1 << 24}
MAX_CONFIG_BYTES = 4 << 20  # config.json files are a few KB


def from_hf_config(path: str | Path) -> ModelShape:
    """Shapes from a Hugging Face config.json (Llama/Qwen/Mistral-style decoder; Qwen3-MoE, DeepSeek-V3
    and GPT-OSS add their experts and attention, hetprof.specs.moe).

    The file may come from someone else: it is read bounded (size, depth, finite numbers) and every
    shape field must be a positive integer within CONFIG_CAPS, with the hidden size divisible by the
    heads (when head_dim is not given) and the heads by the KV heads — one SpecError naming the field.
    """
    from hetprof.specs.loader import MAX_DEPTH, check_plain

    path = Path(path)
    try:
        cfg = json.loads(read_bounded(path, MAX_CONFIG_BYTES).decode("utf-8"))
    except NotReadable as exc:
        raise SpecError(str(path), "", "a readable Hugging Face config.json", str(exc)) from None
    except RecursionError:
        raise SpecError(str(path), "", f"data nested at most {MAX_DEPTH} deep", "deeper") from None
    except (OSError, ValueError) as exc:
        raise SpecError(str(path), "", "a readable Hugging Face config.json", str(exc)[:160]) from None
    check_plain(cfg, str(path))
    if not isinstance(cfg, dict):
        raise SpecError(str(path), "", "a JSON object", type(cfg).__name__)
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"):
        _config_int(cfg, key, path, required=True)
    for key in ("num_key_value_heads", "head_dim", "max_position_embeddings"):
        _config_int(cfg, key, path, required=False)
    heads = cfg["num_attention_heads"]
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    if heads % kv_heads:
        raise SpecError(str(path), "num_key_value_heads", f"a divisor of num_attention_heads ({heads})", kv_heads)
    if not cfg.get("head_dim") and cfg["hidden_size"] % heads:
        raise SpecError(str(path), "num_attention_heads", f"a divisor of hidden_size ({cfg['hidden_size']}) "
                        "(or head_dim given)", heads)
    model_type = str(cfg.get("model_type", "llama"))
    arch = read_architecture(cfg, path)
    family = "qwen3" if model_type.startswith("qwen3") else "llama"
    head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // heads)
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    return ModelShape(
        name=str(cfg.get("_name_or_path") or path.parent.name),
        family=family if arch is None else arch.family,
        layers=cfg["num_hidden_layers"], hidden=cfg["hidden_size"], ffn=cfg["intermediate_size"],
        heads=heads, kv_heads=kv_heads if arch is None or arch.kv_heads is None else arch.kv_heads,
        head_dim=head_dim if arch is None or arch.head_dim is None else arch.head_dim, vocab=cfg["vocab_size"],
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        max_position=int(cfg.get("max_position_embeddings", 4096)), qk_norm=model_type.startswith("qwen3"),
        moe=None if arch is None else arch.moe, mla=None if arch is None else arch.mla,
        biases=False if arch is None else arch.biases,
    )


def _config_int(cfg: dict, key: str, path: Path, required: bool) -> None:
    value = cfg.get(key)
    if value is None and not required:
        return
    if type(value) is not int or not 1 <= value <= CONFIG_CAPS[key]:
        raise SpecError(str(path), key, f"a positive integer of at most {CONFIG_CAPS[key]:,}", value)
