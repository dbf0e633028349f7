"""Which devices a profile covers, and the fingerprint each one's rows are filed under.

A fingerprint (DeviceInfo) holds only what decides whether two measurements are comparable:
model, memory, driver, CUDA and torch versions, and for a CPU the thread count a worker slot uses.
Volatile readings (clocks, temperature) go into inventory samples instead, so re-profiling the same
device lands under the same device id.
"""

from __future__ import annotations

import re

from hetprof.errors import SpecError
from hetprof.profiler import hostinfo
from hetprof.profiles import DeviceInfo
from hetprof.specs.catalog import canonical_name

_DEVICE = re.compile(r"^(cpu|cuda:\d+)$")


def cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def select_devices(requested: tuple[str, ...], all_gpus: bool) -> list[str]:
    """The devices to profile: `--device` choices, every GPU with `--all-gpus`, else GPU 0 or the CPU."""
    n = cuda_count()
    if all_gpus and requested:
        raise SpecError("command line", "--device", "either --device or --all-gpus, not both", requested)
    if all_gpus:
        return [f"cuda:{i}" for i in range(n)] or ["cpu"]
    if not requested:
        return ["cuda:0"] if n else ["cpu"]
    out: list[str] = []
    for dev in requested:
        for item in dev.split(","):
            item = item.strip().lower()
            if not _DEVICE.match(item):
                raise SpecError("command line", "--device", "'cpu' or 'cuda:N'", item)
            if item.startswith("cuda") and int(item.split(":")[1]) >= n:
                raise SpecError("command line", "--device", f"a GPU index below {n} (GPUs visible here)", item)
            if item not in out:
                out.append(item)
    return out


def describe(device: str, host: str, threads: int) -> DeviceInfo:
    """The fingerprint of `device` on this host."""
    import torch

    if device == "cpu":
        cpu = hostinfo.cpu_info()
        _, why = hostinfo.nvml_status()
        return DeviceInfo(name=cpu["model"], kind="cpu", host=host, catalog_type="cpu",
                          memory_bytes=cpu["memory_bytes"], torch=torch.__version__,
                          extra={"cores": cpu["cores"], "threads": threads, "llc_bytes": cpu["llc_bytes"],
                                 "machine": cpu["machine"], "nvml": why or "available"})
    index = int(device.split(":")[1])
    props = torch.cuda.get_device_properties(index)
    ok, why = hostinfo.nvml_status()
    nvml = hostinfo.nvml_gpu(index) if ok else {}
    name = nvml.get("name") or props.name
    extra = {k: v for k, v in nvml.items() if k not in ("name", "uuid", "memory_bytes", "driver")}
    extra.update({"sm_count": props.multi_processor_count, "capability": f"{props.major}.{props.minor}",
                  "l2_bytes": int(getattr(props, "L2_cache_size", 0)), "nvml": "available" if ok else why})
    return DeviceInfo(name=name, kind="cuda", host=host, catalog_type=canonical_name(name),
                      memory_bytes=nvml.get("memory_bytes") or int(props.total_memory),
                      driver=nvml.get("driver"), cuda=torch.version.cuda, torch=torch.__version__,
                      uuid=nvml.get("uuid"), extra=extra)
