"""What a host and its devices are, read from the OS, NVML and torch — never guessed.

NVML (nvidia-ml-py) is the source of truth for a GPU's identity and topology; torch adds what
kernels see (SM count, compute capability, L2 size). A machine without NVML or a GPU is normal
(every CI box): the CPU is then described from /proc and os, and the reason NVML is absent is kept,
so a profile says plainly what it measured.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


CPU_CACHE_DIR = "/sys/devices/system/cpu/cpu0/cache"
# When sysfs does not say: a server core's L2 (2 MiB on recent Xeons, 1 MiB on EPYC).
DEFAULT_CORE_CACHE_BYTES = 2 * 1024 * 1024


def cpu_caches(cache_dir: str = CPU_CACHE_DIR) -> list[tuple[int, bool]]:
    """(bytes, private to one core?) of each cache the kernel reports for cpu0."""
    out = []
    for index in sorted(Path(cache_dir).glob("index*")):
        try:
            text = (index / "size").read_text().strip().upper()
        except OSError:
            continue
        scale = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if not digits.isdigit():
            continue
        try:
            shared = (index / "shared_cpu_list").read_text().strip()
        except OSError:
            shared = ""
        out.append((int(digits) * scale, bool(shared) and "," not in shared and "-" not in shared))
    return out


def last_level_cache_bytes() -> int | None:
    """The largest cache the kernel reports for cpu0 (the L3 on most servers)."""
    return max((size for size, _ in cpu_caches()), default=None)


def core_cache_bytes(cache_dir: str = CPU_CACHE_DIR) -> int:
    """Bytes of the largest cache one core has to itself (sysfs `shared_cpu_list` names one CPU),
    i.e. the L2 of current x86 parts: the shared L3 is other processes' as much as ours."""
    return max((size for size, private in cpu_caches(cache_dir) if private), default=DEFAULT_CORE_CACHE_BYTES)


def cpu_info() -> dict[str, Any]:
    return {"model": cpu_model(), "cores": os.cpu_count() or 1, "memory_bytes": memory_bytes(),
            "llc_bytes": last_level_cache_bytes(), "machine": platform.machine()}


def nvml_status() -> tuple[bool, str]:
    """(available, why not) — the reason is shown to the user instead of a traceback."""
    try:
        import pynvml
    except ImportError as exc:
        return False, f"nvidia-ml-py is not installed ({exc})"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return False, f"NVML cannot start: {exc}"
    try:
        count = pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()
    return (count > 0, "" if count else "NVML found no GPU")


def _safe(fn, *args, default=None):
    try:
        value = fn(*args)
    except Exception:
        return default
    return value.decode() if isinstance(value, bytes) else value


def _handle(pynvml: Any, index: int) -> Any:
    """NVML's handle for CUDA device `index`, matched by UUID: NVML and CUDA number GPUs differently
    when CUDA_VISIBLE_DEVICES or CUDA_DEVICE_ORDER is set."""
    import torch

    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    if uuid is not None:
        for candidate in (f"GPU-{uuid}", str(uuid)):
            try:
                return pynvml.nvmlDeviceGetHandleByUUID(candidate)
            except Exception:
                continue
    return pynvml.nvmlDeviceGetHandleByIndex(index)


def nvml_gpu(index: int) -> dict[str, Any]:
    """Static identity of CUDA device `index` (stable across runs: it becomes part of the fingerprint)."""
    import pynvml

    pynvml.nvmlInit()
    try:
        h = _handle(pynvml, index)
        mem = _safe(pynvml.nvmlDeviceGetMemoryInfo, h)
        info = {
            "name": _safe(pynvml.nvmlDeviceGetName, h, default="unknown GPU"),
            "uuid": _safe(pynvml.nvmlDeviceGetUUID, h),
            "memory_bytes": int(mem.total) if mem is not None else None,
            "driver": _safe(pynvml.nvmlSystemGetDriverVersion),
            "sm_clock_max_mhz": _safe(pynvml.nvmlDeviceGetMaxClockInfo, h, pynvml.NVML_CLOCK_SM),
            "mem_clock_max_mhz": _safe(pynvml.nvmlDeviceGetMaxClockInfo, h, pynvml.NVML_CLOCK_MEM),
            "power_limit_w": _milli(_safe(pynvml.nvmlDeviceGetEnforcedPowerLimit, h)),
            "pcie_gen_max": _safe(pynvml.nvmlDeviceGetMaxPcieLinkGeneration, h),
            "pcie_width_max": _safe(pynvml.nvmlDeviceGetMaxPcieLinkWidth, h),
            "pci_bus_id": _safe(lambda: pynvml.nvmlDeviceGetPciInfo(h).busId),
        }
        nvlinks = 0
        for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
            if _safe(pynvml.nvmlDeviceGetNvLinkState, h, link) == pynvml.NVML_FEATURE_ENABLED:
                nvlinks += 1
        info["nvlinks_active"] = nvlinks
        return info
    finally:
        pynvml.nvmlShutdown()


def nvml_live(index: int) -> dict[str, float]:
    """What changes from minute to minute (clocks, temperature, power): recorded as samples, not identity."""
    import pynvml

    pynvml.nvmlInit()
    try:
        h = _handle(pynvml, index)
        out = {
            "sm_clock_mhz": _safe(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM),
            "mem_clock_mhz": _safe(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_MEM),
            "temperature_c": _safe(pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU),
            "power_w": _milli(_safe(pynvml.nvmlDeviceGetPowerUsage, h)),
            "pcie_gen": _safe(pynvml.nvmlDeviceGetCurrPcieLinkGeneration, h),
            "pcie_width": _safe(pynvml.nvmlDeviceGetCurrPcieLinkWidth, h),
        }
        return {k: float(v) for k, v in out.items() if isinstance(v, (int, float))}
    finally:
        pynvml.nvmlShutdown()


def nvml_topology() -> dict[str, str]:
    """The GPU-to-GPU path matrix as nvidia-smi topo names it (NVLink, same switch, across sockets...)."""
    import pynvml

    levels = {0: "internal", 10: "single-switch", 20: "multi-switch", 30: "host-bridge",
              40: "numa-node", 50: "system"}
    pynvml.nvmlInit()
    try:
        n = pynvml.nvmlDeviceGetCount()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        out = {}
        for i in range(n):
            for j in range(i + 1, n):
                p2p = _safe(pynvml.nvmlDeviceGetP2PStatus, handles[i], handles[j],
                            pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
                if p2p == pynvml.NVML_P2P_STATUS_OK:
                    out[f"gpu{i}_gpu{j}"] = "nvlink"
                    continue
                level = _safe(pynvml.nvmlDeviceGetTopologyCommonAncestor, handles[i], handles[j])
                out[f"gpu{i}_gpu{j}"] = levels.get(level, str(level))
        return out
    finally:
        pynvml.nvmlShutdown()


def _milli(value: Any) -> float | None:
    return None if value is None else value / 1000.0
