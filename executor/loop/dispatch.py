"""How a batch moves between the leader and a task's replicas: scatter by the plan's shares, gather results.

Learnt from verl's dispatch modes (split the data over the data-parallel ranks, call, collect the
outputs): the leader splits a batch over a task's replicas by the plan's batch shares and sends a
replica's rows to every rank of it (its TP ranks and pipeline stages compute on the same rows; a
Ulysses group's `sp` replicas take their shares' rows together, TaskRanks.batch_groups);
each group's lead sends its result back; the leader concatenates them in group order. Sends
never block (the outbox keeps their buffers alive) and a rank only ever waits for data an earlier
phase of the loop produces, so the order cannot deadlock.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from hetprof.errors import ExecutionError
from hetprof.executor.loop.messages import (
    MessageKind,
    Outbox,
    concat_padded,
    message_tag,
    recv_tensors,
    select_rows,
)
from hetprof.executor.parallel.batch_split import share_slices, token_share_slices
from hetprof.executor.parallel.topology import TaskRanks, Topology


def receive_or_explain(topo: Topology, rank: int, src: int, tag: int, device: torch.device,
                       group: dist.ProcessGroup | None, what: str) -> dict[str, torch.Tensor]:
    """Receive a tensor dict from a peer; a dead or hung peer becomes an error that names both ranks."""
    try:
        return recv_tensors(src, tag, device, group)
    except (RuntimeError, dist.DistError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ExecutionError(f"{topo.describe(rank)} got no {what} from {topo.describe(src)}: {first}") from None


class Exchange:
    """One rank's end of the loop's messages (see the module docstring)."""

    def __init__(self, topo: Topology, rank: int, device: torch.device, group: dist.ProcessGroup | None,
                 timeout_s: float, by_tokens: bool = False) -> None:
        self.topo = topo
        self.by_tokens = by_tokens  # packed passes cost tokens: shares split tokens, not rows
        self.rank = rank
        self.device = device
        self.leader = topo.leader
        self.is_leader = rank == self.leader
        self.group = group
        # With a separate (gloo) message group, tensors cross through host memory.
        self.wire_device = torch.device("cpu") if group is not None else device
        self.outbox = Outbox(timeout_s, group)

    def send(self, tensors: dict[str, torch.Tensor], dst: int, kind: MessageKind, batch: int) -> None:
        self.outbox.send(tensors, dst, message_tag(batch, kind), self.wire_device)

    def receive(self, src: int, kind: MessageKind, batch: int, what: str) -> dict[str, torch.Tensor]:
        got = receive_or_explain(self.topo, self.rank, src, message_tag(batch, kind), self.wire_device,
                                 self.group, what)
        return {k: v.to(self.device) for k, v in got.items()}

    def scatter(self, batch: dict[str, torch.Tensor] | None, task: TaskRanks, kind: MessageKind, batch_index: int,
                keys: tuple[str, ...] | None = None) -> dict[str, torch.Tensor] | None:
        """The leader sends each replica its rows (`keys` of them, all when None); returns this rank's
        rows when it runs the task, else None. Every rank calls it; only the leader passes `batch`."""
        if self.is_leader:
            assert batch is not None
            slices = (token_share_slices(batch["attention_mask"].sum(1).tolist(), task.batch_shares)
                      if self.by_tokens else share_slices(batch["input_ids"].shape[0], task.batch_shares))
            for members, rows in zip(task.batch_groups, slices, strict=True):
                for r in members:
                    if r != self.rank:
                        self.send(select_rows(batch, keys, rows), r, kind, batch_index)
        if self.rank not in task.all_ranks:
            return None
        if self.is_leader:
            return select_rows(batch, keys, slices[task.batch_group_of(self.rank)])
        return self.receive(self.leader, kind, batch_index, f"{task.task} inputs of batch {batch_index}")

    def to_leader(self, tensors: dict[str, torch.Tensor], kind: MessageKind, batch_index: int) -> None:
        """A replica lead's result on its way to the leader (the leader keeps its own)."""
        if not self.is_leader:
            self.send(tensors, self.leader, kind, batch_index)

    def collect(self, own: dict[str, torch.Tensor] | None, sources: tuple[int, ...], kind: MessageKind,
                batch_index: int, what: str, pad_id: int) -> dict[str, torch.Tensor]:
        """On the leader: every source's tensors in order (its own from `own`), right-padded and joined."""
        parts = [own if r == self.rank else self.receive(r, kind, batch_index, f"{what} of batch {batch_index}")
                 for r in sources]
        return concat_padded([p for p in parts if p is not None], pad_id)

    def flush(self) -> None:
        self.outbox.flush()
