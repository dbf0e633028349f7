"""Transformer blocks for the task benchmarks, built by `transformers` from a ModelShape.

The same Hugging Face model code the executor runs (from `ModelShape.to_hf_config()`, random
weights, nothing downloaded), so a cost model fitted on these timings predicts the executor. Large
presets are profiled on a few blocks: the model is built with `layers_run` layers and, without its
head, fed random embeddings — the embedding table and LM head of a 150k vocabulary would otherwise
dominate a two-layer timing and are modelled separately.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hetprof.specs.models import ModelShape

WHOLE_MODEL_MAX_PARAMS = 50_000_000  # below this a preset is profiled whole, head included
TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


@dataclasses.dataclass(frozen=True)
class TaskModel:
    shape: ModelShape
    layers_run: int
    with_head: bool
    dtype: str

    def shape_params(self) -> dict:
        """The sample params that describe the model (the contract's `…shape…` keys)."""
        s = self.shape
        return {"model": s.name, "layers_run": self.layers_run, "hidden": s.hidden, "ffn": s.ffn,
                "heads": s.heads, "kv_heads": s.kv_heads, "head_dim": s.head_dim, "vocab": s.vocab,
                "dtype": self.dtype, "with_head": self.with_head}


def plan_model(shape: ModelShape, dtype: str, layers_run: int | None) -> TaskModel:
    """Whole model for small presets; otherwise `layers_run` blocks (default 2) without the head."""
    if layers_run is None and shape.params <= WHOLE_MODEL_MAX_PARAMS:
        return TaskModel(shape, shape.layers, True, dtype)
    n = min(shape.layers, layers_run or 2)
    return TaskModel(shape, n, n == shape.layers and shape.params <= WHOLE_MODEL_MAX_PARAMS, dtype)


def build(task: TaskModel, device: Any, *, seed: int = 0) -> Any:
    """A randomly initialised HF model on `device` in the task's dtype."""
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    from hetprof.runtime.varlen_attention import VARLEN_ATTENTION

    cfg = dict(task.shape.to_hf_config())
    model_type = cfg.pop("model_type")
    cfg.pop("architectures", None)
    cfg["num_hidden_layers"] = task.layers_run
    if not task.with_head:
        cfg["vocab_size"] = 8  # unused: blocks are fed embeddings directly
    config = AutoConfig.for_model(model_type, **cfg)
    torch.manual_seed(seed)
    cls = AutoModelForCausalLM if task.with_head else AutoModel
    # the executor's attention: transformers' sdpa, packed rows split per sequence
    model = cls.from_config(config, attn_implementation=VARLEN_ATTENTION)
    return model.to(device=device, dtype=getattr(torch, TORCH_DTYPES[task.dtype]))


def inputs(task: TaskModel, batch: int, seq: int, device: Any, generator: Any = None, padded: bool = True) -> dict:
    """Random model inputs: token ids with a head, embeddings (never zero) without one, and (by
    default) the padding mask an RL batch carries."""
    import torch

    if task.with_head:
        ids = torch.randint(0, task.shape.vocab, (batch, seq), device="cpu", generator=generator)
        out = {"input_ids": ids.to(device)}
    else:
        dtype = getattr(torch, TORCH_DTYPES[task.dtype])
        emb = torch.randn(batch, seq, task.shape.hidden, dtype=torch.float32, generator=generator) * 0.02 + 0.01
        out = {"inputs_embeds": emb.to(device=device, dtype=dtype)}
    if padded:
        out["attention_mask"] = padding_mask(batch, seq).to(device)
    return out


def padding_mask(batch: int, seq: int) -> Any:
    """The mask of a padded RL batch: every other row starts with seq // 8 pad positions.

    The executor's batches always carry one (prompts of unequal length are left-padded, responses
    end early), and a mask with zeros takes attention off its unmasked fast path — measurably slower
    on CPU — so task rows timed without one would predict the executor too fast.
    """
    import torch

    mask = torch.ones(batch, seq, dtype=torch.long)
    pad = seq // 8
    if pad:
        mask[::2, :pad] = 0
    return mask
