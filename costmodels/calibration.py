"""Device rates for the roofline: measured in the profile database where it has rows, datasheet otherwise.

A roofline needs four numbers per device type: achievable FLOP/s per dtype, achievable memory
bandwidth, the intra-node link's α–β, and a kernel-launch floor. Each comes with its source so an
estimate can say whether it rests on measurements or on a vendor's sheet.

Measured values are high quantiles of the profiler's raw samples (compute.matmul tflops,
memory.copy bandwidth) — the rate the big kernels of a transformer actually reach — and α–β from a
least-squares fit of the collective timings (collective.* rows) of that device type.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
from typing import Any

from hetprof.catalog import lookup
from hetprof.costmodels.comm import collective_time, fit_alpha_beta
from hetprof.costmodels.data import LinkSpec

MEASURED = "measured"
DATASHEET = "datasheet"

# Fractions of datasheet peaks a well-tuned kernel reaches (mamf-finder and stream-style copies
# typically show 60–80% of peak FLOPs and ~80–90% of peak HBM on current GPUs).
DATASHEET_COMPUTE_EFFICIENCY = 0.7
DATASHEET_MEMORY_EFFICIENCY = 0.85
DATASHEET_LINK_EFFICIENCY = 0.8
NVLINK_ALPHA_S = 5e-6
PCIE_ALPHA_S = 1.5e-5
# Per kernel: CUDA launch latency; on the CPU, PyTorch eager dispatch of one op (Python module call,
# dispatcher, allocator) is ~10 µs and dominates small shapes.
LAUNCH_S = {"gpu": 4e-6, "cpu": 1e-5}
RATE_QUANTILE = 0.9
DP_STEP = "dp.train_step"  # the profiler's dptrain suite: a step alone ("plain") and as a replica ("dp")


@dataclasses.dataclass(frozen=True)
class Rate:
    value: float
    source: str


class Calibration:
    """Per device type rates, read once from a profile database (or None: datasheet only)."""

    def __init__(self, db: Any | None = None):
        self._frames: dict[str, Any] = {}
        if db is not None:
            for family in ("compute.matmul", "memory.copy", "collective.", DP_STEP):
                df = db.samples(benchmark=family)
                self._frames[family] = df if len(df) else None

    def _rows(self, family: str, device_type: str):
        df = self._frames.get(family)
        if df is None or "catalog_type" not in df:
            return None
        name = lookup(device_type).name
        rows = df[df["catalog_type"].fillna("").map(lambda c: _canon(c) == name)]
        return rows if len(rows) else None

    @functools.lru_cache(maxsize=256)  # noqa: B019 - one Calibration per cost model, bounded
    def flops(self, device_type: str, dtype: str) -> Rate:
        rows = self._rows("compute.matmul", device_type)
        if rows is not None and "tflops" in rows and "dtype" in rows:
            sel = rows[rows["dtype"] == dtype]["tflops"].dropna()
            if len(sel):
                return Rate(float(sel.quantile(RATE_QUANTILE)) * 1e12, MEASURED)
        gpu = lookup(device_type)
        return Rate(gpu.peak_flops(dtype) * DATASHEET_COMPUTE_EFFICIENCY, DATASHEET)

    @functools.lru_cache(maxsize=256)  # noqa: B019
    def memory_bw(self, device_type: str) -> Rate:
        rows = self._rows("memory.copy", device_type)
        if rows is not None and "bandwidth_Bps" in rows:
            sel = rows["bandwidth_Bps"].dropna()
            if len(sel):
                return Rate(float(sel.quantile(RATE_QUANTILE)), MEASURED)
        return Rate(lookup(device_type).hbm_Bps * DATASHEET_MEMORY_EFFICIENCY, DATASHEET)

    @functools.lru_cache(maxsize=256)  # noqa: B019
    def link(self, device_type: str) -> tuple[LinkSpec, str]:
        rows = self._rows("collective.", device_type)
        if rows is not None and {"size_bytes", "seconds", "world"} <= set(rows.columns):
            for op in ("all_reduce", "all_gather", "broadcast"):
                sel = rows[rows["benchmark"] == f"collective.{op}"]
                if not len(sel):
                    continue
                world = int(sel["world"].max())
                sel = sel[sel["world"] == world].groupby("size_bytes")["seconds"].median()
                if len(sel) >= 2 and world > 1:
                    alpha, beta, _ = fit_alpha_beta(list(sel.index.astype(float)), list(sel.values), op, world)
                    return LinkSpec(alpha, beta), MEASURED
        gpu = lookup(device_type)
        alpha = NVLINK_ALPHA_S if "link" in gpu.interconnect.lower() else PCIE_ALPHA_S
        beta = gpu.intra_node_GBps * 1e9 / 2 * DATASHEET_LINK_EFFICIENCY  # datasheet is bidirectional
        return LinkSpec(alpha, beta), DATASHEET

    @functools.lru_cache(maxsize=256)  # noqa: B019
    def dp_step_extra(self, device_type: str) -> Rate:
        """Seconds a data-parallel replica's optimizer step costs beyond its gradient all-reduce.

        Measured as (step as a replica, slowest rank − the same step alone, all ranks busy) − the all-reduce of
        its gradients over this device type's measured link; the median over the profiled models.
        It holds what α–β cannot: wrapper hooks and buckets, waits for the slowest replica, the
        communication threads taking a CPU slot's core — and, negative, the part of the all-reduce
        a GPU overlaps with the backward pass. Unmeasured: 0 (the all-reduce alone).
        """
        rows = self._rows(DP_STEP, device_type)
        if rows is None or not {"mode", "grad_bytes", "world", "seconds"} <= set(rows.columns):
            return Rate(0.0, DATASHEET)
        link, _ = self.link(device_type)
        keys = [k for k in ("world", "grad_bytes", "layers_run", "model", "batch", "seq_len") if k in rows]
        extras = []
        for key, part in rows.groupby(keys, dropna=False):
            times = part.groupby("mode")["seconds"].median()
            if {"plain", "dp"} <= set(times.index):
                world, grad_bytes = int(key[0]), float(key[1])
                sync = collective_time("all_reduce", grad_bytes, world, link.alpha_s, link.beta_Bps)
                extras.append(float(times["dp"] - times["plain"]) - sync)
        if not extras:
            return Rate(0.0, DATASHEET)
        return Rate(float(statistics.median(extras)), MEASURED)

    @staticmethod
    def launch_s(device_type: str) -> float:
        return LAUNCH_S["cpu" if lookup(device_type).vendor == "generic" else "gpu"]


def _canon(name: str) -> str | None:
    try:
        return lookup(name).name
    except KeyError:
        return None
