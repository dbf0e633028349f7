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

Every forward of an expert-sharded model is a collective of its EP group, so the group's ranks must
run the same number of forwards. Training does (the learner agrees on every micro-batch count, and a
replica without rows runs a zero-weight one); a forward-only pass over a replica's own rows does not
(its packs and rows differ), so it runs in `expert_lockstep`: each forward first says "busy" to the
group, and a rank done with its rows keeps serving the others' dispatches with empty ones until no
rank is busy.

`ExpertParallel` is a trained replica's side of it, what the learner calls as it calls a TP/PP
task's `parallel.ShardedModel`: the expert gradients summed over the EP group and averaged over the
replicas holding the same experts, the rest averaged over every replica, the clip norm of the whole
model, and the full weights (expert shards gathered) for weight sync, exports and checkpoints —
a checkpoint holds the whole model, as one replica's would.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.nn.functional import all_to_all_single

from hetprof.executor.models.modeling import moe_blocks
from hetprof.executor.parallel.pipeline import Manifest
from hetprof.executor.parallel.sharded import all_reduce_flat


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
        self.announces = False  # in `expert_lockstep`, the model's first shard says "busy" per forward

    def busy(self, flag: int) -> bool:
        """Whether any rank of the group is still running a forward of its own (this one: `flag`)."""
        t = torch.tensor([flag], dtype=torch.int64, device=self.gate_up_proj.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return bool(t.item())

    def serve(self) -> None:
        """Join the group's dispatch and combine with no tokens of this rank's: run what others send."""
        hidden = self.gate_up_proj.new_empty(0, self.gate_up_proj.shape[-1])
        index = torch.empty(0, 1, dtype=torch.int64, device=hidden.device)
        self(hidden, index, hidden.new_empty(0, 1))

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        if self.announces:
            self.busy(1)
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
    for module in moe_blocks(model):
        experts = module.experts
        if not isinstance(experts, ExpertShard):
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


def expert_shards(model: nn.Module) -> list[ExpertShard]:
    """The model's expert shards in layer order (none: its experts are whole)."""
    return [m for m in model.modules() if isinstance(m, ExpertShard)]


@contextlib.contextmanager
def expert_lockstep(model: nn.Module) -> Iterator[None]:
    """Forwards of `model` that its EP group's ranks run in different numbers (the module docstring):
    on leaving, this rank serves the others' forwards until none is busy. Nothing for whole experts."""
    shards = expert_shards(model)
    if not shards:
        yield
        return
    lead = shards[0]
    lead.announces = True
    try:
        yield
    finally:
        lead.announces = False
    with torch.no_grad():
        while lead.busy(0):
            for shard in shards:
                shard.serve()


class ExpertParallel:
    """A trained whole-model replica with its experts split over `expert_group` (the module docstring).

    `data_group`: every replica of the task (None: one replica); `expert_data_group`: the replicas
    holding the same experts, one per EP group (None: one EP group); `replicas`: the task's replicas.
    """

    pipeline = None  # whole-model replicas: no pipeline stages

    def __init__(self, model: nn.Module, expert_group: dist.ProcessGroup | None,
                 data_group: dist.ProcessGroup | None, expert_data_group: dist.ProcessGroup | None,
                 replicas: int) -> None:
        self.reference = Manifest(model)  # full names and shapes: the weight-sync manifest
        self.module = model
        self.shards = shard_experts(model, expert_group)
        self.expert_group = expert_group
        self.dp_group = data_group
        self.expert_data_group = expert_data_group
        self.replicas = replicas
        self._shard_of = {id(p): s for s in self.shards for p in (s.gate_up_proj, s.down_proj)}

    def lockstep(self) -> contextlib.AbstractContextManager[None]:
        """Forwards this replica runs in a number its EP group's other ranks need not match."""
        return expert_lockstep(self.module)

    def _split(self) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
        """(every rank's whole parameters, this rank's expert shards)."""
        params = list(self.module.parameters())
        return [q for q in params if id(q) not in self._shard_of], [q for q in params if id(q) in self._shard_of]

    @torch.no_grad()
    def finish_gradients(self) -> None:
        """The data-parallel average: whole parameters over every replica; expert shards over their EP
        group (summed by the combine's backward, `average_expert_grads`) and the replicas holding them."""
        for q in self.module.parameters():
            if q.grad is None:  # keep every rank's collectives the same shape
                q.grad = torch.zeros_like(q)
        whole, experts = self._split()
        if self.dp_group is not None:
            all_reduce_flat([q.grad for q in whole], self.dp_group, divide=self.replicas)
        average_expert_grads(self.shards)
        if self.expert_data_group is not None:
            all_reduce_flat([q.grad for q in experts], self.expert_data_group,
                            divide=dist.get_world_size(self.expert_data_group))

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float) -> float:
        """Clip by the whole model's gradient norm: whole parameters once, every rank's experts added."""
        whole, experts = self._split()
        device = next(self.module.parameters()).device
        sq = torch.zeros((), dtype=torch.float64, device=device)
        for q in experts:
            sq += q.grad.double().pow(2).sum()
        if experts:
            dist.all_reduce(sq, group=self.expert_group)
        for q in whole:
            sq += q.grad.double().pow(2).sum()
        norm = math.sqrt(float(sq))
        coef = min(1.0, max_norm / (norm + 1e-6))
        if coef < 1.0:
            for q in self.module.parameters():
                q.grad.mul_(coef)
        return norm

    # ---- the full model: gathered expert shards ------------------------------------------------------
    def _gather(self, t: torch.Tensor, shard: ExpertShard) -> torch.Tensor:
        parts = [torch.empty_like(t) for _ in range(shard.world)]
        dist.all_gather(parts, t.detach().contiguous(), group=self.expert_group)
        return torch.cat(parts)

    def full_state(self) -> dict[str, torch.Tensor]:
        """The whole model's parameters as full tensors, on every rank (a collective of the EP group)."""
        return {n: self._gather(q, self._shard_of[id(q)]) if id(q) in self._shard_of else q.detach()
                for n, q in self.module.named_parameters()}

    def full_training_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """Model and optimizer state of the whole model, as one replica holding every expert has it
        (a collective of the EP group: every rank calls it)."""
        shards = {n: self._shard_of[id(q)] for n, q in self.module.named_parameters() if id(q) in self._shard_of}
        model = {k: self._gather(v, shards[k]) if k in shards else v for k, v in self.module.state_dict().items()}
        opt = optimizer.state_dict()
        state = {}
        for i, q in enumerate(self._optimized(optimizer)):
            shard = self._shard_of.get(id(q))
            st = opt["state"].get(i)
            if st is not None and shard is not None:
                st = {k: self._gather(v, shard) if _moment(v, q.shape) else v for k, v in st.items()}
            if st is not None:
                state[i] = st
        return {"model": model, "optimizer": {**opt, "state": state}}

    @torch.no_grad()
    def load_full_training_state(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """What `full_training_state` took: every rank keeps its experts' slice."""
        names = {n: s for n, q in self.module.named_parameters() if (s := self._shard_of.get(id(q))) is not None}
        self.module.load_state_dict({k: _slice(v, names[k]) if k in names else v for k, v in state["model"].items()})
        opt = state["optimizer"]
        own = {}
        for i, q in enumerate(self._optimized(optimizer)):
            shard = self._shard_of.get(id(q))
            st = opt["state"].get(i)
            if st is not None and shard is not None:
                full = (shard.total, *q.shape[1:])
                st = {k: _slice(v, shard) if _moment(v, full) else v for k, v in st.items()}
            if st is not None:
                own[i] = st
        optimizer.load_state_dict({**opt, "state": own})

    @staticmethod
    def _optimized(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
        """The optimizer's parameters in its state dict's numbering."""
        return [q for group in optimizer.param_groups for q in group["params"]]


def _moment(value: Any, shape: tuple[int, ...] | torch.Size) -> bool:
    """Whether an optimizer state entry is a per-element tensor of a parameter of `shape` (not `step`)."""
    return isinstance(value, torch.Tensor) and value.dim() > 0 and tuple(value.shape) == tuple(shape)


def _slice(t: torch.Tensor, shard: ExpertShard) -> torch.Tensor:
    if t.shape[0] != shard.total:
        raise ValueError(f"an expert tensor of {t.shape[0]} experts where the model has {shard.total}")
    return t[shard.first:shard.first + shard.count]
