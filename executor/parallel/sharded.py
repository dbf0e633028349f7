"""One rank's share of a tensor- and/or pipeline-parallel task, and the collectives its training needs.

A replica of a task with layout DP×TP×PP is `pp` stages of `tp` ranks. This rank holds the layers
of its stage (`pipeline.StageModule`), sharded over its stage's TP group by torch's tensor-parallel
API (`tensorpar.tensor_parallel`), and runs its micro-batches through torch's pipelining schedules.

Data parallelism across replicas is an explicit all-reduce of each rank's *local* gradient shard
over the ranks that hold the same shard in the other replicas (same stage, same TP position), not
DDP or a 2-D DeviceMesh, because:
- DDP does not wrap modules whose parameters are DTensors, and FSDP/HSDP would shard the optimizer
  over replicas, which a plan's uneven, device-balanced batch shares do not ask for;
- the learner already divides each replica's loss by the *global* token count (all-reduced over the
  same data-parallel group), so the average of the replicas' gradients is the whole batch's gradient
  whatever the shares — one bucketed all-reduce per step is all DDP would have added;
- the same few lines serve TP, PP and TP×PP alike.

Before each optimizer step (`finish_gradients`): gradients of the un-sharded parameters that act on
head-sharded activations (Qwen3's per-head q/k norms) are partial sums per TP rank and are summed
over the TP group; the two copies of a tied embedding (first and last stage) are summed; then every
gradient is averaged over the data-parallel group. The gradient norm for clipping is the norm of the
whole model's gradient (sharded parts summed over the replica's ranks, replicated parts counted
once), so clipping acts exactly as it does on one device.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hetprof.errors import ExecutionError
from hetprof.executor.parallel.pipeline import Pipeline, StageModule, owner_stage, skeleton
from hetprof.executor.parallel.tensorpar import partial_grad_params, tensor_parallel


@dataclasses.dataclass(frozen=True)
class Position:
    """Where a rank sits in its task: replica, pipeline stage, and TP index within the stage."""

    replica: int
    stage: int
    tp_index: int
    replicas: int
    stages: int
    tp: int

    @property
    def unit(self) -> str:
        """The checkpoint unit this rank's state belongs to (shared by every replica)."""
        return f"stage{self.stage}-tp{self.tp_index}"


def _is_dtensor(t: torch.Tensor) -> bool:
    return hasattr(t, "device_mesh")


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if _is_dtensor(t) else t


