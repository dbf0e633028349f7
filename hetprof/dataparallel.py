"""How a model replica is wrapped for data-parallel training: one definition for two stages.

DDP on the CPU (gloo), FSDP2 on GPUs (each decoder layer sharded, then the rest).

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


def wrap_fsdp(model: Any, group: Any) -> Any:
    """FSDP2 over `group`'s GPUs: shard each decoder layer, then the rest."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    mesh = DeviceMesh.from_group(group, "cuda")
    for module in model.modules():
        if type(module).__name__.endswith("DecoderLayer"):
            fully_shard(module, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def wrap_replica(model: Any, group: Any, device: Any) -> Any:
    """A data-parallel replica as hetprof trains one on `device`: FSDP2 on a GPU, DDP on the CPU."""
    return wrap_fsdp(model, group) if device.type == "cuda" else wrap_ddp(model, group, device)
