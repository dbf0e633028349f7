"""The roofline cost model: a phase takes as long as its slower bound, compute or memory traffic.

time = max(FLOPs / achievable FLOP/s, bytes / achievable bandwidth) + kernels × launch latency.
The achievable rates are the profile database's measurements of that device type when it has
them and datasheet peaks × typical efficiencies otherwise (`calibration.py`); communication is
composed on top by the base class with α–β terms on the real links.
"""

from __future__ import annotations

from typing import Any

from hetprof.costmodels import phases
from hetprof.costmodels.base import CostModel
from hetprof.costmodels.calibration import Calibration
from hetprof.costmodels.data import LinkSpec, Phase, PhaseTime


class AnalyticalCostModel(CostModel):
    """Roofline per phase; rates measured (profile database) or datasheet (catalog)."""

    name = "analytical"

    def __init__(self, db: Any | None = None):
        super().__init__()
        self.calibration = Calibration(db)

    def phase_time(self, phase: Phase, device_type: str) -> PhaseTime:
        phases.check(phase)
        compute = self.calibration.flops(device_type, phase.dtype)
        memory = self.calibration.memory_bw(device_type)
        t_compute = phases.flops(phase) / compute.value
        t_memory = phases.memory_bytes(phase) / memory.value
        floor = phases.kernel_launches(phase) * self.calibration.launch_s(device_type)
        bound, rate = (t_compute, compute) if t_compute >= t_memory else (t_memory, memory)
        note = "" if compute.source == memory.source else (
            f"{device_type}: compute rate {compute.source}, memory bandwidth {memory.source}")
        return PhaseTime(bound + floor, rate.source, note)

    def device_link(self, device_type: str) -> tuple[LinkSpec, str]:
        return self.calibration.link(device_type)

    def dp_step_extra(self, device_type: str) -> float:
        return self.calibration.dp_step_extra(device_type).value
