"""How the data-parallel replicas of one training task stay in step within an update.

Every replica must run the same number of forward/backward passes per optimizer step, or the
gradient all-reduce waits forever; and uneven shares must still give the whole batch's token-mean
gradient. So the replicas agree, with one collective each per update, on every mini-batch's loss
denominator (the global token count) and on its micro-batch count (the most any replica needs);
and gradient all-reduces are skipped on all but the last micro-batch (DDP no_sync / FSDP2 flag).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hetprof.executor.algorithms.base import RLBatch
from hetprof.runtime.tokenbudget import micro_batch_count, micro_batches_by_tokens


class ReplicaCoordination:
    """The collectives and splits one learner's replicas share (a single replica: none)."""

    def __init__(self, model: nn.Module, parallel: Any, process_group: dist.ProcessGroup | None,
                 micro_batches: int, max_tokens: int | None, copies: int = 1) -> None:
        self.model = model
        self.copies = copies  # ranks holding each row: a Ulysses group's size (its ranks share the rows)
        self.parallel = parallel  # a parallel.ShardedModel for TP/PP tasks
        self.process_group = process_group
        self.micro_batches = micro_batches
        self.max_tokens = max_tokens

    def group(self):
        """The group whose replicas average this model's gradients (DDP's own, or the one given for FSDP)."""
        if not dist.is_initialized():
            return None
        if self.parallel is not None:
            return self.parallel.dp_group
        if self.process_group is not None:
            return self.process_group
        if isinstance(self.model, nn.parallel.DistributedDataParallel):
            return self.model.process_group
        return None

    def gradient_sync(self, enabled: bool):
        """Skip the gradient all-reduce on all but the last micro-batch (DDP no_sync / FSDP2 flag)."""
        if self.group() is None or enabled:
            return contextlib.nullcontext()
        no_sync = getattr(self.model, "no_sync", None)
        if callable(no_sync):
            return no_sync()
        setter = getattr(self.model, "set_requires_gradient_sync", None)
        if callable(setter):
            return _fsdp_no_sync(setter)
        return contextlib.nullcontext()

    def denominators(self, mask: torch.Tensor, minis: list[torch.Tensor]) -> list[torch.Tensor]:
        """Token count of each mini-batch for its loss mean: global over the DDP replicas, divided by
        their number. One all-reduce for the whole update, not one per mini-batch: each collective is
        a point where every replica waits for the slowest. The ranks of a Ulysses group hold the same
        rows, so the sum counts each row `copies` times; every rank then backpropagates the group's
        whole loss over its slice, and the group's gradients add up to that loss's gradient."""
        tokens = torch.stack([mask[idx].float().sum() for idx in minis]) if minis else mask.new_zeros(0).float()
        group = self.group()
        replicas = 1
        if group is not None and len(minis):
            dist.all_reduce(tokens, group=group)
            replicas = dist.get_world_size(group)
        return replica_denominators(tokens / self.copies, replicas)

    def micro_counts(self, attention_mask: torch.Tensor, minis: list[torch.Tensor]) -> list[int]:
        """Micro-batches per mini-batch: the fixed count, or with a token budget the most any replica
        needs (one MAX all-reduce for the update), so every replica runs as many passes as the others."""
        if self.max_tokens is None:
            return [self.micro_batches] * len(minis)
        lengths = attention_mask.sum(1)
        needed = torch.tensor([micro_batch_count(lengths[idx].tolist(), self.max_tokens) for idx in minis],
                              dtype=torch.long, device=attention_mask.device)
        group = self.group()
        if group is not None and len(minis):
            dist.all_reduce(needed, op=dist.ReduceOp.MAX, group=group)
        return needed.tolist()

    def micro_parts(self, mini: RLBatch, count: int) -> list[torch.Tensor]:
        """Row indices of each micro-batch of `mini`: equal row counts, or token-budget packs."""
        device = mini.input_ids.device
        if self.max_tokens is None:
            return list(torch.tensor_split(torch.arange(len(mini), device=device), count))
        groups = micro_batches_by_tokens(mini.attention_mask.sum(1).tolist(), self.max_tokens, count)
        return [torch.tensor(g, dtype=torch.long, device=device) for g in groups]


@contextlib.contextmanager
def _fsdp_no_sync(setter):
    setter(False)
    try:
        yield
    finally:
        setter(True)


def replica_denominators(global_tokens: torch.Tensor, replicas: int) -> list[torch.Tensor]:
    """Each mini-batch's loss denominator on one data-parallel replica.

    Data parallelism averages gradients over the replicas, so a replica divides its token sum by
    the global token count over the replica count; the averaged gradient is then the global token
    mean. The count is floored at one token *before* the division: flooring after it would give a
    batch of one token over two replicas a half-size update.
    """
    return list((global_tokens.float().clamp(min=1.0) / replicas).unbind())
