"""The GPU catalog file format: datasheet figures and efficiency curves, with their sources.

Shared by the package's own catalog (hetprof/data/gpus.yaml), `--catalog FILE` and a cluster spec's
`gpu_types:` section; hetprof/specs/catalog.py turns it into the runtime catalog. Typed loading reports a
mistake with its field path and file.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from hetprof.errors import SpecError
from hetprof.specs.loader import field, from_data, non_negative

CURVES = ("matmul", "attention", "memory", "decode_memory", "collective", "host_link", "matmul_fp8")
# Above 1: NVLink SHARP all-reduces beat the one-way link rate in nccl-tests' busbw terms.
MAX_EFFICIENCY = 1.5
# A type's figures lie within these (GB, GB/s, TFLOP/s, $/h): a CPU slot's 0.1 TFLOP/s and 10 GB/s
# sit far above the floor, the largest GPU far below the ceiling. Outside them a figure is a typo,
# or makes a cost model divide down to inf/NaN.
MIN_FIGURE, MAX_FIGURE = 1e-3, 1e6
# NVLink Switch systems join at most 576 GPUs in one domain (NVLink 5); more is a typo.
MAX_NVLINK_DOMAIN = 576


def _figure(x: float) -> bool:
    return MIN_FIGURE <= x <= MAX_FIGURE


FIGURE = f"a number in [{MIN_FIGURE:g}, {MAX_FIGURE:g}]"


def _valid_points(points: list[list[float]]) -> bool:
    if not points or any(len(p) != 2 for p in points):
        return False
    xs = [p[0] for p in points]
    return (all(x > 0 and math.isfinite(x) for x in xs) and all(a < b for a, b in zip(xs, xs[1:], strict=False))
            and all(0 < p[1] <= MAX_EFFICIENCY for p in points))


# ---- the file format (typed loading: a mistake is reported with its field path and file) -------

@dataclasses.dataclass
class CurveSpec:
    source: str = field(help="a key of `sources:` or a citation (title, URL, table/figure, date)",
                        check=lambda s: bool(s.strip()), expect="a non-empty source")
    points: list[list[float]] | None = field(
        None, help="(x, efficiency) pairs, x increasing; interpolated linearly in log x, flat beyond the ends",
        check=_valid_points, expect=f"(x, efficiency) pairs with x > 0 increasing and 0 < efficiency <= {MAX_EFFICIENCY}")
    ceiling: float | None = field(None, help="instead of points: the default curve rescaled so its best point is this",
                                  check=lambda x: 0 < x <= MAX_EFFICIENCY, expect=f"an efficiency in (0, {MAX_EFFICIENCY}]")
    world: int | None = field(None, help="collective curves: the ranks the figures were measured with (default 8); "
                                         "the ring α–β model carries them to other world sizes",
                              check=lambda n: n >= 2, expect="an integer >= 2")

    def validate(self) -> None:
        if (self.points is None) == (self.ceiling is None):
            raise SpecError(None, "points", "either points or ceiling (exactly one)",
                            "both" if self.points is not None else "neither")


@dataclasses.dataclass
class EfficiencySpec:
    matmul: CurveSpec | None = field(None, help="matmul FLOP/s fraction by rows per device (tokens in flight)")
    attention: CurveSpec | None = field(None, help="attention FLOP/s fraction by keys per query")
    memory: CurveSpec | None = field(None, help="HBM bandwidth fraction by bytes a phase moves")
    decode_memory: CurveSpec | None = field(None, help="HBM bandwidth fraction while decoding, by decode batch")
    collective: CurveSpec | None = field(None, help="intra-node collective bus bandwidth fraction by message bytes")
    host_link: CurveSpec | None = field(None, help="host <-> device copy bandwidth fraction (pinned memory) by bytes")
    matmul_fp8: CurveSpec | None = field(None, help="FP8 matmul FLOP/s fraction of fp8_tflops by rows per device")


@dataclasses.dataclass
class NetworkEfficiencySpec:
    inter_host: CurveSpec | None = field(None, help="goodput fraction of an inter-host link by its nominal bytes/s")


@dataclasses.dataclass
class StepSpec:
    overhead_s: float = field(help="seconds of every RL step outside the GPU tasks (the controller's data loading, "
                                   "reward functions, metrics and logging), serial with the actor's update",
                              check=non_negative, expect="a non-negative number of seconds")
    source: str = field(help="a key of `sources:` or a citation", check=lambda s: bool(s.strip()),
                        expect="a non-empty source")
    per_sequence_s: float = field(0.0, help="seconds added per sequence of the step (reward scoring, "
                                  "detokenising, moving samples)", check=non_negative,
                                  expect="a non-negative number of seconds")
    dispatch_s_per_slot: float = field(0.0, help="seconds a controller takes to hand a pass its batch, per token "
                                       "slot of the batch padded to the longest prompt and response allowed "
                                       "(workloads with training.padded_dispatch)", check=non_negative,
                                       expect="a non-negative number of seconds")
    dispatch_source: str | None = field(None, help="a key of `sources:` or a citation for dispatch_s_per_slot")

    def validate(self) -> None:
        if self.dispatch_s_per_slot > 0 and not (self.dispatch_source or "").strip():
            raise SpecError(None, "dispatch_source", "the source of dispatch_s_per_slot", self.dispatch_source)


@dataclasses.dataclass
class SourceSpec:
    title: str = field(help="what the figures are and where in the document (table, figure)")
    url: str | None = field(None, help="where to read it")
    date: str | None = field(None, help="publication date")
    kind: str = field("published microbenchmark", help="datasheet, published microbenchmark, measured profile, ...")


@dataclasses.dataclass
class GpuTypeSpec:
    vendor: str | None = field(None, help="nvidia, amd, ... ('generic' marks the CPU pseudo-device)")
    memory_GB: float | None = field(None, help="device memory, GB", check=_figure, expect=FIGURE)
    hbm_GBps: float | None = field(None, help="peak memory bandwidth, GB/s", check=_figure, expect=FIGURE)
    bf16_tflops: float | None = field(None, help="dense bf16 TFLOP/s (absent: the fp16 figure)", check=_figure,
                                      expect=FIGURE)
    fp16_tflops: float | None = field(None, help="dense fp16 TFLOP/s", check=_figure, expect=FIGURE)
    fp32_tflops: float | None = field(None, help="fp32 TFLOP/s", check=_figure, expect=FIGURE)
    fp8_tflops: float | None = field(None, help="dense FP8 (E4M3) tensor-core TFLOP/s, no sparsity (absent: the type "
                                                "has no FP8 units, and an FP8 task is refused on it)",
                                     check=_figure, expect=FIGURE)
    intra_node_GBps: float | None = field(None, help="aggregate bidirectional GPU-to-GPU bandwidth, GB/s",
                                          check=_figure, expect=FIGURE)
    interconnect: str | None = field(None, help="NVLink4, PCIe5, ... (latency class of the intra-node link)")
    nvlink_domain_gpus: int | None = field(None, help="the most GPUs one NVLink fabric of this type joins across hosts "
                                           "(GB200 NVL72: 72); absent: its NVLink ends at the host",
                                           check=lambda n: 2 <= n <= MAX_NVLINK_DOMAIN,
                                           expect=f"an integer in [2, {MAX_NVLINK_DOMAIN}]")
    host_link_GBps: float | None = field(None, help="nominal one-way host <-> device bus bandwidth, GB/s (PCIe 5.0 "
                                                    "x16: 64; absent: 32, PCIe 4.0 x16)",
                                         check=_figure, expect=FIGURE)
    price_per_hour: float | None = field(None, help="$/GPU-hour default", check=lambda x: 0 <= x <= MAX_FIGURE,
                                         expect=f"a non-negative number at most {MAX_FIGURE:g}")
    source: str | None = field(None, help="source of the datasheet figures (a key of `sources:` or a citation)")
    price_source: str | None = field(None, help="source of the price")
    aliases: list[str] = field(default_factory=list, help="other names, e.g. what the driver reports")
    efficiency: EfficiencySpec | None = field(None, help="this type's efficiency curves (others: `defaults:`)")


@dataclasses.dataclass
class CatalogSpec:
    sources: dict[str, SourceSpec] = field(default_factory=dict, help="citations the curves and figures name")
    defaults: EfficiencySpec | None = field(None, help="curves for types without their own")
    network: NetworkEfficiencySpec | None = field(None, help="curves of links between hosts")
    step: StepSpec | None = field(None, help="per-step constants of an RL framework's controller")
    gpus: dict[str, GpuTypeSpec] = field(default_factory=dict, help="GPU types by name (new or overriding)")


def parse(data: Any, file: str | None = None) -> CatalogSpec:
    """A catalog file's plain data, type-checked; errors name the field path and the file."""
    return from_data(CatalogSpec, data if data is not None else {}, file=file)
