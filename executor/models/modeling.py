"""The models an RL job runs: the actor/reference causal LM, and scalar-head critic and reward models.

Planned workloads name presets (shapes only), so the executor must build a model with the exact
shapes the cost models priced, with random weights, through transformers' own architectures —
`ModelShape.to_hf_config()` is the bridge. A local HF checkpoint directory is loaded instead when
it holds weights. Initialisation is seeded without touching the process's global RNG, so building
a model in the middle of a run does not change which samples the run draws.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from transformers import PretrainedConfig

from hetprof.errors import SpecError
from hetprof.runtime.generation import position_ids
from hetprof.runtime.varlen_attention import VARLEN_ATTENTION
from hetprof.specs.models import ModelShape, resolve_model

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")


def torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """A torch dtype from the workload's precision name ("bf16", "fp16", "fp32")."""
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return DTYPES[dtype]
    except KeyError:
        raise SpecError(None, "dtype", f"one of {sorted(DTYPES)}", dtype) from None


def checkpoint_dir(model_ref: str | ModelShape) -> Path | None:
    """The local HF directory to load weights from, or None when the reference is shapes only."""
    if isinstance(model_ref, ModelShape):
        return None
    path = Path(model_ref)
    if path.is_dir() and any((path / f).is_file() for f in _WEIGHT_FILES):
        return path
    return None


def _shape(model_ref: str | ModelShape) -> ModelShape:
    if isinstance(model_ref, ModelShape):
        return model_ref
    try:
        return resolve_model(model_ref)
    except KeyError:
        raise SpecError(None, "model", "a preset name or a local Hugging Face directory/config.json",
                        model_ref) from None


def hf_config(model_ref: str | ModelShape) -> PretrainedConfig:
    """The transformers config object for a preset, a ModelShape, or a local config."""
    from transformers import AutoConfig

    path = Path(model_ref) if not isinstance(model_ref, ModelShape) else None
    if path is not None and (path / "config.json").is_file():
        return AutoConfig.from_pretrained(str(path), local_files_only=True)
    cfg = dict(_shape(model_ref).to_hf_config())
    model_type = cfg.pop("model_type")
    cfg.pop("architectures", None)
    return AutoConfig.for_model(model_type, **cfg)


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run a block under `seed` and give the caller's RNG state back afterwards."""
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def build_causal_lm(model_ref: str | ModelShape, seed: int = 0, dtype: str | torch.dtype = "fp32",
                    device: torch.device | str = "cpu", attn_implementation: str = VARLEN_ATTENTION) -> nn.Module:
    """A causal LM: loaded from a local checkpoint directory, else random weights seeded by `seed`.

    The default attention is `sdpa`'s, with packed rows split per sequence (hetprof/runtime/varlen_attention.py).
    """
    from transformers import AutoModelForCausalLM

    dt = torch_dtype(dtype)
    ckpt = checkpoint_dir(model_ref)
    if ckpt is not None:
        model = _from_checkpoint(AutoModelForCausalLM, ckpt, dt, attn_implementation)
        return model.to(device)
    with seeded(seed):
        model = AutoModelForCausalLM.from_config(hf_config(model_ref), dtype=dt,
                                                 attn_implementation=attn_implementation)
    return model.to(device)


class ScalarHeadModel(nn.Module):
    """A transformer backbone with a linear head giving one scalar per position.

    The critic reads it at every position (V of the state before the next token); the reward
    model reads it at each sequence's last real token.
    """

    def __init__(self, backbone: nn.Module, hidden: int, zero_head: bool):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(hidden, 1, bias=True, dtype=next(backbone.parameters()).dtype)
        if zero_head:
            # A zero head starts the critic at V = 0 everywhere: early advantages are the raw
            # returns instead of noise from a random projection.
            nn.init.zeros_(self.head.weight)
        else:
            nn.init.normal_(self.head.weight, std=hidden ** -0.5)
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                positions: torch.Tensor | None = None, **attention: object) -> torch.Tensor:
        """Values [B, T]; packed input (executor/models/packing.py) passes restarting `positions`, no mask,
        and `attention` keywords its attention layers read (a Ulysses `sequence_shard`)."""
        if positions is None and attention_mask is not None:
            positions = position_ids(attention_mask)
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                            use_cache=False, **attention)
        return self.head(out.last_hidden_state).squeeze(-1).float()

    def sequence_scores(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """One scalar per sequence, read at its last attended token (sequences may be right-padded)."""
        values = self(input_ids, attention_mask)
        t = torch.arange(attention_mask.shape[1], device=attention_mask.device)
        last = (attention_mask.bool() * t).amax(dim=1)
        return values.gather(1, last[:, None]).squeeze(1)


def _build_scalar(model_ref: str | ModelShape, seed: int, dtype, device, zero_head: bool,
                  attn_implementation: str = VARLEN_ATTENTION) -> ScalarHeadModel:
    from transformers import AutoModel

    dt = torch_dtype(dtype)
    ckpt = checkpoint_dir(model_ref)
    with seeded(seed):
        if ckpt is not None:
            backbone = _from_checkpoint(AutoModel, ckpt, dt, attn_implementation)
        else:
            backbone = AutoModel.from_config(hf_config(model_ref), dtype=dt, attn_implementation=attn_implementation)
        model = ScalarHeadModel(backbone, backbone.config.hidden_size, zero_head)
    return model.to(device)


def build_value_model(model_ref: str | ModelShape, seed: int = 0, dtype: str | torch.dtype = "fp32",
                      device: torch.device | str = "cpu", attn_implementation: str = VARLEN_ATTENTION) -> ScalarHeadModel:
    """The critic: backbone + zero-initialised value head."""
    return _build_scalar(model_ref, seed, dtype, device, zero_head=True, attn_implementation=attn_implementation)


def build_reward_model(model_ref: str | ModelShape, seed: int = 0, dtype: str | torch.dtype = "fp32",
                       device: torch.device | str = "cpu", attn_implementation: str = VARLEN_ATTENTION
                       ) -> ScalarHeadModel:
    """The reward-model role: backbone + scalar head (random unless a checkpoint is given)."""
    return _build_scalar(model_ref, seed, dtype, device, zero_head=False, attn_implementation=attn_implementation)


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module under a DDP/compile wrapper (for names and weight sync)."""
    while hasattr(model, "module") and isinstance(model.module, nn.Module):
        model = model.module
    return getattr(model, "_orig_mod", model)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _from_checkpoint(auto_class: Any, ckpt: Path, dtype: torch.dtype, attn_implementation: str) -> Any:
    """`auto_class.from_pretrained` of a local checkpoint; any unreadable checkpoint is a user error."""
    try:
        return auto_class.from_pretrained(str(ckpt), dtype=dtype, local_files_only=True,
                                          attn_implementation=attn_implementation)
    except Exception as exc:
        raise SpecError(str(ckpt), "model", "a loadable Hugging Face checkpoint", str(exc)) from None


def moe_blocks(model: nn.Module) -> list[nn.Module]:
    """The model's MoE blocks: a router `gate` and `experts` holding fused expert tensors
    (transformers' Qwen3-MoE layout)."""
    return [m for m in model.modules() if isinstance(getattr(m, "experts", None), nn.Module)
            and hasattr(m.experts, "gate_up_proj") and hasattr(m, "gate")]


def has_routed_experts(model: nn.Module) -> bool:
    """Whether `model` has MoE layers (whole or sharded experts)."""
    return bool(moe_blocks(model))
