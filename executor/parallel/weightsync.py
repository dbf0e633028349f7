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
import datetime
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


def flatten_params(module: torch.nn.Module, bucket_mb: float = DEFAULT_BUCKET_MB) -> int:
    """Re-home a module's parameters into one flat buffer per sync bucket (each parameter a view).

    A sync of such a module needs no packing on the trainer and no unpacking on a generator: the
    broadcast reads and writes the parameters' own memory. Call it before an optimizer or DDP
    takes the parameters; values are unchanged. Returns the number of flat buffers made.
    """
    params = dict(module.named_parameters())
    buckets = make_buckets(params.items(), bucket_mb * 1e6)
    with torch.no_grad():
        for bucket in buckets:
            first = params[bucket.names[0]]
            flat = torch.empty(bucket.numel, dtype=bucket.dtype, device=first.device)
            offset = 0
            for name, shape in zip(bucket.names, bucket.shapes, strict=True):
                n = shape.numel()
                view = flat[offset:offset + n].view(shape)
                view.copy_(params[name])
                params[name].data = view
                offset += n
    return len(buckets)


def _flat_view(tensors: list[torch.Tensor], numel: int) -> torch.Tensor | None:
    """The one flat tensor these parameters are consecutive views of, or None (then pack a copy)."""
    first = tensors[0]
    storage = first.untyped_storage()
    offset = first.storage_offset()
    for t in tensors:
        if (hasattr(t, "full_tensor") or not t.is_contiguous() or t.untyped_storage().data_ptr() != storage.data_ptr()
                or t.storage_offset() != offset):
            return None
        offset += t.numel()
    return first.detach().new_empty(0).set_(storage, first.storage_offset(), (numel,))


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
                 wire_dtype: torch.dtype | None = None, timeout_s: float = 300.0, members: str = ""):
        self.group = group
        self.members = members  # how errors name the group (e.g. the plan's devices and tasks)
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.src = src
        self.device = torch.device(device)
        self.wire_dtype = wire_dtype
        if wire_dtype is not None:
            reference = ((n, t.detach().to(wire_dtype)) for n, t in reference)
        self.buckets = make_buckets(reference, bucket_mb * 1e6)
        self.names = [n for b in self.buckets for n in b.names]
        self._scratch: dict[tuple[torch.dtype, int], torch.Tensor] = {}

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

    def _wait(self, work: dist.Work) -> None:
        """An async collective's wait has no deadline of its own; a dead or hung member must not
        keep the others waiting forever."""
        who = f" among {self.members}" if self.members else ""
        try:
            done = work.wait(self.timeout)
        except RuntimeError as exc:
            raise ExecutionError(f"weight sync from rank {self.src}{who} failed (a member is dead or hung): "
                                 f"{str(exc).strip()[:300]}") from None
        if done is False:
            raise ExecutionError(f"weight sync from rank {self.src}{who} did not complete within "
                                 f"{self.timeout.total_seconds():.0f} s; a member is dead or hung")

    def _scratch_buffer(self, bucket: Bucket, slot: int) -> torch.Tensor:
        """One of two reusable flat buffers per dtype, sized to that dtype's largest bucket.

        Allocating a fresh buffer per bucket per sync costs page faults on every sync (it made
        syncs several times slower than a plain broadcast); two slots let one bucket travel while
        the next is packed or the previous unpacked.
        """
        key = (bucket.dtype, slot)
        buf = self._scratch.get(key)
        if buf is None:
            size = max(b.numel for b in self.buckets if b.dtype == bucket.dtype)
            buf = self._scratch[key] = torch.empty(size, dtype=bucket.dtype, device=self.device)
        return buf[:bucket.numel]

    def send(self, named: Iterable[tuple[str, torch.Tensor]], version: int = 0) -> SyncStats:
        params = dict(named)
        start = time.perf_counter()
        dist.broadcast(torch.tensor([version], dtype=torch.int64, device=self.device), self.src, group=self.group)
        in_flight: list[dist.Work | None] = [None, None]
        with torch.no_grad():
            for i, bucket in enumerate(self.buckets):
                slot = i % 2
                if in_flight[slot] is not None:
                    self._wait(in_flight[slot])  # this slot's previous bucket has left
                tensors = [params[n] for n in bucket.names]
                flat = _flat_view(tensors, bucket.numel) if tensors[0].dtype == bucket.dtype else None
                if flat is None:
                    flat = self._scratch_buffer(bucket, slot)
                    torch.cat([_full(t).detach().reshape(-1).to(self.device, bucket.dtype) for t in tensors], out=flat)
                in_flight[slot] = dist.broadcast(flat, self.src, group=self.group, async_op=True)
            for work in in_flight:
                if work is not None:
                    self._wait(work)
        return SyncStats(time.perf_counter() - start, self.total_bytes, len(self.buckets))

    def receive(self, apply: Callable[[dict[str, torch.Tensor]], None],
                target: torch.nn.Module | None = None) -> tuple[SyncStats, int]:
        """Receive one sync; returns its stats and the weight version it carried.

        Buckets whose parameters in `target` are views of one flat buffer (`flatten_params`) are
        received in place; the others land in a scratch buffer and go through `apply`, with bucket
        i+1 already on its way while bucket i is applied.
        """
        start = time.perf_counter()
        version = torch.empty(1, dtype=torch.int64, device=self.device)
        dist.broadcast(version, self.src, group=self.group)
        own = dict(target.named_parameters()) if target is not None else {}

        def post(i: int) -> tuple[dist.Work, torch.Tensor, bool]:
            bucket = self.buckets[i]
            flat = None
            if own and all(n in own for n in bucket.names) and own[bucket.names[0]].dtype == bucket.dtype:
                flat = _flat_view([own[n] for n in bucket.names], bucket.numel)
            in_place = flat is not None
            if flat is None:
                flat = self._scratch_buffer(bucket, i % 2)
            with torch.no_grad():
                return dist.broadcast(flat, self.src, group=self.group, async_op=True), flat, in_place

        pending = post(0) if self.buckets else None
        for i, bucket in enumerate(self.buckets):
            work, flat, in_place = pending
            self._wait(work)
            if i + 1 < len(self.buckets):
                pending = post(i + 1)  # its slot held bucket i-1, which is applied already
            if not in_place:
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
