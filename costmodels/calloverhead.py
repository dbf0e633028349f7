"""What a generation call costs beyond its prefill and decode steps, from the `task.generate` rows.

The cost model prices a generation call as its prefill plus one decode row per new token. A real call
(hetprof/runtime/generation.py) also pads the prompts, grows the attention mask every step, runs its first
steps after the prefill slower than steady ones, and runs one decode forward fewer than it samples
tokens. The profiler times whole calls of that very loop; the difference from the fitted phases,
measured per profiled (batch, prompt) shape, is this term; it can be negative (at batch 1 the
forward the call does not run outweighs the rest).

Like profiled-point corrections, a shape the profiler ran gets its own difference; any other shape
of a profiled model gets that model's median, and a model never profiled the median over all. A
difference is seconds, not a ratio, because it is per call: a long response does not make it larger.
Stored as plain numbers in the fitted decode entry.

Once real runs calibrate the phases (runcalibration.py), their decode and prefill steps are timed
inside calls, so they already hold most of what this term measured beside the profiler's phases; the
term is then learned again from the runs' own calls, beyond the run-calibrated phases
(`costmodels.runrows.run_call_rows`), rather than counted twice.

Rows carry the engine that made the call (`backend`; absent: `hf`, the executor's own loop). Each
engine's calls cost differently beyond the same phases (vLLM schedules, samples and batches in its
own code), so the `hf` rows give `call_overhead` and every other engine's rows its own entry of
`engine_call_overhead`; an engine without rows is priced with the `hf` term.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any

from hetprof.costmodels.features import SHAPE_FIELDS

BENCHMARK = "task.generate"
DEFAULT_ENGINE = "hf"  # the engine of a row without `backend`
MAX_ENGINES = 16
MAX_POINTS = 5_000   # a shared entry may not carry an unbounded table
MAX_SECONDS = 60.0   # a per-call difference beyond a minute is not a measurement of this


ModelKey = tuple[int, ...]  # a model's dimensions (MODEL_FIELDS); () in entries from before models were told apart
MODEL_FIELDS = SHAPE_FIELDS


def model_key(model: Any) -> ModelKey:
    """The dimensions that tell one model's calls from another's (a preset and its HF config agree)."""
    return tuple(int(getattr(model, f)) for f in MODEL_FIELDS)


@dataclasses.dataclass(frozen=True)
class CallOverhead:
    """Seconds a generation call takes beyond its phases: per measured (model, batch, prompt), per measured
    model elsewhere, and for a model no call was measured of.

    Per model because the difference is the model's own (a wider model pads, masks and samples more
    per step): the calls of a larger model profiled beside the job's must not price the job's."""

    default_s: float
    points: dict[tuple[ModelKey, int, int], float] = dataclasses.field(default_factory=dict)
    models: dict[ModelKey, float] = dataclasses.field(default_factory=dict)
    runs: int = 0  # calls in real runs it was learned from (beyond run-calibrated phases); 0: profiled calls

    def seconds(self, batch: int, prompt: int, model: ModelKey = ()) -> float:
        for key in ((model, int(batch), int(prompt)), ((), int(batch), int(prompt))):
            if key in self.points:
                return self.points[key]
        return self.models.get(model, self.default_s)

    def to_json(self) -> dict[str, Any]:
        return {"default_s": self.default_s,
                "points": [[b, p, s, *m] for (m, b, p), s in sorted(self.points.items())],
                "models": [[*m, s] for m, s in sorted(self.models.items())], "runs": self.runs}


def learn(calls: list[tuple[ModelKey, int, int, float, float]], runs: int = 0) -> CallOverhead | None:
    """From (model, batch, prompt, measured call seconds, fitted phases' seconds) per measured call shape.
    Profiled shapes (`runs` 0) each keep their own difference; calls in runs (`runs` of them, their
    shapes drawn by the run's prompts) give each model the median only."""
    diffs = {(tuple(k), int(b), int(p)): float(m - f) for k, b, p, m, f in calls
             if math.isfinite(m) and math.isfinite(f) and m > 0 and f > 0 and abs(m - f) <= MAX_SECONDS}
    if not diffs:
        return None
    models = {k: float(statistics.median(s for (m, _, _), s in diffs.items() if m == k)) for k in {k for k, _, _ in diffs}}
    return CallOverhead(float(statistics.median(diffs.values())), {} if runs else diffs, models, runs)


def load(raw: Any) -> CallOverhead | None:
    """Validate a stored `call_overhead` object (absent: None); ValueError says what is wrong."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValueError("call_overhead is not an object")
    default = raw.get("default_s")
    if not _seconds(default):
        raise ValueError(f"call_overhead.default_s must be a number of seconds within ±{MAX_SECONDS:g}")
    rows, model_rows, runs = raw.get("points", []), raw.get("models", []), raw.get("runs", 0)
    if not isinstance(rows, list) or len(rows) > MAX_POINTS:
        raise ValueError(f"call_overhead.points must be a list of at most {MAX_POINTS} [batch, prompt, seconds, "
                         "model dimensions...]")
    if not isinstance(model_rows, list) or len(model_rows) > MAX_POINTS:
        raise ValueError(f"call_overhead.models must be a list of at most {MAX_POINTS} [model dimensions..., seconds]")
    if isinstance(runs, bool) or not isinstance(runs, int) or not 0 <= runs <= 1e9:
        raise ValueError("call_overhead.runs must be a count of calls")
    points = {}
    for row in rows:
        if (not isinstance(row, list) or len(row) not in (3, 3 + len(MODEL_FIELDS))
                or not all(_count(v) for v in row[:2] + row[3:]) or not _seconds(row[2])):
            raise ValueError("call_overhead.points rows must be [batch ≥ 1, prompt ≥ 1, seconds, model dimensions ≥ 1]")
        points[(tuple(int(v) for v in row[3:]), int(row[0]), int(row[1]))] = float(row[2])
    models = {}
    for row in model_rows:
        if (not isinstance(row, list) or len(row) != len(MODEL_FIELDS) + 1 or not all(_count(v) for v in row[:-1])
                or not _seconds(row[-1])):
            raise ValueError("call_overhead.models rows must be [model dimensions ≥ 1, seconds]")
        models[tuple(int(v) for v in row[:-1])] = float(row[-1])
    return CallOverhead(float(default), points, models, runs)


def _seconds(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) and abs(v) <= MAX_SECONDS


def _count(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and float(v).is_integer() and 1 <= v <= 1e9


def load_by_engine(raw: Any) -> dict[str, CallOverhead]:
    """Validate a stored `engine_call_overhead` object ({engine: call_overhead}; absent: {})."""
    if raw is None:
        return {}
    if not isinstance(raw, dict) or len(raw) > MAX_ENGINES or not all(isinstance(k, str) and k for k in raw):
        raise ValueError(f"engine_call_overhead must map at most {MAX_ENGINES} engine names to call_overhead objects")
    out = {}
    for engine, entry in raw.items():
        try:
            call = load(entry)
        except ValueError as exc:
            raise ValueError(f"engine_call_overhead.{engine}: {exc}") from None
        if call is not None:
            out[engine] = call
    return out
