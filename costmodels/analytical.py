"""The roofline cost model: a phase takes as long as its slower bound, compute or memory traffic.

time = max(matmul FLOPs / matmul FLOP/s + attention FLOPs / attention FLOP/s, bytes / bandwidth)
       + kernels × launch latency;
a training replica adds one Adam step per optimizer step over its optimizer shard (memory-bound),
the share held on the host (`Work.optimizer_offload`) stepped there (`host_adam_seconds`).
The achievable rates are the profile database's rows of that device type (measured, else
reference) when it has them and catalog peaks otherwise, each shaped by the catalog's efficiency
curves — a decode step's skinny matmuls or a short attention reach less than big ones
(`calibration.py`); communication is composed on top by the base class with α–β terms.
"""

from __future__ import annotations

from typing import Any

from hetprof.costmodels import comm, memory, moe, phases
from hetprof.costmodels.base import CostModel, optimizer_shards
from hetprof.costmodels.calibration import Calibration
from hetprof.costmodels.data import LinkSpec, Phase, PhaseTime, Placement, Work
from hetprof.specs.catalog import Catalog, canonical_name
from hetprof.specs.vocabulary import TaskKind

# Host memory bandwidth of one GPU's share of its host, for an Adam step run there: a DGX H100's two
# Xeon Platinum 8480C (NVIDIA DGX H100 datasheet), each with eight DDR5-4800 channels (Intel ARK:
# 307.2 GB/s a socket), shared by its eight GPUs' ranks, which step their shards at once. A peak:
# the host step priced with it is a lower bound, like a datasheet rate before measurement.
HOST_ADAM_BPS_PER_GPU = 2 * 307.2e9 / 8
# What an update moves between device and host per host-held parameter: the fp32 main gradient down
# (Megatron's distributed optimizer keeps main_grad in fp32) and the new 16-bit weight back.
HOST_OPTIMIZER_COPY_BYTES = 4 + 2


def host_adam_seconds(params: float, dtype: str, host_link_Bps: float) -> float:
    """One update of `params` host-held parameters: the gradient copies down and weight copies up over
    the host link, and the Adam sweep in host memory, pipelined by parameter group (Megatron's
    overlap_cpu_optimizer_d2h_h2d): the slower of the two."""
    if params <= 0:
        return 0.0
    copies = params * HOST_OPTIMIZER_COPY_BYTES / host_link_Bps
    return max(copies, phases.adam_step_bytes(params, dtype) / HOST_ADAM_BPS_PER_GPU)


