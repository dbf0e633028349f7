"""What a generation engine's weight reload costs after each sync, from `task.weight_reload` rows.

A sync moves the trainer's weights to the generator's ranks; an engine that keeps its own copy
(vLLM) must then take them in — write, reload in place, check — before it can generate again. That
is a cost of the sync beyond moving the bytes, paid once per sync whatever the batch, so it is a
term of its own (not a share of a generation call). The profiler's `vllmgen` suite times it per
model (`weight_bytes`); the fit keeps the median per size, per engine, and a sync is priced at its
model's bytes: interpolated between profiled sizes, the smallest size's time below them, and time
proportional to the bytes above the largest (the reload reads and repacks every byte). Stored as
plain numbers in the fitted decode entry of the device type.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any

import numpy as np
import pandas as pd

BENCHMARK = "task.weight_reload"
MAX_ENGINES = 16
MAX_POINTS = 256
MAX_SECONDS = 600.0  # a reload beyond ten minutes is not a measurement of this


@dataclasses.dataclass(frozen=True)
class EngineReload:
    """Seconds of one reload by weight bytes: (bytes, seconds) points sorted by bytes."""

    points: tuple[tuple[float, float], ...]

    def seconds(self, weight_bytes: float) -> float:
        sizes = [b for b, _ in self.points]
        times = [s for _, s in self.points]
        if weight_bytes > sizes[-1]:
            return times[-1] * weight_bytes / sizes[-1]
        return float(np.interp(weight_bytes, sizes, times))

    def to_json(self) -> dict[str, Any]:
        return {"points": [[b, s] for b, s in self.points]}


def learn(rows: list[tuple[float, float]]) -> EngineReload | None:
    """From (weight bytes, seconds) samples: the median per size."""
    by_size: dict[float, list[float]] = {}
    for size, seconds in rows:
        if _bytes(size) and _seconds(seconds):
            by_size.setdefault(float(size), []).append(float(seconds))
    if not by_size:
        return None
    return EngineReload(tuple((b, float(statistics.median(s))) for b, s in sorted(by_size.items())))


def learn_by_engine(rows: Any, device_type: str, dtype: str, threads: int | None) -> dict[str, EngineReload]:
    """Each engine's reload from the samples of one device type, dtype and thread count (a
    `ProfileDB.samples` frame given a canonical `device_type` column)."""
    if not len(rows) or not {"seconds", "weight_bytes", "device_type"} <= set(rows.columns):
        return {}
    rows = rows.assign(dtype=rows["dtype"].fillna("bf16") if "dtype" in rows else "bf16",
                       backend=rows["backend"].fillna("hf") if "backend" in rows else "hf")
    part = rows[(rows["device_type"] == device_type) & (rows["dtype"] == dtype)]
    if threads is not None and "threads" in part:
        part = part[part["threads"].fillna(threads).astype(int) == threads]
    out = {}
    for engine, group in part.groupby("backend", sort=True):
        learned = learn(list(zip(pd.to_numeric(group["weight_bytes"], errors="coerce"),
                                 pd.to_numeric(group["seconds"], errors="coerce"), strict=True)))
        if learned is not None:
            out[str(engine)] = learned
    return out


def load_by_engine(raw: Any) -> dict[str, EngineReload]:
    """Validate a stored `engine_reload` object ({engine: {"points": [[bytes, seconds], ...]}}; absent:
    {}); ValueError says what is wrong."""
    if raw is None:
        return {}
    if not isinstance(raw, dict) or len(raw) > MAX_ENGINES or not all(isinstance(k, str) and k for k in raw):
        raise ValueError(f"engine_reload must map at most {MAX_ENGINES} engine names to {{points: [...]}}")
    out = {}
    for engine, entry in raw.items():
        rows = entry.get("points") if isinstance(entry, dict) else None
        if (not isinstance(rows, list) or not 1 <= len(rows) <= MAX_POINTS
                or not all(isinstance(r, list) and len(r) == 2 and _bytes(r[0]) and _seconds(r[1]) for r in rows)):
            raise ValueError(f"engine_reload.{engine}.points must be 1 to {MAX_POINTS} [weight bytes ≥ 1, "
                             f"seconds in (0, {MAX_SECONDS:g}]]")
        out[engine] = EngineReload(tuple(sorted((float(b), float(s)) for b, s in rows)))
    return out


def _bytes(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) and 1 <= v <= 1e15


def _seconds(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) and 0 < v <= MAX_SECONDS
