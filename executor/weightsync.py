"""Trainer → generator weight sync: a broadcast of flattened buckets over the plan's sync group.

One broadcast per parameter is latency-bound for the hundreds of small tensors of a transformer
(norms, biases), while one broadcast of the whole model needs a second full copy in memory. Buckets
of a bounded size (default 32 MB) keep both costs down; tensors of one dtype share a bucket so the
flat buffer needs no casts, which keeps the copy on the generators bitwise equal to the trainer's.
A `wire_dtype` (bf16 generators fed by an fp32 trainer) casts on the sender, once, so the buckets
both sides derive agree and the generator gets exactly the trainer's weights rounded to its dtype.
Each sync first broadcasts the weight version, so a generator knows which version it holds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist

from hetprof.errors import ExecutionError

DEFAULT_BUCKET_MB = 32.0


@dataclasses.dataclass(frozen=True)
class Bucket:
    """Parameters sent together as one flat buffer, in a fixed order both sides agree on."""

    names: tuple[str, ...]
    shapes: tuple[torch.Size, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        return sum(s.numel() for s in self.shapes)

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.dtype).element_size()


def make_buckets(named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: float) -> list[Bucket]:
    """Group tensors into buckets of at most `bucket_bytes` (a larger tensor gets its own bucket).

    The order is the iteration order of `named`, split by dtype, so sender and receivers that list
    the same model get the same buckets without exchanging a manifest.
    """
    by_dtype: dict[torch.dtype, list[tuple[str, torch.Tensor]]] = {}
    for name, tensor in named:
        by_dtype.setdefault(tensor.dtype, []).append((name, tensor))
    buckets: list[Bucket] = []
    for dtype, items in by_dtype.items():
        names: list[str] = []
        shapes: list[torch.Size] = []
        size = 0
        for name, tensor in items:
            nbytes = tensor.numel() * tensor.element_size()
            if names and size + nbytes > bucket_bytes:
                buckets.append(Bucket(tuple(names), tuple(shapes), dtype))
                names, shapes, size = [], [], 0
            names.append(name)
            shapes.append(tensor.shape)
            size += nbytes
        if names:
            buckets.append(Bucket(tuple(names), tuple(shapes), dtype))
    return buckets


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor even when it is an FSDP/DTensor shard (gathers it)."""
    full = getattr(tensor, "full_tensor", None)
    return full() if callable(full) else tensor


@dataclasses.dataclass
class SyncStats:
    seconds: float
    bytes: int
    buckets: int

    @property
    def bandwidth_Bps(self) -> float:
        return self.bytes / self.seconds if self.seconds > 0 else float("inf")


class WeightSync:
    """Broadcasts a model's parameters from `src` (a global rank) to the rest of `group`.

    The sender calls `send(named_parameters)`; each receiver calls `receive(apply)` where `apply`
    gets one bucket's {name: tensor} at a time (the generation backend's load_state_dict), so a
    receiver never holds a second full copy of the model.
    """

    def __init__(self, group: dist.ProcessGroup | None, src: int, reference: Iterable[tuple[str, torch.Tensor]],
                 bucket_mb: float = DEFAULT_BUCKET_MB, device: torch.device | str = "cpu",
                 wire_dtype: torch.dtype | None = None):
        self.group = group
        self.src = src
        self.device = torch.device(device)
        self.wire_dtype = wire_dtype
        if wire_dtype is not None:
            reference = ((n, t.detach().to(wire_dtype)) for n, t in reference)
        self.buckets = make_buckets(reference, bucket_mb * 1e6)
        self.names = [n for b in self.buckets for n in b.names]

    @property
    def total_bytes(self) -> int:
        return sum(b.nbytes for b in self.buckets)

    def check_names(self, names: Iterable[str], who: str) -> None:
        """Refuse to start when the two sides list different parameters (different architectures)."""
        theirs = set(names)
        ours = set(self.names)
        if theirs != ours:
            extra, missing = sorted(theirs - ours)[:3], sorted(ours - theirs)[:3]
            raise ExecutionError(f"weight sync: {who} has parameters that differ from the trainer's "
                                 f"(only on {who}: {extra}, only on trainer: {missing})")

    def send(self, named: Iterable[tuple[str, torch.Tensor]], version: int = 0) -> SyncStats:
        params = dict(named)
        start = time.perf_counter()
        dist.broadcast(torch.tensor([version], dtype=torch.int64, device=self.device), self.src, group=self.group)
        with torch.no_grad():
            for bucket in self.buckets:
                flat = torch.cat([_full(params[n]).detach().reshape(-1).to(self.device, bucket.dtype)
                                  for n in bucket.names])
                dist.broadcast(flat, self.src, group=self.group)
        return SyncStats(time.perf_counter() - start, self.total_bytes, len(self.buckets))

    def receive(self, apply: Callable[[dict[str, torch.Tensor]], None]) -> tuple[SyncStats, int]:
        """Receive one sync; returns its stats and the weight version it carried."""
        start = time.perf_counter()
        version = torch.empty(1, dtype=torch.int64, device=self.device)
        dist.broadcast(version, self.src, group=self.group)
        for bucket in self.buckets:
            flat = torch.empty(bucket.numel, dtype=bucket.dtype, device=self.device)
            dist.broadcast(flat, self.src, group=self.group)
            views = torch.split(flat, [s.numel() for s in bucket.shapes])
            apply({n: v.view(s) for n, v, s in zip(bucket.names, views, bucket.shapes, strict=True)})
        return SyncStats(time.perf_counter() - start, self.total_bytes, len(self.buckets)), int(version.item())


def copy_into(model: torch.nn.Module) -> Callable[[dict[str, torch.Tensor]], None]:
    """An `apply` for `receive` that copies a bucket into a plain module's parameters in place."""
    params = dict(model.named_parameters())

    def apply(state: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for name, tensor in state.items():
                params[name].copy_(tensor)

    return apply


def state_digest(named: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype | None = None) -> str:
    """SHA-256 over parameter names and raw bytes: equal digests mean bitwise-equal weights."""
    h = hashlib.sha256()
    for name, tensor in sorted(named, key=lambda kv: kv[0]):
        t = _full(tensor).detach()
        if dtype is not None:
            t = t.to(dtype)
        h.update(name.encode())
        h.update(t.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
