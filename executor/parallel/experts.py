"""Expert parallelism: an MoE layer's routed experts split over the ranks of a process group.

Each rank keeps its data-parallel share of the tokens and 1/ep of every MoE layer's experts
(consecutive ids: rank r holds experts [r·E/ep, (r+1)·E/ep)). A layer routes as before, then
dispatches every (token, chosen expert) pair's hidden state to the rank holding that expert in one
all-to-all, runs the rank's experts on what it received, and sends the outputs back in a second
(combine); the routing weights are applied where the token lives. Both all-to-alls are autograd
functions (torch.distributed.nn), so the backward sends the gradients the same way and each rank's
experts collect the gradient of every rank's tokens: a sum over the EP group, where data
parallelism averages — `average_expert_grads` divides by the group's size so an update equals the
single-device one. Written against transformers' Qwen3-MoE block (Qwen3MoeSparseMoeBlock: a router
`gate` and `experts` holding 3-D gate_up_proj / down_proj tensors).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.nn.functional import all_to_all_single


class ExpertShard(nn.Module):
    """The experts [first, first + count) of one MoE layer, run for every rank of `group`."""

    def __init__(self, experts: nn.Module, group: dist.ProcessGroup | None = None) -> None:
        super().__init__()
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        total = experts.num_experts
        if total % world:
            raise ValueError(f"{total} experts do not split over {world} expert-parallel ranks")
        self.group, self.world, self.total = group, world, total
        self.count = total // world
        self.first = rank * self.count
        self.act_fn = experts.act_fn
        span = slice(self.first, self.first + self.count)
        self.gate_up_proj = nn.Parameter(experts.gate_up_proj.detach()[span].clone())
        self.down_proj = nn.Parameter(experts.down_proj.detach()[span].clone())

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        tokens, k = top_k_index.shape
        flat = top_k_index.reshape(-1)
        order = torch.argsort(flat // self.count, stable=True)   # pairs grouped by destination rank
        send_counts = torch.bincount(flat // self.count, minlength=self.world)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=self.group)
        sends, recvs = send_counts.tolist(), recv_counts.tolist()
        source = order // k                                       # the token of each sent pair
        received = all_to_all_single(hidden_states.new_empty(sum(recvs), hidden_states.shape[-1]),
                                     hidden_states[source], recvs, sends, group=self.group)
        ids = flat.new_empty(sum(recvs))
        dist.all_to_all_single(ids, flat[order].contiguous(), recvs, sends, group=self.group)
        computed = self._run(received, ids - self.first)
        back = all_to_all_single(hidden_states.new_empty(tokens * k, hidden_states.shape[-1]), computed,
                                 sends, recvs, group=self.group)
        weights = top_k_weights.reshape(-1)[order].unsqueeze(-1).to(back.dtype)
        out = torch.zeros_like(hidden_states)
        return out.index_add(0, source, back * weights)

    def _run(self, rows: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
        """Each received row through its local expert (SwiGLU: gate·up, then down)."""
        out = rows.new_zeros(rows.shape)
        for e in torch.unique(local).tolist():
            at = (local == e).nonzero(as_tuple=True)[0]
            gate, up = nn.functional.linear(rows[at], self.gate_up_proj[e]).chunk(2, dim=-1)
            out = out.index_put((at,), nn.functional.linear(self.act_fn(gate) * up, self.down_proj[e]))
        return out


def shard_experts(model: nn.Module, group: dist.ProcessGroup | None = None) -> list[ExpertShard]:
    """Replace every MoE layer's experts of `model` with this rank's ExpertShard (in place); the shards."""
    shards = []
    for module in list(model.modules()):
        experts = getattr(module, "experts", None)
        if isinstance(experts, nn.Module) and hasattr(experts, "gate_up_proj") and hasattr(module, "gate"):
            shard = ExpertShard(experts, group)
            module.experts = shard
            shards.append(shard)
    return shards


def average_expert_grads(shards: list[ExpertShard]) -> None:
    """Expert gradients as data parallelism's average: each shard collected the sum over its group's
    ranks (their losses are per-rank means), so divide by the group's size."""
    for shard in shards:
        for p in (shard.gate_up_proj, shard.down_proj):
            if p.grad is not None:
                p.grad.div_(shard.world)
