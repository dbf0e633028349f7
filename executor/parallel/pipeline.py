"""Pipeline stages of a causal LM or scalar-head model, run by torch.distributed.pipelining.

A plan's pipelined task holds, per replica, `pp` stages, each owning the decoder layers
[layer_start, layer_end) its tasklet names (the planner balances them to the stages' devices).
Each rank builds the whole model once (seeded, so every rank starts from the same weights), keeps
its stage's pieces — embeddings on the first stage, final norm and head on the last — and moves
the rest to the `meta` device, so a stage's memory holds what the planner's memory model counted.

Stages run the model's *own* backbone forward over their layer slice (transformers builds the
causal mask and rotary phases per stage from the attention mask, which travels to every stage as a
keyword argument), so a pipelined forward computes the same numbers as the whole model.

Why a fresh `PipelineStage` and schedule per step: torch's stages size their receive buffers once,
from the first micro-batch they see, while RL batches change length every step (responses end
where they end). Stages built with explicit meta shapes exchange nothing to set up, so building
them per step costs microseconds. Micro-batches must have one size (same reason): the count is the
largest divisor of the rows up to the number wanted, never a padded batch that would change the loss.

Tied embeddings (the tiny and small Qwen3 presets tie the LM head to the token embedding): the last
stage keeps its own copy of the tied matrix; the two copies' gradients are summed across the first
and last stage before each optimizer step (Megatron's embedding group), so identical updates keep
them identical, and the first stage's copy is the one weight sync and checkpoints read.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hetprof.errors import ExecutionError
from hetprof.runtime.generation import position_ids

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def owner_stage(name: str, bounds: list[tuple[int, int]]) -> int:
    """The stage that owns a full-model parameter: its layer's stage; embeddings the first; the rest
    (final norm, LM/value head) the last."""
    m = _LAYER.search(name)
    if m:
        layer = int(m.group(1))
        for s, (lo, hi) in enumerate(bounds):
            if lo <= layer < hi:
                return s
        raise ExecutionError(f"pipeline: parameter {name} belongs to layer {layer}, which no stage holds {bounds}")
    if "embed" in name:
        return 0
    return len(bounds) - 1


class Manifest:
    """The full model's parameter names, shapes and dtypes, as meta tensors, in the model's order
    (tied weights listed once, as the generators list them): what a pipelined trainer's weight sync
    agrees its buckets on, without holding the other stages' weights."""

    def __init__(self, model: nn.Module):
        self._named = [(n, torch.empty(p.shape, dtype=p.dtype, device="meta")) for n, p in model.named_parameters()]

    def named_parameters(self) -> list[tuple[str, torch.Tensor]]:
        return list(self._named)


def skeleton(model: nn.Module) -> Manifest:
    """The weight-sync manifest of a model about to be split into stages."""
    return Manifest(model)


class StageModule(nn.Module):
    """Decoder layers [start, end) of a model as one pipeline stage.

    `head` is "lm" (a causal LM: `model.model` backbone + `lm_head`, output logits) or "value"
    (`ScalarHeadModel`: `model.backbone` + `head`, output one float per position).
    """

    def __init__(self, model: nn.Module, start: int, end: int, first: bool, last: bool, head: str):
        super().__init__()
        if head not in ("lm", "value"):
            raise ValueError(f"head must be 'lm' or 'value', got {head!r}")
        backbone = model.model if head == "lm" else model.backbone
        if not hasattr(backbone, "layers") or not hasattr(backbone, "norm"):
            raise ExecutionError("pipeline stages know transformers decoder models (a backbone with `layers` "
                                 "and `norm`); this model has neither")
        # which full-model name each parameter had before surgery (tied weights: the embedding's name)
        full_name_of = {id(p): n for n, p in model.named_parameters()}
        layers = backbone.layers
        if not 0 <= start < end <= len(layers):
            raise ExecutionError(f"pipeline: stage layers [{start}, {end}) outside the model's {len(layers)}")
        tied = head == "lm" and model.lm_head.weight is backbone.embed_tokens.weight
        self.tied = tied and first != last  # both ends hold a copy only when they are different stages
        out_head = (model.lm_head if head == "lm" else model.head) if last else None
        if last and self.tied:  # untie: this stage's own copy of the embedding matrix
            model.lm_head.weight = nn.Parameter(backbone.embed_tokens.weight.detach().clone())
        for i, layer in enumerate(layers):
            if not start <= i < end:
                layer.to("meta")
        if not first:
            backbone.embed_tokens.to("meta")
            backbone.embed_tokens = None
        if not last:
            backbone.norm.to("meta")
            backbone.norm = nn.Identity()
            (model.lm_head if head == "lm" else model.head).to("meta")
        backbone.layers = nn.ModuleList(list(layers)[start:end])
        config = copy.deepcopy(backbone.config)  # the backbone loop reads per-layer types by local index
        config.num_hidden_layers = end - start
        if getattr(config, "layer_types", None):
            config.layer_types = list(config.layer_types)[start:end]
        backbone.config = config
        self.backbone = backbone
        self.out_head = out_head
        self.kind = head
        self.first, self.last, self.start, self.end = first, last, start, end
        # by module path, which tensor parallelism keeps when it swaps parameters for DTensors
        self.full_names = {n: full_name_of[id(p)] for n, p in self.named_parameters() if id(p) in full_name_of}

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        inputs = {"input_ids": x} if self.first else {"inputs_embeds": x}
        h = self.backbone(attention_mask=attention_mask, position_ids=position_ids(attention_mask),
                          use_cache=False, **inputs).last_hidden_state
        if not self.last:
            return h
        if self.kind == "lm":
            return self.out_head(h)
        return self.out_head(h).squeeze(-1).float()

    def owned(self) -> dict[str, nn.Parameter]:
        """This stage's parameters under their full-model names (the tied copy on the last stage is
        left out: the first stage owns that name)."""
        return {self.full_names[n]: p for n, p in self.named_parameters() if n in self.full_names}

    def tied_copy(self) -> nn.Parameter | None:
        """The tied embedding matrix this stage holds a copy of (first: the embedding; last: the head)."""
        if not self.tied:
            return None
        return self.backbone.embed_tokens.weight if self.first else self.out_head.weight


