"""Datasheet numbers for common accelerators — the fallback when the profile database has none.

Every number here is a vendor datasheet figure (dense, no sparsity) and is marked so: the cost
models prefer measured rows and say which they used. Prices are typical on-demand $/GPU-hour in
late 2026 across public clouds: an editable default, overridden per host in the cluster spec.
`intra_node_GBps` is the datasheet's aggregate bidirectional GPU-to-GPU figure (NVLink, Infinity
Fabric, or the PCIe slot for cards without a bridge).
"""

from __future__ import annotations

import dataclasses

DATASHEET = "datasheet"
EDITABLE_DEFAULT = "editable default"


@dataclasses.dataclass(frozen=True)
class GpuType:
    name: str
    vendor: str
    memory_GB: float
    hbm_GBps: float
    bf16_tflops: float | None
    fp16_tflops: float
    fp32_tflops: float
    intra_node_GBps: float
    interconnect: str
    price_per_hour: float
    source: str = DATASHEET
    price_source: str = EDITABLE_DEFAULT
    aliases: tuple[str, ...] = ()

    def peak_flops(self, dtype: str) -> float:
        """Peak dense FLOP/s for a dtype; bf16 falls back to fp16 on cards without bf16 units."""
        if dtype == "bf16":
            return (self.bf16_tflops or self.fp16_tflops) * 1e12
        if dtype == "fp16":
            return self.fp16_tflops * 1e12
        if dtype == "fp32":
            return self.fp32_tflops * 1e12
        raise KeyError(f"unknown dtype {dtype!r} (bf16, fp16, fp32)")

    @property
    def memory_bytes(self) -> float:
        return self.memory_GB * 1e9

    @property
    def hbm_Bps(self) -> float:
        return self.hbm_GBps * 1e9


_G = GpuType
CATALOG: dict[str, GpuType] = {g.name: g for g in [
    _G("H200", "nvidia", 141, 4800, 989, 989, 67, 900, "NVLink4", 3.80, aliases=("H200-SXM", "NVIDIA H200")),
    _G("H100-SXM", "nvidia", 80, 3350, 989, 989, 67, 900, "NVLink4", 3.00,
       aliases=("H100", "H100-80GB", "NVIDIA H100 80GB HBM3")),
    _G("H100-PCIe", "nvidia", 80, 2000, 756, 756, 51, 128, "PCIe5", 2.40, aliases=("NVIDIA H100 PCIe",)),
    _G("H800", "nvidia", 80, 3350, 989, 989, 67, 400, "NVLink4 (export)", 2.60, aliases=("H800-SXM",)),
    _G("H20", "nvidia", 96, 4000, 148, 148, 44, 900, "NVLink4", 1.30),
    _G("A100-40GB", "nvidia", 40, 1555, 312, 312, 19.5, 600, "NVLink3", 1.30,
       aliases=("A100", "A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB")),
    _G("A100-80GB", "nvidia", 80, 2039, 312, 312, 19.5, 600, "NVLink3", 1.80,
       aliases=("A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB")),
    _G("A10G", "nvidia", 24, 600, 70, 70, 31.2, 64, "PCIe4", 1.00, aliases=("NVIDIA A10G",)),
    _G("L40S", "nvidia", 48, 864, 362, 362, 91.6, 64, "PCIe4", 1.40, aliases=("NVIDIA L40S",)),
    _G("L40", "nvidia", 48, 864, 181, 181, 90.5, 64, "PCIe4", 1.10, aliases=("NVIDIA L40",)),
    _G("L4", "nvidia", 24, 300, 121, 121, 30.3, 64, "PCIe4", 0.70, aliases=("NVIDIA L4",)),
    _G("T4", "nvidia", 16, 320, None, 65, 8.1, 32, "PCIe3", 0.35, aliases=("Tesla T4",)),
    _G("V100-32GB", "nvidia", 32, 900, None, 125, 15.7, 300, "NVLink2", 0.90,
       aliases=("V100", "Tesla V100-SXM2-32GB")),
    _G("RTX-4090", "nvidia", 24, 1008, 165, 165, 82.6, 64, "PCIe4", 0.40, aliases=("NVIDIA GeForce RTX 4090",)),
    _G("B200", "nvidia", 180, 8000, 2250, 2250, 75, 1800, "NVLink5", 6.00, aliases=("NVIDIA B200",)),
    _G("MI300X", "amd", 192, 5300, 1307, 1307, 163.4, 896, "Infinity Fabric", 2.50,
       aliases=("AMD Instinct MI300X",)),
    # The CPU "device" lets every path run on a machine without a GPU. Its numbers are nominal
    # placeholders for one core pair, never used once `hetprof profile` has measured the host.
    _G("cpu", "generic", 16, 20, None, 0.1, 0.1, 10, "shared memory", 0.05, source="nominal placeholder"),
]}

_ALIASES = {alias.lower(): g.name for g in CATALOG.values() for alias in (g.name, *g.aliases)}


def lookup(name: str) -> GpuType:
    """The catalog entry for a GPU type name or a driver-reported name (case-insensitive)."""
    key = _ALIASES.get(name.strip().lower())
    if key is None:
        raise KeyError(name)
    return CATALOG[key]


def canonical_name(name: str) -> str | None:
    """The catalog name for `name`, or None if unknown (e.g. an NVML name of an unlisted card)."""
    return _ALIASES.get(name.strip().lower())


def known_types() -> list[str]:
    return sorted(CATALOG)
