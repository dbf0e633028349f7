"""Device rates for the roofline: measured rows first, then reference rows, then the catalog's datasheet.

A roofline needs per device type: achievable FLOP/s per dtype and matmul shape, attention FLOP/s by
context, achievable memory bandwidth, the intra-node link's α–β, and a kernel-launch floor. Each
comes with its source — "measured", "reference" (published figures imported with `hetprof db
import --reference`) or "datasheet" (catalog peaks × efficiency curves) — so an estimate can say what
it rests on. Measured rows always outrank reference rows, and both outrank the datasheet.

Profile rows set a ceiling — a high quantile of the profiler's raw samples (compute.matmul tflops,
memory.copy bandwidth), the rate the big kernels reach — and the catalog's efficiency curves give
the shape below it (small matmuls, short attention, small decode batches reach less); α–β is fitted
to the collective timings (collective.* rows) of that device type.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
from typing import Any

from hetprof.costmodels.comm import busbw_factor, collective_time, fit_alpha_beta
from hetprof.costmodels.data import LinkSpec
from hetprof.specs.catalog import Catalog, EfficiencyCurve, builtin
from hetprof.specs.precision import FP8, attention_dtype

MEASURED = "measured"
REFERENCE = "reference"
DATASHEET = "datasheet"
ROW_RANK = (MEASURED, REFERENCE)  # which profile rows a rate reads, best first

NVLINK_ALPHA_S = 5e-6
PCIE_ALPHA_S = 1.5e-5
# Per kernel: CUDA launch latency; on the CPU, PyTorch eager dispatch of one op (Python module call,
# dispatcher, allocator) is ~10 µs and dominates small shapes.
LAUNCH_S = {"gpu": 4e-6, "cpu": 1e-5}
RATE_QUANTILE = 0.9
DP_STEP = "dp.train_step"  # the profiler's dptrain suite: a step alone ("plain") and as a replica ("dp")
CURVE_WORLD = 8  # the ring size a catalog collective curve describes unless it says (one 8-GPU host)


def _matmul_curve(curves, dtype: str) -> EfficiencyCurve:
    """The matmul efficiency curve of a precision: FP8 tensor cores have their own (catalog matmul_fp8)."""
    return curves.matmul_fp8 if dtype == FP8 else curves.matmul


@dataclasses.dataclass(frozen=True)
class Rate:
    value: float
    source: str


class Calibration:
    """Per device type rates, read once from a profile database (or None: catalog only)."""

    def __init__(self, db: Any | None = None, catalog: Catalog | None = None):
        self.catalog = catalog or builtin()
        self._frames: dict[str, Any] = {}
        if db is not None:
            for family in ("compute.matmul", "memory.copy", "collective.", DP_STEP):
                df = db.samples(benchmark=family)
                self._frames[family] = df if len(df) else None

    def _rows(self, family: str, device_type: str):
        """(rows, source) of the best-ranked kind this device type has for a family, or (None, datasheet)."""
        df = self._frames.get(family)
        if df is None or "catalog_type" not in df:
            return None, DATASHEET
        name = self.catalog.lookup(device_type).name
        rows = df[df["catalog_type"].fillna("").map(lambda c: self._canon(c) == name)]
        if "run_source" not in rows:
            return (rows, MEASURED) if len(rows) else (None, DATASHEET)
        kinds = rows["run_source"].fillna(MEASURED)
        for kind in ROW_RANK:
            sel = rows[kinds == kind]
            if len(sel):
                return sel, kind
        return None, DATASHEET

    def _canon(self, name: str) -> str | None:
        return self.catalog.canonical_name(name)

    @functools.lru_cache(maxsize=256)  # noqa: B019
    def curves(self, device_type: str):
        return self.catalog.lookup(device_type).efficiency

    @functools.lru_cache(maxsize=256)  # noqa: B019 - one Calibration per cost model, bounded
    def flops(self, device_type: str, dtype: str) -> Rate:
        """The large-matmul ceiling: measured/reference high quantile, else peak × best matmul efficiency."""
        rows, kind = self._rows("compute.matmul", device_type)
        if rows is not None and "tflops" in rows and "dtype" in rows:
            sel = rows[rows["dtype"] == dtype]["tflops"].dropna()
            if len(sel):
                return Rate(float(sel.quantile(RATE_QUANTILE)) * 1e12, kind)
        gpu = self.catalog.lookup(device_type)
        return Rate(gpu.peak_flops(dtype) * _matmul_curve(gpu.efficiency, dtype).best, DATASHEET)

    def compute_rate(self, device_type: str, dtype: str, kind: str, x: float) -> Rate:
        """FLOP/s of a `kind` ("matmul": x = rows per device; "attention": x = keys per query) kernel.
        FP8 matmuls run at the FP8 ceiling on the matmul_fp8 curve; FP8 recipes' attention at bf16's."""
        if kind == "attention":
            dtype = attention_dtype(dtype)
        ceiling = self.flops(device_type, dtype)
        curves = self.curves(device_type)
        matmul = _matmul_curve(curves, dtype)
        curve: EfficiencyCurve = matmul if kind == "matmul" else getattr(curves, kind)
        return Rate(ceiling.value * curve(x) / matmul.best, ceiling.source)

    @functools.lru_cache(maxsize=256)  # noqa: B019
    def memory_bw(self, device_type: str) -> Rate:
        """The streaming-copy ceiling: measured/reference high quantile, else peak × best memory efficiency."""
        rows, kind = self._rows("memory.copy", device_type)
        if rows is not None and "bandwidth_Bps" in rows:
            sel = rows["bandwidth_Bps"].dropna()
            if len(sel):
                return Rate(float(sel.quantile(RATE_QUANTILE)), kind)
        gpu = self.catalog.lookup(device_type)
        return Rate(gpu.hbm_Bps * gpu.efficiency.memory.best, DATASHEET)

    def memory_rate(self, device_type: str, decode_batch: int | None, size_bytes: float) -> Rate:
        """Bytes/s of a phase moving `size_bytes` (decode: by its batch, on the decode curve)."""
        ceiling = self.memory_bw(device_type)
        curves = self.curves(device_type)
        eff = curves.decode_memory(decode_batch) if decode_batch is not None else curves.memory(size_bytes)
        return Rate(ceiling.value * eff / curves.memory.best, ceiling.source)

    @functools.lru_cache(maxsize=256)  # noqa: B019
    def link(self, device_type: str) -> tuple[LinkSpec, str]:
        rows, kind = self._rows("collective.", device_type)
        if rows is not None and "hosts" in rows:  # rows across hosts time the network, not this GPU's link
            rows = rows[rows["hosts"].fillna(1) <= 1]
        if rows is not None and {"size_bytes", "seconds", "world"} <= set(rows.columns):
            for op in ("all_reduce", "all_gather", "broadcast"):
                sel = rows[rows["benchmark"] == f"collective.{op}"]
                if not len(sel):
                    continue
                world = int(sel["world"].max())
                sel = sel[sel["world"] == world].groupby("size_bytes")["seconds"].median()
                if len(sel) >= 2 and world > 1:
                    alpha, beta, _ = fit_alpha_beta(list(sel.index.astype(float)), list(sel.values), op, world)
                    return LinkSpec(alpha, beta), kind
        return self._catalog_link(device_type), DATASHEET

    def _catalog_link(self, device_type: str) -> LinkSpec:
        """α–β from the catalog: nominal one-way bandwidth × the collective curve; with several curve
        points, α and β are fitted to the all-reduce times they imply, as measured rows would be."""
        gpu = self.catalog.lookup(device_type)
        nominal = gpu.intra_node_GBps * 1e9 / 2  # the datasheet figure is bidirectional
        curve = gpu.efficiency.collective
        alpha = NVLINK_ALPHA_S if "link" in gpu.interconnect.lower() else PCIE_ALPHA_S
        if len(curve.points) < 2:
            return LinkSpec(alpha, nominal * curve.best)
        world = curve.world or CURVE_WORLD
        factor = busbw_factor("all_reduce", world)
        sizes = [x for x, _ in curve.points]
        seconds = [factor * s / (nominal * eff) for s, eff in curve.points]
        fit_alpha, beta, _ = fit_alpha_beta(sizes, seconds, "all_reduce", world)
        return LinkSpec(fit_alpha, beta)

    @functools.lru_cache(maxsize=256)  # noqa: B019
    def dp_step_extra(self, device_type: str) -> Rate:
        """Seconds a data-parallel replica's optimizer step costs beyond its gradient all-reduce.

        Measured as (step as a replica, slowest rank − the same step alone, all ranks busy) − the all-reduce of
        its gradients over this device type's measured link; the median over the profiled models.
        It holds what α–β cannot: wrapper hooks and buckets, waits for the slowest replica, the
        communication threads taking a CPU slot's core — and, negative, the part of the all-reduce
        a GPU overlaps with the backward pass. Unmeasured: 0 (the all-reduce alone).
        """
        rows, kind = self._rows(DP_STEP, device_type)
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
        return Rate(float(statistics.median(extras)), kind)

    def launch_s(self, device_type: str) -> float:
        return LAUNCH_S["cpu" if self.catalog.lookup(device_type).vendor == "generic" else "gpu"]

    def source(self, device_type: str) -> dict[str, str]:
        """Which inputs this device type's rates rest on, per rate (for the plan report)."""
        return {"compute": self.flops(device_type, "bf16").source, "memory": self.memory_bw(device_type).source,
                "link": self.link(device_type)[1]}