def micro_count(rows: int, wanted: int) -> int:
    """The largest divisor of `rows` that is at most `wanted` (equal micro-batches, see module doc)."""
    for n in range(max(1, min(wanted, rows)), 0, -1):
        if rows % n == 0:
            return n
    return 1


class Pipeline:
    """One rank's stage of a pipeline replica, and the schedules that run it.

    `group` is the replica's pipeline group (one rank per stage, at the same TP position);
    `stage_ranks[s]` the global rank of stage s in it.
    """

    def __init__(self, stage: StageModule, stage_index: int, stages: int, group: dist.ProcessGroup,
                 stage_ranks: tuple[int, ...], device: torch.device, hidden: int, vocab: int,
                 dtype: torch.dtype, micro_batches: int, schedule: str = "1f1b"):
        self.module = stage
        self.index = stage_index
        self.stages = stages
        self.group = group
        self.stage_ranks = stage_ranks
        self.device = device
        self.hidden = hidden
        self.vocab = vocab
        self.dtype = dtype
        self.micro_batches = max(1, micro_batches)
        self.schedule_name = schedule
        self.group_rank_of = {s: dist.get_group_rank(group, r) for s, r in enumerate(stage_ranks)}

    @property
    def first(self) -> bool:
        return self.index == 0

    @property
    def last(self) -> bool:
        return self.index == self.stages - 1

    def _stage(self, rows: int, width: int, grad: bool):
        from torch.distributed.pipelining import PipelineStage

        meta = torch.device("meta")
        # Activations between stages carry gradients back (the stage builds its gradient buffers
        # from whether its meta output requires grad).
        hidden = torch.empty(rows, width, self.hidden, dtype=self.dtype, device=meta, requires_grad=grad)
        inp = torch.empty(rows, width, dtype=torch.long, device=meta) if self.first else hidden
        if not self.last:
            out = hidden
        elif self.module.kind == "lm":
            out = torch.empty(rows, width, self.vocab, dtype=self.dtype, device=meta, requires_grad=grad)
        else:
            out = torch.empty(rows, width, dtype=torch.float32, device=meta, requires_grad=grad)
        stage = PipelineStage(self.module, self.index, self.stages, self.device, input_args=(inp,),
                              output_args=(out,), group=self.group)
        stage.stage_index_to_group_rank = dict(self.group_rank_of)  # stages need not be in rank order
        return stage

    def _schedule(self, stage, n: int, loss_fn: Callable | None):
        from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

        # 1F1B (activation memory bounded by the stage count) needs at least one micro-batch per stage;
        # a replica with fewer rows than stages runs GPipe.
        one_f_one_b = self.schedule_name == "1f1b" and loss_fn is not None and n >= self.stages
        cls = Schedule1F1B if one_f_one_b else ScheduleGPipe
        # Losses are already divided by the whole batch's token count: no rescaling by micro-batches.
        return cls(stage, n, loss_fn=loss_fn, scale_grads=False)

    def train_step(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   loss_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        """Forward and backward of one (mini-)batch over the pipeline's micro-batches.

        `loss_of(output, rows)` runs on the last stage per micro-batch: `rows` are the micro-batch's
        row indices into the batch (the loss looks up its advantages, masks, old log-probs there).
        Gradients accumulate in the stage's parameters.
        """
        rows, width = input_ids.shape
        n = micro_count(rows, self.micro_batches)
        stage = self._stage(rows // n, width, grad=True)
        schedule = self._schedule(stage, n, loss_of)
        target = torch.arange(rows, device=input_ids.device) if self.last else None
        args = (input_ids,) if self.first else ()
        schedule.step(*args, target=target, attention_mask=attention_mask)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The whole model's output (logits or values) for a batch, on every stage of the pipeline
        (computed on the last, then broadcast over the pipeline group)."""
        rows, width = input_ids.shape
        n = micro_count(rows, self.micro_batches)
        stage = self._stage(rows // n, width, grad=False)
        schedule = self._schedule(stage, n, None)
        args = (input_ids,) if self.first else ()
        out = schedule.step(*args, attention_mask=attention_mask)
        return self.broadcast_from_last(out)

    def broadcast_from_last(self, tensor: torch.Tensor | None) -> torch.Tensor:
        """A tensor the last stage holds, on every stage (shape and dtype travel first)."""
        src = self.stage_ranks[-1]
        box: list[Any] = [(tuple(tensor.shape), str(tensor.dtype)) if self.last else None]
        dist.broadcast_object_list(box, src=src, group=self.group)
        shape, dtype = box[0]
        if not self.last:
            tensor = torch.empty(shape, dtype=getattr(torch, dtype.removeprefix("torch.")), device=self.device)
        dist.broadcast(tensor, src=src, group=self.group)
        return tensor

    def broadcast_object(self, obj: Any) -> Any:
        """A small object (training statistics) from the last stage to every stage."""
        box = [obj if self.last else None]
        dist.broadcast_object_list(box, src=self.stage_ranks[-1], group=self.group)
        return box[0]
