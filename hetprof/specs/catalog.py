"""The GPU catalog: datasheet numbers and efficiency curves per accelerator, read from a data file.

The package ships `hetprof/data/gpus.yaml`; a user extends it with a file of the same format
(`--catalog FILE`) or with a cluster spec's `gpu_types:` section. A `Catalog` is plain immutable
data passed to whoever needs it (cost models, the planner) — never a global that code mutates.

Every figure carries its source: vendor datasheets for the peaks, published microbenchmarks (or
the previous flat constants, marked so) for the efficiency curves. The cost models prefer measured
profile rows and say which numbers they used. `intra_node_GBps` is the datasheet's aggregate
bidirectional GPU-to-GPU figure (NVLink, Infinity Fabric, or the PCIe slot for cards without one).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import math
from importlib import resources
from pathlib import Path
from typing import Any

from hetprof.errors import SpecError
from hetprof.specs.gpus import CURVES, CatalogSpec, CurveSpec, EfficiencySpec, GpuTypeSpec, SourceSpec, parse
from hetprof.specs.loader import read_file

DATASHEET = "datasheet"
EDITABLE_DEFAULT = "editable default"
BUILTIN_FILE = "gpus.yaml"


# ---- the runtime data ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class EfficiencyCurve:
    """Efficiency as a function of one size: piecewise-linear in log x, flat beyond the ends."""

    points: tuple[tuple[float, float], ...]
    source: str
    world: int | None = None  # collective curves: ranks the figures were measured with

    @functools.cached_property
    def _xs(self) -> list[float]:
        return [p[0] for p in self.points]

    def __call__(self, x: float) -> float:
        xs = self._xs
        if x <= xs[0]:
            return self.points[0][1]
        if x >= xs[-1]:
            return self.points[-1][1]
        i = bisect.bisect_right(xs, x)
        (x0, y0), (x1, y1) = self.points[i - 1], self.points[i]
        w = math.log(x / x0) / math.log(x1 / x0)
        return y0 + w * (y1 - y0)

    @property
    def best(self) -> float:
        return max(p[1] for p in self.points)

    def scaled(self, ceiling: float, source: str) -> EfficiencyCurve:
        k = ceiling / self.best
        return EfficiencyCurve(tuple((x, y * k) for x, y in self.points), source, self.world)


@dataclasses.dataclass(frozen=True)
class Curves:
    matmul: EfficiencyCurve
    attention: EfficiencyCurve
    memory: EfficiencyCurve
    decode_memory: EfficiencyCurve
    collective: EfficiencyCurve
    host_link: EfficiencyCurve
    matmul_fp8: EfficiencyCurve


@dataclasses.dataclass(frozen=True)
class StepConstants:
    """Per-step seconds outside the GPU tasks (the catalog's `step:`); none unless a file says."""

    overhead_s: float = 0.0
    source: str = "not priced"
    per_sequence_s: float = 0.0
    dispatch_s_per_slot: float = 0.0
    dispatch_source: str | None = None

    def seconds(self, sequences: int) -> float:
        """A step of `sequences` sequences: the fixed part and the per-sequence part."""
        return self.overhead_s + self.per_sequence_s * sequences

    def dispatch_seconds(self, slots: float) -> float:
        """Handing one pass a padded batch of `slots` token slots (sequences × padded length)."""
        return self.dispatch_s_per_slot * slots


@dataclasses.dataclass(frozen=True)
class GpuType:
    name: str
    vendor: str
    memory_GB: float
    hbm_GBps: float
    bf16_tflops: float | None
    fp16_tflops: float
    fp32_tflops: float | None
    intra_node_GBps: float
    interconnect: str
    price_per_hour: float
    source: str = DATASHEET
    price_source: str = EDITABLE_DEFAULT
    aliases: tuple[str, ...] = ()
    efficiency: Curves | None = dataclasses.field(default=None, compare=False)
    host_link_GBps: float = 32.0  # nominal one-way host <-> device bus, GB/s
    fp8_tflops: float | None = None  # dense FP8 tensor-core TFLOP/s; None: no FP8 units
    nvlink_domain_gpus: int | None = None  # GPUs one NVLink fabric joins across hosts; None: the host's own

    def peak_flops(self, dtype: str) -> float:
        """Peak dense FLOP/s for a dtype; bf16 falls back to fp16 on cards without bf16 units. A type
        without FP8 units has no fp8 figure: asking for it names the catalog field to add."""
        if dtype == "fp8":
            if self.fp8_tflops is None:
                raise KeyError(f"gpus.{self.name}.fp8_tflops: {self.name} has no FP8 figure in the catalog (no FP8 "
                               f"tensor cores); give one in a catalog file or plan this task in bf16")
            return self.fp8_tflops * 1e12
        if dtype == "bf16":
            return (self.bf16_tflops or self.fp16_tflops) * 1e12
        if dtype == "fp16":
            return self.fp16_tflops * 1e12
        if dtype == "fp32":
            if self.fp32_tflops is None:
                raise KeyError(f"{self.name} has no fp32 figure in the catalog")
            return self.fp32_tflops * 1e12
        raise KeyError(f"unknown dtype {dtype!r} (bf16, fp16, fp32, fp8)")

    @property
    def memory_bytes(self) -> float:
        return self.memory_GB * 1e9

    @property
    def hbm_Bps(self) -> float:
        return self.hbm_GBps * 1e9


class Catalog:
    """GPU types by name (and alias), their curves, the default curves, the network curves, the sources."""

    def __init__(self, types: dict[str, GpuType], sources: dict[str, SourceSpec], defaults: Curves,
                 inter_host: EfficiencyCurve, specs: dict[str, GpuTypeSpec] | None = None,
                 step: StepConstants | None = None):
        self.types = dict(types)
        self.step = step or StepConstants()
        self.sources = dict(sources)
        self.defaults = defaults
        self.inter_host = inter_host
        self._specs = dict(specs or {})  # the merged file entries, so later extensions can override fields
        self._aliases = {a.lower(): g.name for g in self.types.values() for a in (g.name, *g.aliases)}

    def lookup(self, name: str) -> GpuType:
        """The entry for a GPU type name or a driver-reported name (case-insensitive); KeyError if unknown."""
        key = self._aliases.get(str(name).strip().lower())
        if key is None:
            raise KeyError(name)
        return self.types[key]

    def canonical_name(self, name: str) -> str | None:
        """The catalog name for `name`, or None if unknown (e.g. an NVML name of an unlisted card)."""
        return self._aliases.get(str(name).strip().lower())

    def known_types(self) -> list[str]:
        return sorted(self.types)

    def cite(self, source: str) -> str:
        """A source key's title (and URL), or the text itself when it is a citation, not a key."""
        spec = self.sources.get(source)
        if spec is None:
            return source
        return spec.title + (f" <{spec.url}>" if spec.url else "")

    def entry_data(self, name: str) -> dict[str, Any]:
        """One type as `gpus:` entry data with every curve spelled out: what a cluster spec copies to stand alone."""
        g = self.lookup(name)
        data = {k: getattr(g, k) for k in ("vendor", "memory_GB", "hbm_GBps", "bf16_tflops", "fp16_tflops",
                                          "fp32_tflops", "fp8_tflops", "intra_node_GBps", "interconnect",
                                          "nvlink_domain_gpus", "host_link_GBps", "price_per_hour")}
        data = {k: v for k, v in data.items() if v is not None}
        data["source"], data["price_source"] = self._citation(g.source), self._citation(g.price_source)
        data["aliases"] = list(g.aliases)
        data["efficiency"] = {c: _curve_data(getattr(g.efficiency, c), self._citation) for c in CURVES}
        return data

    def _citation(self, source: str) -> str:
        """A source key the built-in catalog knows stays a key; another becomes its citation text."""
        return source if source in builtin().sources or source not in self.sources else self.cite(source)

    def extended(self, spec: CatalogSpec, file: str | None = None, where: str = "gpus") -> Catalog:
        """A new catalog: this one with `spec`'s sources, curves and GPU types added or overriding."""
        sources = {**self.sources, **spec.sources}
        defaults = _merge_curves(self.defaults, spec.defaults, None, file, "defaults")
        inter_host = self.inter_host
        if spec.network is not None and spec.network.inter_host is not None:
            inter_host = _curve(spec.network.inter_host, None, file, "network.inter_host")
        step = self.step if spec.step is None else StepConstants(
            spec.step.overhead_s, spec.step.source, spec.step.per_sequence_s, spec.step.dispatch_s_per_slot,
            spec.step.dispatch_source)
        specs = dict(self._specs)
        for name, entry in spec.gpus.items():
            canon = self.canonical_name(name) or name
            specs[canon] = _merge_entry(specs.get(canon), entry)
            _check_complete(specs[canon], file, f"{where}.{name}")
        types = {}
        for name, entry in specs.items():
            types[name] = _gpu_type(name, entry, defaults, file, f"{where}.{name}")
        return Catalog(types, sources, defaults, inter_host, specs, step)


def _curve_data(curve: EfficiencyCurve, cite) -> dict[str, Any]:
    data: dict[str, Any] = {"points": [list(p) for p in curve.points], "source": cite(curve.source)}
    if curve.world is not None:
        data["world"] = curve.world
    return data


HOST_LINK_GBps = 32.0  # a type that names no host bus: PCIe 4.0 x16, the most common card bus
REQUIRED = ("memory_GB", "hbm_GBps", "fp16_tflops", "intra_node_GBps")


def _merge_entry(old: GpuTypeSpec | None, new: GpuTypeSpec) -> GpuTypeSpec:
    """`new`'s given fields over `old`'s; efficiency curves merge one by one."""
    if old is None:
        return new
    changes = {f.name: getattr(new, f.name) for f in dataclasses.fields(new)
               if getattr(new, f.name) not in (None, []) and f.name != "efficiency"}
    eff = old.efficiency
    if new.efficiency is not None:
        eff = EfficiencySpec(**{k: getattr(new.efficiency, k) or (getattr(old.efficiency, k) if old.efficiency else None)
                                for k in CURVES})
    return dataclasses.replace(old, **changes, efficiency=eff)


def _check_complete(entry: GpuTypeSpec, file: str | None, where: str) -> None:
    for name in REQUIRED:
        if getattr(entry, name) is None:
            raise SpecError(file, f"{where}.{name}", "a value (required for a GPU type the catalog does not know)",
                            None)


def _curve(spec: CurveSpec, default: EfficiencyCurve | None, file: str | None, where: str) -> EfficiencyCurve:
    if spec.points is not None:
        return EfficiencyCurve(tuple((float(x), float(y)) for x, y in spec.points), spec.source, spec.world)
    if default is None:
        raise SpecError(file, f"{where}.ceiling", "points (there is no default curve to rescale here)", spec.ceiling)
    return default.scaled(float(spec.ceiling), spec.source)


def _merge_curves(base: Curves | None, spec: EfficiencySpec | None, fallback: Curves | None, file: str | None,
                  where: str) -> Curves:
    """Curves from `spec` where given, else from `base`; `ceiling` rescales `fallback`'s (or base's) curve."""
    out = {}
    for name in CURVES:
        given = getattr(spec, name) if spec is not None else None
        old = getattr(base, name) if base is not None else None
        ref = getattr(fallback, name) if fallback is not None else old
        if given is not None:
            out[name] = _curve(given, ref, file, f"{where}.{name}")
        elif old is not None:
            out[name] = old
        else:
            raise SpecError(file, f"{where}.{name}", "a curve (the built-in catalog needs every default)", None)
    return Curves(**out)


def _gpu_type(name: str, e: GpuTypeSpec, defaults: Curves, file: str | None, where: str) -> GpuType:
    curves = _merge_curves(defaults, e.efficiency, defaults, file, f"{where}.efficiency")
    return GpuType(name=name, vendor=e.vendor or "unknown", memory_GB=e.memory_GB, hbm_GBps=e.hbm_GBps,
                   bf16_tflops=e.bf16_tflops, fp16_tflops=e.fp16_tflops, fp32_tflops=e.fp32_tflops,
                   intra_node_GBps=e.intra_node_GBps, interconnect=e.interconnect or "PCIe",
                   price_per_hour=e.price_per_hour if e.price_per_hour is not None else 0.0,
                   source=e.source or DATASHEET, price_source=e.price_source or EDITABLE_DEFAULT,
                   aliases=tuple(e.aliases), efficiency=curves,
                   host_link_GBps=e.host_link_GBps if e.host_link_GBps is not None else HOST_LINK_GBps,
                   fp8_tflops=e.fp8_tflops, nvlink_domain_gpus=e.nvlink_domain_gpus)


@functools.cache
def builtin() -> Catalog:
    """The catalog shipped in the package (hetprof/data/gpus.yaml), loaded once."""
    path = resources.files("hetprof") / "data" / BUILTIN_FILE
    spec = parse(read_file(Path(str(path))), str(path))
    empty = Catalog({}, {}, None, None)  # type: ignore[arg-type]
    if spec.network is None or spec.network.inter_host is None:
        raise SpecError(str(path), "network.inter_host", "a curve", None)
    return empty.extended(spec, str(path))


def load_catalog(path: str | Path, base: Catalog | None = None) -> Catalog:
    """`base` (default: the built-in catalog) extended by the catalog file at `path`."""
    spec = parse(read_file(path), str(path))
    return (base or builtin()).extended(spec, str(path))


def lookup(name: str) -> GpuType:
    """The built-in entry for a GPU type name or a driver-reported name (case-insensitive)."""
    return builtin().lookup(name)


def canonical_name(name: str) -> str | None:
    """The built-in catalog name for `name`, or None if unknown."""
    return builtin().canonical_name(name)


def known_types() -> list[str]:
    return builtin().known_types()


def __getattr__(name: str) -> Any:
    if name == "CATALOG":  # the built-in types by name, read on first use
        return builtin().types
    raise AttributeError(name)
