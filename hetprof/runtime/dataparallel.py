"""How a model replica is wrapped for data-parallel training: one definition for two stages.

The plan's sharding says how: none is DDP, zero2 and fsdp are FSDP2 `fully_shard` (each decoder
layer a unit, then the root), zero2 keeping each unit gathered from its forward to its backward
(SHARD_GRAD_OP: gradients and optimizer state sharded, parameters whole while they compute), fsdp
resharding after the forward (ZeRO-3). Both run on GPUs (NCCL) and on the CPU (gloo). Without a
plan (the profiler's `dptrain` suite) the default is DDP on the CPU and FSDP2 on GPUs.

The executor trains data-parallel replicas with this wrapper and the profiler times the same
wrapper (`dptrain` suite), so the cost of data parallelism the planner is told is the cost of the
data parallelism the executor runs. Both import it from here because neither may import the other.

`broadcast_buffers` is off: DDP's default re-broadcasts every buffer from rank 0 before each
forward — one more collective, i.e. one more point where every replica waits for the slowest, per
micro-batch. The models hetprof trains (causal LMs and scalar-head models built from one config)
hold only constant buffers such as rotary frequencies, identical on every replica by construction.
A model with batch-norm statistics (buffers that training changes) keeps the broadcast.
"""

from __future__ import annotations

import inspect
from typing import Any


def needs_buffer_broadcast(model: Any) -> bool:
    """True when training mutates buffers (batch-norm running statistics), so replicas must agree on them."""
    from torch.nn.modules.batchnorm import _BatchNorm

    return any(isinstance(m, _BatchNorm) and m.track_running_stats for m in model.modules())


def wrap_ddp(model: Any, group: Any = None, device: Any = None) -> Any:
    """`model` as a DistributedDataParallel replica over `group` (the default group when None)."""
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device is not None and device.type == "cuda" else None
    sync = needs_buffer_broadcast(model)
    # newer torch names the per-forward broadcast `forward_sync_buffers` and deprecates the old name
    name = "forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters \
        else "broadcast_buffers"
    return DistributedDataParallel(model, device_ids=ids, process_group=group, **{name: sync})


def wrap_fsdp(model: Any, group: Any, device_type: str = "cuda", reshard_after_forward: bool = True) -> Any:
    """FSDP2 over `group`'s devices: shard each decoder layer, then the rest."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    mesh = DeviceMesh.from_group(group, device_type)
    for module in model.modules():
        if type(module).__name__.endswith("DecoderLayer"):
            fully_shard(module, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)


def wrap_replica(model: Any, group: Any, device: Any, sharding: str | None = None) -> Any:
    """A data-parallel replica as hetprof trains one on `device`, sharded as the plan says (module docstring)."""
    if sharding is None:
        sharding = "fsdp" if device.type == "cuda" else "none"
    if sharding == "none":
        return wrap_ddp(model, group, device)
    if sharding in ("zero2", "fsdp"):
        return wrap_fsdp(model, group, device.type, reshard_after_forward=sharding == "fsdp")
    raise ValueError(f"no data-parallel wrapper for sharding {sharding!r} (none, zero2, fsdp)")