class AnalyticalCostModel(CostModel):
    """Roofline per phase; rates measured or reference (profile database) or datasheet (catalog)."""

    name = "analytical"

    def __init__(self, db: Any | None = None, catalog: Catalog | None = None):
        super().__init__(catalog)
        self.calibration = Calibration(db, self.catalog)
        self.expert_gemms = moe.load_expert_gemms(db)  # fitted grouped GEMMs per (device type, dtype)

    def phase_time(self, phase: Phase, device_type: str) -> PhaseTime:
        phases.check(phase)
        cal = self.calibration
        matmul = cal.compute_rate(device_type, phase.dtype, "matmul", phases.matmul_rows(phase))
        attention = cal.compute_rate(device_type, phase.dtype, "attention", phases.attention_keys(phase))
        moved = phases.pass_bytes(phase)
        memory = cal.memory_rate(device_type, phase.batch if phase.kind == "decode" else None, moved)
        t_attention = phases.forward_attention_flops(phase) / attention.value
        t_compute = (phases.passes(phase) * (self._matmul_seconds(phase, device_type, matmul.value) + t_attention)
                     + (phases.attention_passes(phase) - phases.passes(phase)) * t_attention)
        t_memory = moved / memory.value
        floor = phases.kernel_launches(phase) * cal.launch_s(device_type)
        bound, rate = (t_compute, matmul) if t_compute >= t_memory else (t_memory, memory)
        note = "" if matmul.source == memory.source else (
            f"{device_type}: compute rate {matmul.source}, memory bandwidth {memory.source}")
        return PhaseTime(bound + floor, rate.source, note)

    def _matmul_seconds(self, phase: Phase, device_type: str, rate: float) -> float:
        """Forward seconds of the weight matmuls at `rate`; an MoE model's routed experts apart, as
        grouped GEMMs at their rows per expert, paced by the busiest expert-parallel rank (moe.py)."""
        routed = phases.routed_matmul_flops(phase)
        if not routed:
            return phases.forward_matmul_flops(phase) / rate
        return ((phases.forward_matmul_flops(phase) - routed) / rate
                + routed * moe.imbalance(phase.model, phase.expert_ranks or phase.ep, phase.imbalance)
                / self._grouped_rate(phase, device_type))

    def _grouped_rate(self, phase: Phase, device_type: str) -> float:
        """FLOP/s of the routed experts' grouped GEMMs: the fitted model of this device type and dtype
        where `hetprof fit` learned one from `moe.experts` rows, else the catalog curve at their rows
        per expert × the cited grouped-GEMM factor (moe.py)."""
        rows = phases.expert_rows(phase)
        fitted = self.expert_gemms.get((canonical_name(device_type) or device_type, phase.dtype))
        rate = fitted.rate(phase.model, rows, phase.ep, phase.kind == "train") if fitted is not None else None
        if rate is not None:
            return rate
        grouped = self.calibration.compute_rate(device_type, phase.dtype, "matmul", rows)
        return grouped.value * moe.GROUPED_GEMM_FACTOR

    def optimizer_step_time(self, work: Work, placement: Placement) -> float:
        """One Adam step over the optimizer shard a rank of this replica-stage owns (every parameter
        it holds, embeddings too, over the ranks that share the optimizer: ZeRO paper §5.1), at the
        HBM rate a sweep of that many bytes reaches: memory-bound, after the backward, not overlapped;
        the share `work.optimizer_offload` holds on the host is stepped there (`host_adam_seconds`)."""
        if work.kind != TaskKind.TRAINING:
            return 0.0
        shared, experts = memory.split_params_on_device(work.model, self._stage_layers(work, placement),
                                                        placement.tp, ep=placement.ep)
        shards = optimizer_shards(placement)
        if experts:  # the experts' optimizer is sharded over their expert-data-parallel copies only
            copies = memory.expert_replicas(placement.dp, placement.tp, placement.ep) if shards > 1 else 1
            params = shared / shards + experts / copies
        else:
            params = memory.params_on_device(work.model, self._stage_layers(work, placement), placement.tp) / shards
        on_device = params * (1 - work.optimizer_offload)
        moved = phases.adam_step_bytes(on_device, work.dtype)
        seconds = moved / self.calibration.memory_rate(placement.device_type, None, moved).value if moved else 0.0
        if work.optimizer_offload > 0:
            host = params * work.optimizer_offload
            link = comm.host_link_Bps(self.catalog.lookup(placement.device_type), host * HOST_OPTIMIZER_COPY_BYTES)
            seconds += host_adam_seconds(host, work.dtype, link)
        return seconds

    def device_link(self, device_type: str) -> tuple[LinkSpec, str]:
        return self.calibration.link(device_type)

    def inputs(self, device_type: str) -> dict[str, str]:
        """What this device type's numbers rest on: compute, memory and link → measured/reference/datasheet;
        "moe experts" → fitted where a grouped-GEMM model of the device type prices routed experts."""
        name = canonical_name(device_type) or device_type
        experts = {"moe experts": "fitted"} if any(t == name for t, _ in self.expert_gemms) else {}
        return {**self.calibration.source(device_type), **experts}

    def dp_step_extra(self, device_type: str) -> float:
        return self.calibration.dp_step_extra(device_type).value
