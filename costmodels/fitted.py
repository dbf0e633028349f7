"""The fitted cost model: learned phase times where the database has rows, the roofline elsewhere.

Loads the newest valid `fitted` entry per (task type, device type, dtype) from the profile
database. Entries are data from possibly untrusted sources, so loading is validation only: the
family must be one of ours (`families.FAMILIES`, looked up by name, never imported), the features
must be exactly ours, every number finite, trees well-formed and monotone, coefficients ≥ 0. An
entry that fails is skipped and reported in `rejected`; an older valid one is used instead.
For a phase with no usable entry the analytical model answers and the estimate says so.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any

from hetprof.costmodels import calloverhead, enginereload, pointcorrections
from hetprof.costmodels.analytical import AnalyticalCostModel
from hetprof.costmodels.base import CostModel
from hetprof.costmodels.data import LinkSpec, Phase, PhaseTime, Work
from hetprof.costmodels.entries import checked_parts
from hetprof.costmodels.families import Family
from hetprof.costmodels.features import FEATURES, PHASE_TASK, TASK_PHASE, phase_features
from hetprof.costmodels.fitting import FORMAT, MODEL_NAME
from hetprof.costmodels.runcalibration import FACTOR_RANGE
from hetprof.specs.catalog import Catalog, canonical_name
from hetprof.specs.models import ModelShape


@dataclasses.dataclass(frozen=True)
class LoadedModel:
    id: str
    task_type: str
    device_type: str
    dtype: str
    family: Family
    params: dict[str, Any]
    heldout_mape: float | None
    snapshot: str = ""
    run_factor: float = 1.0  # what real runs taught: their phase time over the profile-fitted one
    points: dict[tuple[float, ...], float] = dataclasses.field(default_factory=dict, repr=False, compare=False)
    call: calloverhead.CallOverhead | None = dataclasses.field(default=None, repr=False, compare=False)  # decode only
    engine_calls: dict[str, calloverhead.CallOverhead] = dataclasses.field(default_factory=dict, repr=False,
                                                                          compare=False)  # decode only
    engine_reloads: dict[str, enginereload.EngineReload] = dataclasses.field(default_factory=dict, repr=False,
                                                                            compare=False)  # decode only

    def predict(self, x: list[float]) -> float:
        # a shape the profiler measured is answered with its measurement (pointcorrections.py)
        return self.family.predict_one(self.params, x) * pointcorrections.ratio(self.points, x) * self.run_factor


def validate_entry(entry: dict[str, Any]) -> LoadedModel:
    """A LoadedModel from one database entry, or ValueError saying what is wrong with it."""
    params = entry.get("params")
    if not isinstance(params, dict):
        raise ValueError("params is not an object")
    if params.get("format") != FORMAT:
        raise ValueError(f"format {params.get('format')!r} is not {FORMAT}")
    task_type = params.get("task_type")
    if task_type not in TASK_PHASE or task_type != entry.get("task_type"):
        raise ValueError(f"task_type {str(task_type)[:40]!r} is not a task benchmark or disagrees with the row")
    device, dtype, family, model = checked_parts(params, FEATURES, row=entry)
    factor = params.get("run_factor", 1.0)
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not (
            FACTOR_RANGE[0] <= factor <= FACTOR_RANGE[1]):
        raise ValueError(f"run_factor must be a number in [{FACTOR_RANGE[0]}, {FACTOR_RANGE[1]}]")
    points = pointcorrections.load(params.get("points"), len(FEATURES))
    call = calloverhead.load(params.get("call_overhead"))
    engine_calls = calloverhead.load_by_engine(params.get("engine_call_overhead"))
    reloads = enginereload.load_by_engine(params.get("engine_reload"))
    if (call is not None or engine_calls or reloads) and task_type != "task.decode":
        raise ValueError("call_overhead and engine_reload belong to a task.decode entry")
    mape = (entry.get("metrics") or {}).get("heldout_mape")
    return LoadedModel(str(entry.get("id", "")), task_type, device, dtype, family, model,
                       float(mape) if isinstance(mape, (int, float)) else None, str(entry.get("snapshot") or ""),
                       float(factor), points, call, engine_calls, reloads)


class FittedCostModel(CostModel):
    """Learned per-phase times (profile-database entries); analytical fallback per device type."""

    name = "fitted"

    def __init__(self, db: Any | None = None, models: list[LoadedModel] | None = None, catalog: Catalog | None = None):
        super().__init__(catalog)
        self.analytical = AnalyticalCostModel(db, self.catalog)
        self.rejected: list[str] = []
        self.models: dict[tuple[str, str, str], LoadedModel] = {}
        for m in models if models is not None else self._load(db):
            self.models[(m.task_type, m.device_type, m.dtype)] = m
        # entries fitted before the database gained rows: still usable, but `hetprof fit` would learn more
        current = db.snapshot_hash() if db is not None and self.models else ""
        self.stale = sorted(m.id for m in self.models.values() if current and m.snapshot != current)

    def _load(self, db: Any | None) -> list[LoadedModel]:
        if db is None:
            return []
        index = db.cost_models()
        if not len(index):
            return []
        index = index[index["name"] == MODEL_NAME]
        loaded: dict[tuple[str, str, str], LoadedModel] = {}
        for model_id in index.sort_values("created")["id"]:  # newer entries replace older ones
            try:
                m = validate_entry(db.get_cost_model(model_id))
            except Exception as exc:  # noqa: BLE001 - any malformed entry is refused the same way
                self.rejected.append(f"cost model {str(model_id)[:12]}: {exc}")
                continue
            loaded[(m.task_type, m.device_type, m.dtype)] = m
        if self.rejected:
            warnings.warn(f"ignored {len(self.rejected)} invalid fitted cost-model entries: "
                          + "; ".join(self.rejected[:3]), stacklevel=3)
        return list(loaded.values())

    def lookup(self, phase_kind: str, device_type: str, dtype: str) -> LoadedModel | None:
        name = canonical_name(device_type)
        return self.models.get((PHASE_TASK[phase_kind], name or device_type, dtype))

    def phase_time(self, phase: Phase, device_type: str) -> PhaseTime:
        model = self.lookup(phase.kind, device_type, phase.dtype)
        if model is not None:
            seconds = model.predict(phase_features(phase, device_type))
            if math.isfinite(seconds) and seconds > 0:
                return PhaseTime(seconds, "fitted")
            reason = f"fitted {model.task_type} on {device_type} gave {seconds!r}"
        else:
            reason = f"no fitted {PHASE_TASK[phase.kind]} model for {device_type} ({phase.dtype})"
        fallback = self.analytical.phase_time(phase, device_type)
        return PhaseTime(fallback.seconds, fallback.source, f"{reason}: analytical ({fallback.source})")

    def generation_call_overhead(self, device_type: str, dtype: str, batch: int, prompt: int,
                                 engine: str = calloverhead.DEFAULT_ENGINE, model: ModelShape | None = None) -> float:
        fit = self.lookup("decode", device_type, dtype)
        if fit is None:
            return 0.0
        call = fit.engine_calls.get(engine, fit.call)
        if call is None:
            return 0.0
        return call.seconds(batch, prompt, calloverhead.model_key(model) if model is not None else ())

    def engine_reload_time(self, engine: str, device_type: str, dtype: str, weight_bytes: float) -> float:
        model = self.lookup("decode", device_type, dtype)
        reload = model.engine_reloads.get(engine) if model is not None else None
        return reload.seconds(weight_bytes) if reload is not None else 0.0

    def device_link(self, device_type: str) -> tuple[LinkSpec, str]:
        return self.analytical.device_link(device_type)

    def inputs(self, device_type: str) -> dict[str, str]:
        """Per task type "fitted" where a fitted model exists; otherwise the analytical inputs it falls back to."""
        out = {f"{task.removeprefix('task.')}": "fitted" for task in self.fitted_tasks(device_type)}
        return {**out, **self.analytical.inputs(device_type)}

    def fitted_tasks(self, device_type: str) -> list[str]:
        """The task types (task.prefill, task.decode, task.train) with a fitted model on this device type."""
        name = canonical_name(device_type) or device_type
        return sorted({task for task, device, _dtype in self.models if device == name})

    def optimizer_step_time(self, work, placement) -> float:
        """Where a fitted training model times the step (its profiled steps include Adam on the
        device), what a host-held share changes: the analytical step as run less the on-device one;
        the analytical step where the training phase falls back to the analytical model."""
        if self.lookup("train", placement.device_type, work.dtype) is not None:
            if not work.optimizer_offload:
                return 0.0
            return (self.analytical.optimizer_step_time(work, placement)
                    - self.analytical.optimizer_step_time(_on_device(work), placement))
        return self.analytical.optimizer_step_time(work, placement)

    def optimizer_step_in_phase_time(self, work, placement) -> float:
        """A fitted training phase holds the Adam step its profiled rows timed with each pass, on the
        device; the rows do not time it apart, so the roofline's on-device step stands for it."""
        if self.lookup("train", placement.device_type, work.dtype) is None:
            return 0.0
        return self.analytical.optimizer_step_time(_on_device(work), placement)

    def dp_step_extra(self, device_type: str) -> float:
        return self.analytical.dp_step_extra(device_type)


def _on_device(work: Work) -> Work:
    """`work` with its whole optimizer on the device, as the profiler's training rows step it."""
    return dataclasses.replace(work, optimizer_offload=0.0) if work.optimizer_offload else work
