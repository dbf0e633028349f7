"""Tensor parallelism for a replica's devices, through torch's own tensor-parallel API.

Each decoder layer's attention projections and MLP are split Megatron-style: q/k/v and gate/up
column-wise (each rank owns whole heads and a slice of the FFN), o and down row-wise (partial sums
all-reduced), so one all-reduce per block half and every rank ends with the same hidden states —
and therefore the same logits, the same sampled tokens under the same seed, and the same log-probs.
Embeddings, norms and the LM head stay replicated. Weight sync sends full tensors; each rank keeps
its own shard of them. Training shards the same way (executor/parallel/sharded.py adds what the optimizer
step needs: the partial gradients of `partial_grad_params` and the data-parallel average).
"""

from __future__ import annotations

import torch
from torch import nn

from hetprof.errors import ExecutionError

COLWISE = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
ROWWISE = ("self_attn.o_proj", "mlp.down_proj")


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]


def tensor_parallel(model: nn.Module, group, device_type: str, task: str) -> nn.Module:
    """Shard `model` over the ranks of `group` in place; refuses architectures it has no plan for."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    layers = decoder_layers(model)
    names = {n for layer in layers[:1] for n, _ in layer.named_modules()}
    missing = [n for n in (*COLWISE, *ROWWISE) if n not in names]
    if not layers or missing:
        raise ExecutionError(f"task {task}: tensor parallelism knows Llama/Qwen-style decoder layers; this model "
                             f"lacks {missing or 'decoder layers'}")
    mesh = DeviceMesh.from_group(group, device_type)
    plan = {**{n: ColwiseParallel() for n in COLWISE}, **{n: RowwiseParallel() for n in ROWWISE}}
    for layer in layers:
        parallelize_module(layer, mesh, plan)
    return model


def partial_grad_params(model: nn.Module) -> list[nn.Parameter]:
    """Un-sharded parameters inside the sharded attention/MLP blocks (Qwen3's per-head q/k norms).

    They act on each rank's own heads, so under tensor parallelism each rank's gradient for them is
    a partial sum over its heads; training sums them over the TP group. Embeddings and the layer
    norms around the blocks see replicated activations and get whole, equal gradients on every rank.
    """
    out = []
    for layer in decoder_layers(model):
        for block in ("self_attn", "mlp"):
            sub = getattr(layer, block, None)
            if sub is None:
                continue
            out.extend(p for p in sub.parameters() if not hasattr(p, "device_mesh"))
    return out


def is_sharded(model: nn.Module) -> bool:
    return any(hasattr(p, "device_mesh") for p in model.parameters())


def load_full(model: nn.Module):
    """An `apply` for weight sync: full tensors in, each rank copies its own shard (no communication)."""
    from torch.distributed.tensor import distribute_tensor

    params = dict(model.named_parameters())

    def apply(state: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for raw, full in state.items():
                name = raw.removeprefix("module.")
                p = params.get(name)
                if p is None:
                    raise ExecutionError(f"weight sync: the receiving model has no parameter {raw!r}")
                if hasattr(p, "device_mesh"):
                    shard = distribute_tensor(full.to(p.dtype), p.device_mesh, p.placements, src_data_rank=None)
                    p.to_local().copy_(shard.to_local())
                else:
                    p.copy_(full)

    return apply
