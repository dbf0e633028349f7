"""What the device is, recorded as a sample: identity is the fingerprint, live state is data.

The fingerprint (device row) is written by the runner for every profiled device; this suite adds
the readings that change (clocks, temperature, power, current PCIe link) and the GPU-to-GPU
topology, so a slow profile can later be explained ("the GPU ran at half clock").
"""

from __future__ import annotations

from hetprof.profiler import hostinfo
from hetprof.profiler.context import ProfileContext
from hetprof.profiler.registry import Suite, register_suite


@register_suite
class InventorySuite(Suite):
    name = "inventory"
    help = "NVML/torch device inventory (or the CPU's model, cores and memory without NVML)"

    def run(self, ctx: ProfileContext) -> None:
        if ctx.device == "cpu":
            cpu = hostinfo.cpu_info()
            ok, why = hostinfo.nvml_status()
            params = {"kind": "cpu", "model_name": cpu["model"], "machine": cpu["machine"],
                      "nvml": "available" if ok else why}
            metrics = {"cores": cpu["cores"], "threads_used": ctx.threads}
            metrics.update({k: cpu[k] for k in ("memory_bytes", "llc_bytes") if cpu[k] is not None})
            ctx.record("inventory.device", {"kind": "cpu"}, [{"params": params, "metrics": metrics}],
                       f"CPU {cpu['model']}, {cpu['cores']} cores ({'NVML: ' + why if why else 'NVML ok'})")
            ctx.advance(1)
            return
        import torch

        index = int(ctx.device.split(":")[1])
        props = torch.cuda.get_device_properties(index)
        ok, why = hostinfo.nvml_status()
        params = {"kind": "cuda", "index": index, "model_name": props.name, "nvml": "available" if ok else why}
        metrics = {"memory_bytes": int(props.total_memory), "sm_count": props.multi_processor_count,
                   "l2_bytes": int(getattr(props, "L2_cache_size", 0))}
        samples = []
        if ok:
            static = hostinfo.nvml_gpu(index)
            metrics.update({k: float(v) for k, v in static.items() if isinstance(v, (int, float))})
            metrics.update(hostinfo.nvml_live(index))
            if index == 0:
                samples += [{"params": {"pair": pair, "path": path}, "metrics": {}}
                            for pair, path in hostinfo.nvml_topology().items()]
        ctx.record("inventory.device", {"kind": "cuda"}, [{"params": params, "metrics": metrics}, *samples],
                   f"{props.name}, {props.total_memory / 2**30:.0f} GiB, {props.multi_processor_count} SMs")
        ctx.advance(1)
