"""Model FLOPs utilisation (MFU) of each training task: the model FLOPs its update achieved per
second over the catalog's peak of the devices it ran on, in the dtype it computed in.

The FLOPs are the model's, not the kernels': forward and backward (3× a forward) of every trained
token, once per PPO epoch, counted from each sequence's real length (padding and recomputation
excluded), as verl's `perf/mfu/actor` counts them. The peak is the sum over the task's devices of
the catalog's dense figure for the dtype. The catalog's `cpu` entry carries placeholder numbers (a
source of kind "placeholder"), not a peak: a task on such a device has no MFU, rather than one
measured against a made-up peak.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from hetprof.specs import Plan
from hetprof.specs.catalog import Catalog
from hetprof.specs.models import ModelShape
from hetprof.specs.vocabulary import TaskKind

PLACEHOLDER = "placeholder"  # the kind of catalog source whose figures are stand-ins, not datasheet peaks
DTYPES = ("bf16", "fp16", "fp32")
FLOPS_KEY = "model_flops"  # a training task's statistic: the model FLOPs of its update on one replica


def update_flops(shape: ModelShape, lengths: Iterable[int], epochs: int, lm_head: bool = True) -> float:
    """Model FLOPs of an update over sequences of `lengths` tokens: forward and backward of every
    token (each attending to its half-sequence on average), `epochs` times."""
    forward = sum(n * shape.forward_flops_per_token(context=n / 2, include_lm_head=lm_head) for n in lengths)
    return 3.0 * epochs * forward


def peak_flops(catalog: Catalog, device_type: str, dtype: str) -> float | None:
    """The catalog's dense peak FLOP/s of one device in `dtype`; None where it has none (a
    placeholder entry such as `cpu`, or no figure for the dtype)."""
    gpu = catalog.lookup(device_type)
    source = catalog.sources.get(gpu.source)
    if source is not None and source.kind == PLACEHOLDER:
        return None
    try:
        return gpu.peak_flops(dtype)
    except KeyError:
        return None


def training_peaks(plan: Plan) -> dict[str, dict[str, float]]:
    """Per training task, per dtype: the summed peak of all its devices (left out where one lacks it)."""
    cluster = plan.cluster_spec()
    catalog = cluster.catalog
    types = {d.id: d.type for d in cluster.devices()}
    out: dict[str, dict[str, float]] = {}
    for t in plan.tasks:
        if t.kind != TaskKind.TRAINING:
            continue
        peaks = {}
        for dtype in DTYPES:
            each = [peak_flops(catalog, types[d], dtype) for d in t.devices()]
            if each and all(p is not None for p in each):
                peaks[dtype] = float(sum(each))
        out[t.task] = peaks
    return out


def utilisation(peaks: dict[str, dict[str, float]], seconds: dict[str, float], flops: dict[str, float],
                dtypes: dict[str, str]) -> dict[str, float]:
    """MFU per training task that has a peak in its dtype, its FLOPs and a measured time."""
    out = {}
    for task, by_dtype in peaks.items():
        peak = by_dtype.get(dtypes.get(task, ""))
        if peak and seconds.get(task, 0.0) > 0 and flops.get(task):
            out[task] = flops[task] / (seconds[task] * peak)
    return out


def summed_flops(stats: Sequence[dict[str, dict[str, float]]]) -> dict[str, float]:
    """Each task's model FLOPs over its replicas (every replica reports its own update once)."""
    out: dict[str, float] = {}
    for per_task in stats:
        for task, s in per_task.items():
            if FLOPS_KEY in s:
                out[task] = out.get(task, 0.0) + float(s[FLOPS_KEY])
    return out
