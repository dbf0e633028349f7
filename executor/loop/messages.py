"""Point-to-point messages between ranks: tensor dicts on the wire, their tags, and the outbox.

Rollouts, inference inputs and results, training slices and iteration reports travel between ranks
as {name: tensor}. Each message is two sends whatever the number of tensors: the sizes, then one
byte buffer holding a JSON header (names, dtypes, shapes, offsets) followed by every tensor's bytes,
because per-send latency, not bandwidth, dominates these small messages. A tag is
`batch * KINDS_PER_BATCH + kind`, so messages of different kinds and of different batches in flight
(async runs) never match each other's receives.
"""

from __future__ import annotations

import datetime
import json
from enum import IntEnum, unique

import torch
import torch.distributed as dist

from hetprof.errors import ExecutionError
from hetprof.specs.vocabulary import Task


@unique  # a tag is told apart by its kind's value: two kinds with one value would alias silently
class MessageKind(IntEnum):
    """What a message carries; one tag space per batch."""

    ROLLOUT = 1
    ACTOR_TRAIN_INPUT = 2
    CRITIC_TRAIN_INPUT = 3
    REF_INFER_INPUT = 4
    REWARD_INFER_INPUT = 5
    CRITIC_INFER_INPUT = 6
    REF_INFER_RESULT = 7
    REWARD_INFER_RESULT = 8
    CRITIC_INFER_RESULT = 9
    ACTOR_LOGPROB_INPUT = 12  # beside the other forward passes; values need only be unique
    ACTOR_LOGPROB_RESULT = 13
    REPORT = 10
    VALIDATION = 11  # generation replica 0's validation scores, to the leader (evaluation.py)


KINDS_PER_BATCH = 16  # room above the kinds in use, so adding one keeps old tags stable
INPUT_KIND = {Task.ACTOR_LOGPROB: MessageKind.ACTOR_LOGPROB_INPUT, Task.REF_INFER: MessageKind.REF_INFER_INPUT,
              Task.REWARD_INFER: MessageKind.REWARD_INFER_INPUT, Task.CRITIC_INFER: MessageKind.CRITIC_INFER_INPUT,
              Task.ACTOR_TRAIN: MessageKind.ACTOR_TRAIN_INPUT, Task.CRITIC_TRAIN: MessageKind.CRITIC_TRAIN_INPUT}
RESULT_KIND = {Task.ACTOR_LOGPROB: MessageKind.ACTOR_LOGPROB_RESULT, Task.REF_INFER: MessageKind.REF_INFER_RESULT,
               Task.REWARD_INFER: MessageKind.REWARD_INFER_RESULT, Task.CRITIC_INFER: MessageKind.CRITIC_INFER_RESULT}


def message_tag(batch: int, kind: MessageKind) -> int:
    """The tag of a message of `kind` about `batch` (distinct for every pair)."""
    return batch * KINDS_PER_BATCH + int(kind)


def select_rows(tensors: dict[str, torch.Tensor], keys: tuple[str, ...] | None, rows: slice
                ) -> dict[str, torch.Tensor]:
    """The given rows of the named tensors (all of them when `keys` is None), skipping absent names."""
    return {k: tensors[k][rows] for k in (tuple(tensors) if keys is None else keys) if k in tensors}


def concat_padded(parts: list[dict[str, torch.Tensor]], pad_id: int) -> dict[str, torch.Tensor]:
    """Concatenate replica batches whose sequence lengths differ: right-pad [B, T] tensors
    (`input_ids` with `pad_id`, masks and the rest with 0); empty parts are skipped."""
    parts = [p for p in parts if p]
    if not parts:
        return {}
    width = {k: max(p[k].shape[1] for p in parts) for k in parts[0] if parts[0][k].dim() == 2}
    out = {}
    for key in parts[0]:
        if key in width:
            fill = pad_id if key == "input_ids" else 0
            out[key] = torch.cat([torch.nn.functional.pad(p[key], (0, width[key] - p[key].shape[1]), value=fill)
                                  for p in parts])
        else:
            out[key] = torch.cat([p[key] for p in parts])
    return out


def _dtype(name: str) -> torch.dtype:
    value = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise ExecutionError(f"message header names an unknown dtype {name!r}")
    return value


def pack(tensors: dict[str, torch.Tensor], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(sizes [2] int64, buffer uint8) of a tensor dict; `unpack` inverts it."""
    parts, header, offset = [], {}, 0
    for name, t in tensors.items():
        raw = t.detach().contiguous().reshape(-1).view(torch.uint8).to(device)
        header[name] = [str(t.dtype), list(t.shape), offset, raw.numel()]
        parts.append(raw)
        offset += raw.numel()
    head = torch.frombuffer(bytearray(json.dumps(header).encode()), dtype=torch.uint8).to(device)
    buffer = torch.cat([head, *parts]) if parts else head
    return torch.tensor([head.numel(), offset], dtype=torch.int64, device=device), buffer


def unpack(sizes: torch.Tensor, buffer: torch.Tensor) -> dict[str, torch.Tensor]:
    """The tensor dict `pack` turned into (sizes, buffer)."""
    head_len = int(sizes[0])
    header = json.loads(bytes(buffer[:head_len].cpu().numpy().tobytes()).decode())
    data = buffer[head_len:]
    out = {}
    for name, (dtype, shape, offset, nbytes) in header.items():
        out[name] = data[offset:offset + nbytes].clone().view(_dtype(dtype)).reshape(shape)
    return out


class Outbox:
    """Non-blocking sends whose buffers stay alive until delivered (generators run ahead)."""

    def __init__(self, timeout_s: float = 300.0, group: dist.ProcessGroup | None = None) -> None:
        self.group = group
        self._pending: list[tuple[dist.Work, torch.Tensor]] = []
        self.timeout = datetime.timedelta(seconds=timeout_s)

    def send(self, tensors: dict[str, torch.Tensor], dst: int, tag: int, device: torch.device) -> None:
        for t in pack(tensors, device):
            self._pending.append((dist.isend(t, dst, tag=tag, group=self.group), t))
        self._prune()

    def _prune(self) -> None:
        self._pending = [(w, t) for w, t in self._pending if not w.is_completed()]

    def flush(self) -> None:
        for work, _ in self._pending:
            if work.wait(self.timeout) is False:
                raise ExecutionError(f"a message was not delivered within {self.timeout.total_seconds():.0f} s; "
                                     f"its receiver is dead or hung")
        self._pending.clear()


def recv_tensors(src: int, tag: int, device: torch.device, group: dist.ProcessGroup | None = None
                 ) -> dict[str, torch.Tensor]:
    """Block until the tensor dict `src` sent with `tag` arrives (the matching Outbox.send)."""
    sizes = torch.empty(2, dtype=torch.int64, device=device)
    dist.recv(sizes, src, tag=tag, group=group)
    buffer = torch.empty(int(sizes.sum()), dtype=torch.uint8, device=device)
    dist.recv(buffer, src, tag=tag, group=group)
    return unpack(sizes, buffer)