class ShardedModel:
    """This rank's part of a TP and/or PP task (a model built whole and seeded alike on every rank).

    `head` is "lm" for causal LMs, "value" for scalar-head (critic / reward) models.
    """

    def __init__(self, model: nn.Module, topo: Any, groups: Any, task: str, rank: int, device: torch.device,
                 head: str, micro_batches: int | None = None):
        tr = topo.tasks[task]
        self.task, self.rank, self.device = task, rank, device
        replica = tr.replica_of(rank)
        self.pos = Position(*tr.position(rank), replicas=len(tr.ranks), stages=tr.pp, tp=tr.tp_of(replica))
        self.topo = topo
        self.groups = groups
        self.pipeline: Pipeline | None = None
        self.bounds = list(tr.stage_layers[self.pos.replica])
        p = self.pos
        if p.stages > 1:
            self.reference = skeleton(model)  # full names/shapes for the weight-sync manifest
            lo, hi = self.bounds[p.stage]
            stage = StageModule(model, lo, hi, p.stage == 0, p.stage == p.stages - 1, head)
            self.module: nn.Module = stage
        else:
            self.reference = model
            self.module = model
        if p.tp > 1:
            tensor_parallel(self.module, groups.tensor(task, p.replica, p.stage), device.type, task)
        self.partial = {id(q) for q in partial_grad_params(self.module)} if p.tp > 1 else set()
        if p.stages > 1:
            cfg = (model.config if head == "lm" else model.backbone.config)
            ranks = topo.pipeline_ranks(task, p.replica, p.tp_index)
            self.pipeline = Pipeline(stage, p.stage, p.stages, groups.pipeline(task, p.replica, p.tp_index),
                                     ranks, device, cfg.hidden_size, getattr(cfg, "vocab_size", 0),
                                     next(stage.parameters()).dtype, micro_batches or p.stages)
        self.dp_group = groups.data(task, p.stage, p.tp_index) if p.replicas > 1 else None
        self.replica_group = groups.replica(task, p.replica)
        tie = groups.tied(task, p.replica, p.tp_index) if p.stages > 1 else None
        self.tie_group = tie if isinstance(self.module, StageModule) and self.module.tied else None

    # ---- what the learner and the roles use ------------------------------------------------------
    def parameters(self) -> list[nn.Parameter]:
        return list(self.module.parameters())

    def _tied_copy(self) -> nn.Parameter | None:
        return self.module.tied_copy() if isinstance(self.module, StageModule) else None

    @torch.no_grad()
    def lockstep(self) -> contextlib.AbstractContextManager[None]:
        """Forwards its replicas run in any number: nothing to keep in step (see ExpertParallel)."""
        return contextlib.nullcontext()

    def finish_gradients(self) -> None:
        """TP partial sums, tied-embedding sum, then the data-parallel average (see module doc)."""
        params = self.parameters()
        for q in params:
            if q.grad is None:  # keep every rank's collectives the same shape
                q.grad = torch.zeros_like(q)
        if self.partial:
            grads = [q.grad for q in params if id(q) in self.partial]
            all_reduce_flat(grads, self.groups.tensor(self.task, self.pos.replica, self.pos.stage))
        tied = self._tied_copy()
        if self.tie_group is not None and tied is not None:
            dist.all_reduce(_local(tied.grad), group=self.tie_group)
        if self.dp_group is not None:
            all_reduce_flat([_local(q.grad) for q in params], self.dp_group, divide=self.pos.replicas)

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float) -> float:
        """Clip by the whole model's gradient norm (as torch's clip_grad_norm_ on one device)."""
        tied = self._tied_copy()
        skip = id(tied) if tied is not None and self.pos.stage == self.pos.stages - 1 and self.pos.stage > 0 else None
        sq = torch.zeros((), dtype=torch.float64, device=self.device)
        for q in self.parameters():
            if q.grad is None or id(q) == skip:
                continue
            if _is_dtensor(q.grad):
                sq += _local(q.grad).double().pow(2).sum()
            elif self.pos.tp_index == 0:  # replicated over the TP group: counted once
                sq += q.grad.double().pow(2).sum()
        if self.replica_group is not None:
            dist.all_reduce(sq, group=self.replica_group)
        norm = float(sq.sqrt())
        coef = min(1.0, max_norm / (norm + 1e-6))
        if coef < 1.0:
            for q in self.parameters():
                if q.grad is not None:
                    _local(q.grad).mul_(coef)
        return norm

    # ---- weights out -------------------------------------------------------------------------
    def full_state(self) -> dict[str, torch.Tensor] | None:
        """The whole model's weights as full tensors, on replica 0's first rank (None elsewhere).

        Every rank of replica 0 takes part (TP: gather each shard over the stage's TP group; PP:
        each stage's first TP rank sends its stage to stage 0); other replicas hold the same
        weights and take no part.
        """
        p = self.pos
        if p.replica != 0:
            return None
        if isinstance(self.module, StageModule):
            named = self.module.owned()
        else:
            named = dict(self.module.named_parameters())
        full = {n: (q.full_tensor() if _is_dtensor(q) else q).detach() for n, q in named.items()}
        if p.stages == 1:
            return full if p.tp_index == 0 else None
        if p.tp_index != 0:
            return None
        group = self.groups.pipeline(self.task, 0, 0)
        ranks = self.topo.pipeline_ranks(self.task, 0, 0)
        names = [n for n, _ in self.reference.named_parameters()]
        shapes = dict(self.reference.named_parameters())
        if p.stage != 0:
            for _dtype, chunk in _by_dtype([(n, full[n]) for n in names if n in full]):
                dist.send(torch.cat([t.reshape(-1) for _, t in chunk]), ranks[0], group=group)
            return None
        out: dict[str, torch.Tensor] = {}
        for s in range(p.stages):
            mine = [n for n in names if owner_stage(n, self.bounds) == s]
            if s == 0:
                out.update({n: full[n] for n in mine})
                continue
            for dtype, chunk in _by_dtype([(n, shapes[n]) for n in mine]):
                buf = torch.empty(sum(t.numel() for _, t in chunk), dtype=dtype, device=self.device)
                dist.recv(buf, ranks[s], group=group)
                for (n, t), v in zip(chunk, torch.split(buf, [t.numel() for _, t in chunk]), strict=True):
                    out[n] = v.view(t.shape)
        missing = [n for n in names if n not in out]
        if missing:
            raise ExecutionError(f"{self.task}: gathering the weights found no stage holding {missing[:3]}")
        return {n: out[n] for n in names}

    # ---- checkpoints: per (stage, TP position), replica 0 writes, every replica reads -------------
    def local_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        model = {k: _local(v).detach().clone() for k, v in self.module.state_dict().items()}
        opt = optimizer.state_dict()
        opt = {**opt, "state": {i: {k: _local(v) if isinstance(v, torch.Tensor) else v for k, v in st.items()}
                                for i, st in opt["state"].items()}}
        return {"model": model, "optimizer": opt}

    @torch.no_grad()
    def load_local_state(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        own = self.module.state_dict()
        if set(own) != set(state["model"]):
            raise ExecutionError(f"{self.task}: checkpoint holds other parameters than this stage "
                                 f"({sorted(set(own) ^ set(state['model']))[:3]})")
        for k, v in own.items():
            _local(v).copy_(state["model"][k])
        optimizer.load_state_dict(state["optimizer"])
        from torch.distributed.tensor import DTensor

        for group in optimizer.param_groups:
            for q in group["params"]:
                if not _is_dtensor(q):
                    continue
                st = optimizer.state.get(q, {})
                for k, v in list(st.items()):
                    if isinstance(v, torch.Tensor) and not _is_dtensor(v) and v.shape == _local(q).shape and k != "step":
                        st[k] = DTensor.from_local(v, q.device_mesh, q.placements, run_check=False,
                                                   shape=q.shape, stride=q.stride())


def _by_dtype(named: list[tuple[str, torch.Tensor]]) -> list[tuple[torch.dtype, list[tuple[str, torch.Tensor]]]]:
    out: dict[torch.dtype, list[tuple[str, torch.Tensor]]] = {}
    for n, t in named:
        out.setdefault(t.dtype, []).append((n, t))
    return list(out.items())


def all_reduce_flat(tensors: list[torch.Tensor], group: dist.ProcessGroup, divide: int = 1) -> None:
    """Sum (then divide) tensors over `group` with one all-reduce per dtype, results in place."""
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    by: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by.setdefault(t.dtype, []).append(t)
    for ts in by.values():
        flat = _flatten_dense_tensors(ts)
        dist.all_reduce(flat, group=group)
        if divide != 1:
            flat.div_(divide)
        for t, v in zip(ts, _unflatten_dense_tensors(flat, ts), strict=True):
            t.copy_(v)
