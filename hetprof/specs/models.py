"""Transformer shapes and the numbers every stage derives from them.

A ModelShape is the few integers that decide cost: parameters, FLOPs per token, KV-cache bytes
per token. Presets come from the published configs of Qwen3 and Llama-3 (plus tiny shapes for
tests); any local Hugging Face `config.json` works too. Nothing is downloaded.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from hetprof.errors import SpecError
from hetprof.safety.safefiles import NotReadable, read_bounded

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

    # ---- parameters -------------------------------------------------------------------------
    @property
    def attn_params_per_layer(self) -> int:
        q = self.hidden * self.heads * self.head_dim
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        o = self.heads * self.head_dim * self.hidden
        norms = 2 * self.head_dim if self.qk_norm else 0
        return q + kv + o + norms

    @property
    def mlp_params_per_layer(self) -> int:
        return 3 * self.hidden * self.ffn  # SwiGLU: gate, up, down

    @property
    def params_per_layer(self) -> int:
        return self.attn_params_per_layer + self.mlp_params_per_layer + 2 * self.hidden

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def lm_head_params(self) -> int:
        return 0 if self.tie_embeddings else self.vocab * self.hidden

    @property
    def params(self) -> int:
        return (self.layers * self.params_per_layer + self.embedding_params + self.lm_head_params
                + self.hidden)

    # ---- compute ----------------------------------------------------------------------------
    def matmul_flops_per_token_per_layer(self) -> float:
        """Forward FLOPs of one token through one layer's weight matmuls (2 per MAC)."""
        return 2.0 * (self.attn_params_per_layer - (2 * self.head_dim if self.qk_norm else 0)
                      + self.mlp_params_per_layer)

    def attention_flops_per_token_per_layer(self, context: float) -> float:
        """Forward FLOPs of QK^T and AV for one query token attending to `context` tokens."""
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
        return 2 * self.layers * self.kv_heads * self.head_dim * DTYPE_BYTES[dtype]

    def weight_bytes(self, dtype: str = "bf16") -> int:
        return self.params * DTYPE_BYTES[dtype]

    def to_hf_config(self) -> dict:
        """A Hugging Face config dict (Qwen3 or Llama architecture) with these shapes."""
        common = {
            "vocab_size": self.vocab, "hidden_size": self.hidden, "intermediate_size": self.ffn,
            "num_hidden_layers": self.layers, "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads, "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position, "tie_word_embeddings": self.tie_embeddings,
            "rms_norm_eps": 1e-6, "hidden_act": "silu",
        }
        if self.family == "qwen3":
            return {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "rope_theta": 1e6, **common}
        return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "rope_theta": 5e5, **common}


def _qwen3(name, layers, hidden, ffn, heads, kv, tie, vocab=151936, head_dim=128, max_pos=40960):
    return ModelShape(name, "qwen3", layers, hidden, ffn, heads, kv, head_dim, vocab, tie, max_pos, qk_norm=True)


PRESETS: dict[str, ModelShape] = {m.name: m for m in [
    _qwen3("qwen3-0.6b", 28, 1024, 3072, 16, 8, True),
    _qwen3("qwen3-1.7b", 28, 2048, 6144, 16, 8, True),
    _qwen3("qwen3-4b", 36, 2560, 9728, 32, 8, True),
    _qwen3("qwen3-8b", 36, 4096, 12288, 32, 8, False),
    _qwen3("qwen3-14b", 40, 5120, 17408, 40, 8, False),
    _qwen3("qwen3-32b", 64, 5120, 25600, 64, 8, False),
    ModelShape("llama3-8b", "llama", 32, 4096, 14336, 32, 8, 128, 128256, False, 8192),
    ModelShape("llama3-70b", "llama", 80, 8192, 28672, 64, 8, 128, 128256, False, 8192),
    # Tiny shapes: small enough to train on a CPU in seconds, same architecture as the real ones.
    # The vocabulary matches the executor's character tokenizer.
    _qwen3("tiny", 2, 64, 192, 4, 2, True, vocab=64, head_dim=16, max_pos=512),
    _qwen3("tiny-2x", 4, 128, 384, 4, 2, True, vocab=64, head_dim=32, max_pos=512),
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
    """Shapes from a Hugging Face config.json (Llama/Qwen/Mistral-style decoder).

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
    return ModelShape(
        name=str(cfg.get("_name_or_path") or path.parent.name),
        family="qwen3" if model_type.startswith("qwen3") else "llama",
        layers=cfg["num_hidden_layers"], hidden=cfg["hidden_size"], ffn=cfg["intermediate_size"],
        heads=heads, kv_heads=kv_heads,
        head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads), vocab=cfg["vocab_size"],
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        max_position=int(cfg.get("max_position_embeddings", 4096)), qk_norm=model_type.startswith("qwen3"),
    )


def _config_int(cfg: dict, key: str, path: Path, required: bool) -> None:
    value = cfg.get(key)
    if value is None and not required:
        return
    if type(value) is not int or not 1 <= value <= CONFIG_CAPS[key]:
        raise SpecError(str(path), key, f"a positive integer of at most {CONFIG_CAPS[key]:,}", value)
